"""Bytes each device receives in a compiled XLA module, read off its HLO text
(the tests that count a kernel's traffic against the cost model's)."""

from __future__ import annotations

import re

import numpy as np


def received_per_rank(hlo: str, p: int) -> np.ndarray:
    """Bytes each of ``p`` devices receives in a compiled module's collective-permutes,
    all-gathers, all-to-alls (``(g - 1) / g`` of the output from the group's others)
    and reduce-scatters (``(g - 1)`` output blocks), a loop body's counted as
    often as the loop runs."""
    sizes = {"f32": 4, "c64": 8, "bf16": 2, "f16": 2, "f64": 8}
    bodies = {}
    for block in hlo.split("\n\n"):
        head = block.lstrip().split(" ", 2)
        bodies[(head[1] if head[0] == "ENTRY" else head[0]).lstrip("%")] = block.strip("\n").splitlines()

    def groups_of(line):
        mesh = re.search(r"replica_groups=mesh\[([^\]]*)\](?:, device_ids=\(\[([\d,]+)\]T\(([\d,]+)\)\))? \{([^}]*)\}",
                         line)
        if mesh:  # mesh['x'=2,'y'=4] {'y'}: the devices varying along the named axes, the others fixed
            names = re.findall(r"'(\w+)'=(\d+)", mesh[1])
            ids = np.arange(p)
            if mesh[2]:  # device_ids=([4,2]T(1,0)): the mesh's positions hold an iota's transpose
                ids = ids.reshape([int(x) for x in mesh[2].split(",")]).transpose([int(x) for x in mesh[3].split(",")])
            ids = ids.reshape([int(n) for _, n in names])
            inside = [i for i, (name, _) in enumerate(names) if f"'{name}'" in mesh[4]]
            outside = [i for i in range(len(names)) if i not in inside]
            size = int(np.prod([int(names[i][1]) for i in inside]))
            return ids.transpose(outside + inside).reshape(-1, size).tolist()
        groups = re.search(r"replica_groups=(\{\{[\d,{}]*\}\}|\[\d+,\d+\]<=\[[\d,]+\]\S*)", line)[1]
        if groups.startswith("["):  # iota: [groups, size]<=[dims]T(perm)
            n, _, dims, perm = re.match(r"\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", groups).groups()
            ids = np.arange(p).reshape([int(x) for x in dims.split(",")])
            return (ids.transpose([int(x) for x in perm.split(",")]) if perm else ids).reshape(int(n), -1).tolist()
        return [[int(x) for x in g.split(",")] for g in re.findall(r"\{([\d,]+)\}", groups)]

    def visit(name):
        got = np.zeros(p)
        for line in bodies.get(name, ()):
            out = re.search(r"= (\w+)\[([\d,]*)\]", line)
            nbytes = out and sizes.get(out[1], 0) * int(np.prod([int(x) for x in out[2].split(",") if x]))
            if " collective-permute(" in line:
                for src, dst in re.findall(r"\{(\d+),(\d+)\}", line.split("source_target_pairs=")[1]):
                    got[int(dst)] += nbytes * (src != dst)
            elif " all-gather(" in line or " all-to-all(" in line:
                for g in groups_of(line):
                    got[g] += nbytes * (len(g) - 1) / len(g)
            elif " reduce-scatter(" in line:
                for g in groups_of(line):
                    got[g] += nbytes * (len(g) - 1)
            elif " while(" in line:
                trips = int(re.search(r'"known_trip_count":\{"n":"(\d+)"', line)[1])
                got += trips * visit(re.search(r"body=%?([\w.\-]+)", line)[1])
        return got

    return visit(next(name for name, lines in bodies.items() if lines and lines[0].startswith("ENTRY")))


def laid_out_bytes(hlo: str) -> float:
    """Bytes the module's entry computation writes outside its GEMMs and
    collectives: its fusions that hold no dot, and its copies, transposes and
    concatenations (each materializes its output once), arrays only."""
    sizes = {"f32": 4, "c64": 8, "bf16": 2, "f16": 2, "f64": 8}
    bodies = {}
    for block in hlo.split("\n\n"):
        head = block.lstrip().split(" ", 2)
        bodies[(head[1] if head[0] == "ENTRY" else head[0]).lstrip("%")] = (head[0] == "ENTRY", block)
    dots = {name for name, (_, text) in bodies.items() if " dot(" in text}
    total = 0.0
    for entry, text in bodies.values():
        if not entry:
            continue
        for line in text.splitlines():
            op = re.search(r"= (\w+)\[([\d,]+)\]\{[\d,]*\} (fusion|copy|transpose|concatenate)\(", line)
            if not op or "," not in op[2]:
                continue
            called = re.search(r"calls=%?([\w.\-]+)", line)
            if op[3] == "fusion" and called and called[1] in dots:
                continue
            total += sizes[op[1]] * int(np.prod([int(x) for x in op[2].split(",")]))
    return total


def transposed_dot_bytes(hlo: str) -> float:
    """Bytes of the outputs of the module's 2-D dots that contract their
    lhs's leading axis and their rhs's trailing one (``x^T y^T``), which
    XLA's CPU dot runs as the plain GEMM plus a transposing copy of its
    output (:meth:`dmatmul.algorithms.reduce_scatter.ReduceScatter.copied`)."""
    sizes = {"f32": 4, "c64": 8, "bf16": 2, "f16": 2, "f64": 8}
    total = 0.0
    for op in re.finditer(r"= (\w+)\[(\d+),(\d+)\]\{[\d,]*\} dot\([^)]*\), lhs_contracting_dims=\{0\}, "
                          r"rhs_contracting_dims=\{1\}", hlo):
        total += sizes[op[1]] * int(op[2]) * int(op[3])
    return total
