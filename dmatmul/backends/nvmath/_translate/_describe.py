"""The translation in words: the ``explain()`` lines of an nvmath plan --
engine, cuBLASMp path, distributions and the roles they are handed in, the
frame, every handover (view or copy, and why), qualifiers, padding, what the
epilogue fuses and what dmatmul applies after, the allgather of a replicated
result, and the modelled traffic against the lower bound.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .... import _cost, _plan
from ...._distribution import Replicated

if TYPE_CHECKING:
    from ._types import Translation

__all__ = ["describe"]


def describe(t: Translation) -> list[str]:
    """explain() lines (without the header the front end writes).

    >>> from dmatmul import Replicated, Slab
    >>> from dmatmul.backends.nvmath._translate import Problem, translate
    >>> t = translate(Problem(16, 8, 12, 4, False, False, (Replicated(), Slab.Y, Slab.X), ("C", "C", None)))
    >>> print("\\n".join(describe(t)[:2]))
    engine:     cuBLASMp via nvmath.distributed.linalg.advanced.Matmul on 4 rank(s), one GPU each
    path:       AllGather+GEMM (cuBLASMp fast path: 1-D, non-cyclic, uniform, first_process (0, 0))
    """
    p = t.problem
    names = {"M": "M", "K": "K", "N": "N", "R": "nothing (replicated)", None: "a 2-D grid"}
    lines = []
    if t.engine == "cublaslt":
        lines.append(
            f"engine:     cuBLASLt via nvmath.linalg.advanced on each of {p.nranks} ranks (no communication)"
        )
    else:
        lines.append(
            f"engine:     cuBLASMp via nvmath.distributed.linalg.advanced.Matmul on {p.nranks} rank(s), one GPU each"
        )
    what = {
        "AG+GEMM": "AllGather+GEMM (cuBLASMp fast path: 1-D, non-cyclic, uniform, first_process (0, 0))",
        "GEMM+RS": "GEMM+ReduceScatter (cuBLASMp fast path: 1-D, non-cyclic, uniform, first_process (0, 0))",
        "GEMM+AR": "GEMM+AllReduce (cuBLASMp fast path through epilog=ALLREDUCE, TN layout)",
        "SUMMA": "SUMMA (a, b and the result on one shared 2-D block-cyclic grid)",
        "local GEMM": "local GEMM (no communication)",
        "general": f"cuBLASMp general path (no fast path fits; closest contract algorithm: {t.algorithm})",
    }[t.path]
    lines.append(f"path:       {what}")
    lines.append("distributions (chosen by the planner: none given):" if p.chosen else "distributions:")
    for name, role, dist in zip(("a", "b", "result"), t.roles, p.distributions):
        lines.append(f"  {name:7s} {dist!r:16s} splits {names[role]}")
    if t.kernel is not None and t.kernel != t.roles:
        ka, kb, kd = t.kernel
        lines.append(f"handed as:  roles a:{ka} b:{kb} result:{kd} (Replicated operands are cut locally, no communication)")
    frame = "D.T = op(B).T @ op(A).T (nvmath A is b, B is a; result D.T in Fortran order = D in C order)" if t.swapped \
        else "D = op(A) @ op(B) (result in Fortran order)"
    lines.append(f"frame:      {frame}")
    for h in t.handovers:
        lines.append(f"  {h.describe()}")
    if t.result is not None:
        lines.append(f"  result: {t.result.describe()} over {t.result_shape}")
    q = t.qualifiers
    lines.append(f"qualifiers: is_transpose A={q[0]}, B={q[1]}, C={q[2]}")
    for d in t.dims:
        if d.padding:
            lines.append(f"padding:    {d.describe()}")
    if t.passes_c:
        lines.append("c:          passed with MatmulOptions(inplace=False): the user's c is never written")
    if t.fused_epilog:
        lines.append(f"epilog:     fused into cuBLASMp: MatmulEpilog.{t.fused_epilog}")
    if t.post_beta_c or t.post_epilog:
        post = ", ".join(x for x in ("beta * c" if t.post_beta_c else "", t.post_epilog or "") if x)
        lines.append(f"epilogue:   applied by dmatmul on the local result block: {post}")
    if t.gather:
        lines.append(
            f"result:     computed as {t.computed!r}, then allgathered by dmatmul over MPI (host-staged)"
        )
    for note in t.notes:
        lines.append(f"note:       {note}")
    if t.cost is not None:
        lb = _cost.lower_bound_words(p.m, p.n, p.k, p.nranks) * p.itemsize
        replicated = [op for op, d in zip("ab", p.distributions) if d == Replicated()]
        ratio = _plan.versus_bound(t.cost.nbytes, lb, replicated)
        lines.append(
            f"modelled:   {_plan._fmt_bytes(t.cost.nbytes)} received per rank in {t.cost.describe_messages()}, "
            f"{t.cost.flops / 1e9:.3g} GFLOP per rank ({ratio}: "
            f"lower bound {_plan._fmt_bytes(lb)} per rank)"
        )
    lines.append("log:        CUBLASMP_LOG_LEVEL=5 makes cuBLASMp log the path it runs")
    return lines
