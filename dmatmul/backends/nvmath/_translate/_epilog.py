"""The epilogue and the assembled call: what cuBLASMp (or cuBLASLt) fuses
into its epilog and what dmatmul applies after nvmath's call
(:func:`refused_epilog`, :func:`epilogs`), the frame a path picks among those
it allows (:func:`pick`: fewer copies, then a fusable bias, then a C-order
result), nvmath's options, and the :class:`~._types.Translation` built from
the chosen frame (:func:`finish`).

What nvmath can fuse is :data:`dmatmul._epilogue.TABLE`'s ``nvmath`` name
(None: cuBLASLt has no such epilog, SiLU, and dmatmul applies the whole
epilogue to the local result block). nvmath's bias is one value per row of
its result: a bias per row of D fuses in the frame ``D = op(A) op(B)``, a bias
per column of D (shape (1, N)) in the swapped frame, whose result is D.T; in
the other frame the bias, and the activation after it, are dmatmul's.
"""

from __future__ import annotations

import dataclasses

from typing import Any

from .... import _plan
from ...._distribution import Distribution
from ...._epilogue import TABLE, activation, has_bias
from .._precision import compute_type
from ._orient import Frame
from ._types import DimPlan, NvDistribution, Path, Problem, Role, Translation

__all__ = ["refused_epilog", "epilogs", "pick", "finish", "options", "FP8Refused", "upcast"]

def refused_epilog(p: Problem) -> str | None:
    """Why cuBLASMp/cuBLASLt cannot be given ``p``'s epilog fused (None: it can).

    Known from the hardware runs (issue 13), so planned around, never tried:
    a bias epilog on complex types is refused by cuBLASMp with NOT_SUPPORTED
    at *execute* (too late for a plan-time fallback), and cuBLASLt's fused
    GELU is not float64-accurate.

    >>> from dmatmul import Replicated
    >>> def p(dtype, epilog):
    ...     return Problem.of(4, 4, 4, 1, False, False, (Replicated(),) * 3, ("C", "C", None), dtype=dtype, epilog=epilog)
    >>> refused_epilog(p("complex64", "relu_bias"))
    'cuBLASMp refuses a bias epilog on complex64 (NOT_SUPPORTED at execute)'
    >>> refused_epilog(p("float64", "gelu"))
    "cuBLASLt's fused GELU is not float64-accurate"
    >>> refused_epilog(p("float32", "gelu_bias")) is None
    True
    """
    ep = p.epilog
    if ep is None:
        return None
    if p.dtype.startswith("complex") and has_bias(ep):
        return f"cuBLASMp refuses a bias epilog on {p.dtype} (NOT_SUPPORTED at execute)"
    if p.dtype == "float64" and activation(ep) == "gelu":
        return "cuBLASLt's fused GELU is not float64-accurate"
    return None


def epilogs(p: Problem, path: Path, swapped: bool, engine: str) -> tuple[str | None, str | None, bool]:
    """(fused cuBLASMp epilog, epilog dmatmul applies after, beta*c after)."""
    ep = p.epilog
    if path == "GEMM+AR":
        return "ALLREDUCE", ep, p.use_c  # the epilog slot holds ALLREDUCE; C would be summed P times
    if ep is None:
        return None, None, False
    if refused_epilog(p) is not None:
        return None, ep, False  # known refused (or wrong) when fused: dmatmul's epilogue from the start
    fused = TABLE[str(ep)].nvmath
    if fused is None:
        return None, ep, False  # no such epilog in cuBLASLt: nvmath computes the product alone
    if engine == "cublaslt":
        if has_bias(ep) and p.bias_columns:
            return None, ep, False  # cuBLASLt's result is D itself: a bias per column of D is none of its epilogs
        return fused, None, False
    if path in ("AG+GEMM", "GEMM+RS", "local GEMM"):
        if has_bias(ep) and swapped != p.bias_columns:
            return None, ep, False  # nvmath's bias is per row of its result (D, or D.T when swapped)
        return fused, None, False
    # general and SUMMA paths: dmatmul's epilogue (nvmath 0.7 and 0.8 refused a fused RELU on cuBLASMp's
    # naive path; 0.9 and 1.0 no longer check)
    return None, ep, False


def tn(f: Frame) -> bool:
    """Whether frame ``f`` hands nvmath the TN layout (A transposed, B not), the one cuBLASMp's FP8 runs."""
    by_slot = {h.slot: h.is_transpose for h in f.handovers}
    return by_slot.get("A") is True and by_slot.get("B") is False


def pick(frames: list[Frame], p: Problem, path: Path, engine: str) -> Frame:
    """The frame with fewer copies, then a fusable bias, then a C-order result; MXFP8 that cuBLASMp could
    take (``p.mxfp8``): a TN frame first (its block-scaled GEMM runs TN only)."""
    def key(f: Frame) -> tuple[int, float, int, int]:
        fused, post, _ = epilogs(p, path, f.swapped, engine)
        return (0 if not p.mxfp8 or tn(f) else 1, f.weight, 0 if post is None or p.epilog is None else 1,
                0 if f.swapped else 1)

    return min(frames, key=key)


