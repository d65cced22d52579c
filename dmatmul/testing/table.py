"""The report of a check: a table by layout family and the first failures."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import cast

from .._mxfp8 import BLOCK
from .._spec import FP8_DTYPES
from .case import LAYOUT_FAMILIES, TRANSFORMS, Transform
from .run import _ORDER, Outcome

__all__ = ["report"]


def _worst(ratios: list[float]) -> str:
    if not ratios:
        return "-"
    return f"{max(ratios):.2f}"


def report(outcomes: Sequence[Outcome], *, failures: int = 5) -> str:
    """A table by layout family (cases, passed, refused, failed, worst error
    relative to the tolerance), a line for the cases inside a JAX
    transformation (by kind and status), and the first ``failures`` failures."""
    head = f"{'layout family':18s} {'cases':>6s} {'passed':>7s} {'refused':>8s} {'failed':>7s} {'worst err/tol':>14s}"
    lines = [head, "-" * len(head)]
    rows = [f for f in LAYOUT_FAMILIES if any(o.layout_family == f for o in outcomes)]
    for fam in rows + ["total"]:
        mine = [o for o in outcomes if fam == "total" or o.layout_family == fam]
        count = {s: sum(o.status == s for o in mine) for s in _ORDER}
        ratios = [o.ratio for o in mine if o.status != "refused" and not math.isnan(o.ratio)]
        if fam == "total":
            lines.append("-" * len(head))
        lines.append(f"{fam:18s} {len(mine):6d} {count['passed']:7d} {count['refused']:8d} {count['failed']:7d} "
                     f"{_worst(ratios):>14s}")
    transformed = [o for o in outcomes if o.case.transform is not None]
    if transformed:
        kinds = ", ".join(f"{k} {sum(cast(Transform, o.case.transform).kind == k for o in transformed)}"
                          for k in TRANSFORMS)
        count = {s: sum(o.status == s for o in transformed) for s in _ORDER}
        lines.append(f"of which inside a JAX transformation: {len(transformed)} ({kinds}): {count['passed']} "
                     f"passed, {count['refused']} refused, {count['failed']} failed")
    lines += _families_lines(outcomes)
    failed = [o for o in outcomes if o.status == "failed"]
    if failed:
        lines.append("")
        lines.append(f"first {min(failures, len(failed))} of {len(failed)} failure(s):")
        for o in failed[:failures]:
            lines.append(f"  [{o.label or o.layout_family}] {o.message}")
            lines.append(f"    {o.describe()}")
    return "\n".join(lines)


def _counted(outcomes: Sequence[Outcome]) -> str:
    count = {s: sum(o.status == s for o in outcomes) for s in _ORDER}
    return f"{count['passed']} passed, {count['refused']} refused, {count['failed']} failed"


def _families_lines(outcomes: Sequence[Outcome]) -> list[str]:
    """A line for the batched cases (by number of batch dimensions; broadcast; an empty batch) and one
    for those with Sharded distributions (by mesh axes; with no 2-D form)."""
    lines = []
    batched = [o for o in outcomes if o.case.a_batch or o.case.b_batch]
    if batched:
        dims = ", ".join(f"{n} dim{'s' * (n > 1)} {sum(len(o.case.batch_shape) == n for o in batched)}"
                         for n in (1, 2))
        broadcast = sum(o.case.a_batch != o.case.batch_shape or o.case.b_batch != o.case.batch_shape
                        for o in batched)
        empty = sum(0 in o.case.batch_shape for o in batched)
        lines.append(f"of which batched: {len(batched)} ({dims}; broadcast {broadcast}, an empty batch {empty}): "
                     + _counted(batched))
    fp8 = [o for o in outcomes if o.case.dtype in FP8_DTYPES]
    if fp8:
        mx = [o for o in fp8 if o.case.block_scales is not None]
        tensor = sum(o.case.block_scales is None and o.case.scales is not None for o in fp8)
        lines.append(f"of which FP8: {len(fp8)} (per-tensor scales {tensor}, none {len(fp8) - tensor - len(mx)}, "
                     f"MXFP8 block scales {len(mx)}): " + _counted(fp8))
        if mx:
            ragged = sum(o.case.k % BLOCK != 0 for o in mx)
            lines.append(f"of which MXFP8 (UE8M0 scales per 32 along K): {len(mx)} (K not a multiple of 32 "
                         f"{ragged}): " + _counted(mx))
    sharded = [o for o in outcomes if o.case.shardeds]
    if sharded:
        def axes(o: Outcome) -> int:
            return max(len(d.mesh.shape) for d in o.case.shardeds)

        by = ", ".join(f"{n} ax{'es' if n > 1 else 'is'} {sum(axes(o) == n for o in sharded)}" for n in (1, 2, 3))
        nd = sum(o.case.nd_sharded for o in sharded)
        lines.append(f"of which Sharded on a ProcessMesh: {len(sharded)} ({by}; {nd} with no 2-D form): "
                     + _counted(sharded))
    return lines