def finish(
    p: Problem,
    *,
    algorithm: str,
    path: Path,
    engine: str,
    frame: Frame,
    roles: tuple[Role | None, Role | None, Role | None],
    kernel: tuple[Role, Role, Role] | None,
    dims: dict[str, DimPlan],
    result: NvDistribution | None,
    result_shape: tuple[int, int],
    computed: Distribution,
    gather: bool,
    notes: tuple[str, ...],
    cost: _plan.Plan | None,
) -> Translation:
    fused, post, post_c = epilogs(p, path, frame.swapped, engine)
    notes = notes + _epilog_notes(p, path, frame.swapped, fused, post)
    by_slot = {h.slot: h for h in frame.handovers}
    qualifiers = (by_slot["A"].is_transpose, by_slot["B"].is_transpose, False)
    if p.spec.fp8:
        notes = notes + _fp8_rules(p, qualifiers)
    return Translation(
        problem=p,
        algorithm=algorithm,
        path=path,
        engine=engine,  # type: ignore[arg-type]
        swapped=frame.swapped,
        roles=roles,
        kernel=kernel,
        dims=(dims["M"], dims["K"], dims["N"]),
        handovers=frame.handovers,
        result=result,
        result_shape=result_shape,
        computed=computed,
        qualifiers=qualifiers,
        fused_epilog=fused,
        post_epilog=post,
        post_beta_c=post_c,
        gather=gather,
        options=options(p),
        notes=notes,
        cost=cost,
    )


def _epilog_notes(p: Problem, path: Path, swapped: bool, fused: str | None, post: str | None) -> tuple[str, ...]:
    """explain()'s word on where the epilogue runs, where it is not the plain fused one."""
    ep = p.epilog
    if ep is None or path == "GEMM+AR":
        return ()
    columns = "the bias holds one value per result column (shape (1, N))"
    if fused is not None:
        return (f"{columns}: fused as nvmath's bias per row of its result D.T (swapped frame)",) \
            if has_bias(ep) and p.bias_columns else ()
    if post is None:
        return ()
    why = refused_epilog(p)
    if why is None and TABLE[str(ep)].nvmath is None:
        why = f"cuBLASLt has no {activation(ep)} epilog"
    if why is None and has_bias(ep) and path in ("AG+GEMM", "GEMM+RS", "local GEMM"):
        if p.bias_columns:
            why = f"{columns}, nvmath's bias one per row of its result D"
        else:
            why = "the bias holds one value per result row, nvmath's bias one per row of its result D.T (swapped frame)"
    if why is None:
        return ()
    then = " (bias, then activation)" if has_bias(ep) and activation(ep) is not None else ""
    return (f"epilog {p.epilog!r} not fused: {why}; dmatmul applies it{then} to the local result block after "
            "nvmath's call",)


class FP8Refused(ValueError):
    """cuBLASMp's FP8 path cannot take this product (:func:`upcast` runs it in float32 instead)."""


def upcast(p: Problem) -> Problem:
    """An FP8 product as the float32 one it equals: every FP8 value is a float32
    exactly, so ``alpha*sa*sb * (A @ B)`` of the upcast operands, accumulated in
    float32 as cuBLASMp's FP8 path accumulates, and rounded to the result type
    once, is the FP8 product."""
    spec = p.spec
    options = dataclasses.replace(spec.options, alpha=spec.scaled_alpha, quantization_scales=None, result_type=None)
    return dataclasses.replace(p, spec=dataclasses.replace(spec, dtype="float32", options=options))


def _fp8_rules(p: Problem, qualifiers: tuple[bool, bool, bool]) -> tuple[str, ...]:
    """cuBLASMp's FP8 path (nvmath 1.0): the "TN" input layout only (nvmath's A transposed, B not), M, N and
    K multiples of 16, not e5m2 x e5m2; a ValueError naming the fix where the call cannot take it (dmatmul
    does not yet upcast or re-lay FP8 operands for it), else explain()'s line."""
    layout = "".join("T" if q else "N" for q in qualifiers[:2])
    why = []
    if layout != "TN":
        why.append(f"its input layout is TN only (nvmath's A transposed, B not), this frame gives {layout}: with "
                   "C-order blocks that is transpose_a=False, transpose_b=True (a stored (M, K), b stored (N, K))")
    if any(x % 16 for x in (p.m, p.n, p.k)):
        why.append(f"M, N and K must be multiples of 16, got M={p.m} N={p.n} K={p.k}")
    if p.dtype == "float8_e5m2":
        why.append("cuBLASLt has no float8_e5m2 x float8_e5m2 GEMM")
    if why:
        raise FP8Refused("; ".join(why))
    return (f"fp8: cuBLASMp's FP8 path (TN layout), quantization_scales passed to nvmath as given, "
            f"COMPUTE_32F, result_type {p.spec.result_dtype}",)


def options(p: Problem) -> tuple[tuple[str, Any], ...]:
    """nvmath's MatmulOptions: never in place (c is the user's); the compute type ``precision`` asks for;
    FP8: the result type always (without it nvmath would write an FP8 D) and float32 accumulation."""
    ct = compute_type(p.dtype, p.precision)  # type: ignore[arg-type]  # (Options holds a PrecisionName)
    if p.spec.fp8:
        return (("inplace", False), ("compute_type", "COMPUTE_32F"), ("result_type", p.spec.result_dtype))
    return (("inplace", False),) + ((("compute_type", ct),) if ct is not None else ())
