"""Block-scaled FP8 (MXFP8): ``quantization_scales={"a": sa, "b": sb}`` with
``sa`` and ``sb`` arrays of UE8M0 block scales (contract 3b, issue 38 item 3).

The layout is the plain logical one, not cuBLAS's tiled one: a scale array
has the shape of its *stored* operand with the K axis counted in blocks of
32 (``ceil(K / 32)``, a last shorter block included). So a stored ``(M, K)``
takes ``(M, ceil(K/32))``, a stored ``(K, M)`` (``transpose_a=True``)
``(ceil(K/32), M)``; b alike with N. Element ``s`` (uint8) scales its 32
elements by ``2**(s - 127)``; 255 is E8M0's NaN. Batched operands take
scales of the same batch dimensions.

In one process the operands and their scales are global arrays. Under a
multi-process launch each rank passes its local blocks and the scales of its
local blocks, counted from the block's first K element: the scales are split
along with their operand. That is the global layout split where every rank's
K offset is a multiple of 32 (always where K is not split).

Where it runs: the front end checks the scales and holds them with FP8 a
and b (:func:`hold`) until the backend is known. The nvmath backend hands
them to cuBLASMp's own MXFP8 path (nvmath-python's
``MatmulOptions(block_scaling=True)``) where nvmath 1.0 takes it: compute
capability 10.0 (Blackwell) or higher, the TN layout, each rank's whole blocks
with local M, N and K multiples of 128; each rank converts its blocks' scales
to cuBLAS's tiled 1-D layout (:func:`to_tiled`). Everywhere else (JAX, which
has no block-scaled dot; nvmath where those rules fail) MXFP8 is emulated as
the product it equals: each 32-element block is dequantized
(``float32(x) * 2**(s - 127)``, exact while the value stays in float32's
range; :func:`release`, once at the front for JAX), the product runs in
float32 with float32 accumulation (``precision="highest"``), and the result is
rounded to ``result_type`` once. ``explain()`` says which ran, and why.

Light: numpy only; a family's array module is taken from its kind.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from ._spec import FP8_DTYPES, array_module, dtype_name, family, kind

#: elements per block along K (OCP MX: 32)
BLOCK = 32


def is_block(scale: Any) -> bool:
    """Whether a ``quantization_scales`` value is a block-scale array (any
    array of more than one dimension, or of a uint8 dtype) rather than a
    per-tensor scalar."""
    if not (hasattr(scale, "shape") and hasattr(scale, "dtype")) or isinstance(scale, np.generic):
        return False
    return len(scale.shape) >= 2 or dtype_name(scale.dtype) == "uint8"


def take(options: dict[str, Any]) -> tuple[Any, Any] | None:
    """The block scales ``(sa, sb)`` out of ``options`` (the call's keywords,
    changed in place: ``quantization_scales`` then None, ``block_scaled`` set
    by :func:`apply`), or None where the scales are per-tensor or absent. Both
    or neither: nvmath's ``block_scaling=True`` takes no per-tensor scale."""
    scales = options.get("quantization_scales")
    if not isinstance(scales, dict) or not any(is_block(v) for v in scales.values()):
        return None
    extra = [key for key in scales if key not in ("a", "b")]
    if extra:
        raise ValueError(f'quantization_scales takes the keys "a" and "b", got {extra!r}: block scaling (MXFP8) '
                         "has no scale of c or of the result")
    for name in ("a", "b"):
        if name not in scales or not is_block(scales[name]):
            given = "nothing" if name not in scales else f"{scales[name]!r}"
            raise ValueError(
                f"quantization_scales[{name!r}]: block scaling (MXFP8) takes block scales for both a and b, got "
                f"{given} for {name}: pass a uint8 array of {name}'s UE8M0 scales (all 127 for a scale of 1), or "
                "per-tensor scalars for both"
            )
    options["quantization_scales"] = None
    return scales["a"], scales["b"]


def scale_shape(shape: tuple[int, ...], k_axis: int) -> tuple[int, ...]:
    """The shape of the block scales of a stored operand of ``shape`` whose K is axis ``k_axis`` (-1 or -2)."""
    out = list(shape)
    out[k_axis] = -(-shape[k_axis] // BLOCK)
    return tuple(out)


def check(name: str, x: Any, s: Any, transposed: bool) -> int:
    """``s`` against its operand ``x`` (stored; ``transposed``: its
    ``transpose_`` flag); the axis of K in ``x``. Raises a TypeError or
    ValueError naming the operand, what was expected and what was given."""
    k_axis = (-2 if transposed else -1) if name == "a" else (-1 if transposed else -2)
    got = dtype_name(s.dtype)
    if got != "uint8":
        raise TypeError(f"quantization_scales[{name!r}] must be a uint8 array of UE8M0 block scales (2**(s-127) "
                        f"each), got dtype {got}: for float exponents e pass (e + 127).astype(np.uint8)")
    shape, want = tuple(int(d) for d in s.shape), scale_shape(tuple(int(d) for d in x.shape), k_axis)
    if shape != want:
        along = "rows" if k_axis == -1 else "columns"
        raise ValueError(
            f"quantization_scales[{name!r}] must have shape {want}, one scale per 32 elements of K along each of "
            f"{name}'s {along} ({name} stored {tuple(x.shape)}, transpose_{name}={transposed}), got {shape}"
        )
    if family(s) != family(x) and family(s) != "numpy":
        raise TypeError(f"quantization_scales[{name!r}] is a {family(s)} array but {name} is {family(x)}: pass "
                        f"them as one family (or the scales as numpy)")
    return k_axis


def dequantize(x: Any, s: Any, k_axis: int) -> Any:
    """``float32(x)`` with each 32-element block along ``k_axis`` times
    ``2**(s - 127)`` (NaN where ``s`` is 255), in ``x``'s array family."""
    xp = array_module(family(x))
    s = xp.asarray(s)
    scale = xp.exp2(xp.minimum(s, 254).astype(xp.float32) - 127)  # (2**128 is no float32: 255 is NaN anyway)
    scale = xp.where(s == 255, xp.float32(np.nan), scale)
    k = x.shape[k_axis]
    scale = xp.repeat(scale, BLOCK, axis=k_axis)
    index = [slice(None)] * len(x.shape)
    index[k_axis] = slice(0, k)
    return x.astype(xp.float32) * scale[tuple(index)]


def hold(ops: Any, scales: tuple[Any, Any], dtype: str, transpose_a: bool, transpose_b: bool) -> None:
    """Check the block scales against FP8 ``ops.a`` and ``ops.b`` (of ``dtype``)
    and keep them with the operands (``ops.block_scales``: ``(sa, sb, k axis
    of a, k axis of b)``); a and b stay FP8 until a backend takes them
    (:func:`release` dequantizes them for those that do not)."""
    if dtype not in FP8_DTYPES:
        raise ValueError(f"block quantization_scales (MXFP8) are for FP8 operands (float8_e4m3fn, float8_e5m2), "
                         f"but a and b are {dtype}: pass FP8 a and b, or scale a {dtype} product with alpha=")
    ka = check("a", ops.a, scales[0], transpose_a)
    kb = check("b", ops.b, scales[1], transpose_b)
    ops.block_scales = (scales[0], scales[1], ka, kb)


def release(ops: Any) -> None:
    """Put the dequantized float32 values of ``ops.a`` and ``ops.b`` in their
    place (the emulation: for a backend that does not take block scales)."""
    if ops.block_scales is None:
        return
    sa, sb, ka, kb = ops.block_scales
    held = kind(family(ops.a))
    # concrete operands are dequantized at once, also inside a trace (a jit's closed-over operands on a
    # user's mesh keep their placement, which the product reads); tracers are staged as ever
    with contextlib.nullcontext() if held is None else held.eager():
        ops.a, ops.b = dequantize(ops.a, sa, ka), dequantize(ops.b, sb, kb)
    ops.block_scales = None


def apply(ops: Any, scales: tuple[Any, Any], dtype: str, transpose_a: bool, transpose_b: bool) -> None:
    """:func:`hold`, then :func:`release`: ``ops.a`` and ``ops.b`` dequantized."""
    hold(ops, scales, dtype, transpose_a, transpose_b)
    release(ops)


# --------------------------------------------------------------------------- #
# cuBLAS's tiled layout of block scales
# --------------------------------------------------------------------------- #
#: a tile of the tiled layout: 128 rows (the operand's non-K dimension) by 4 blocks of K
TILE_ROWS, TILE_BLOCKS = 128, 4


def logical(s: Any, k_axis: int) -> Any:
    """A 2-D scale array as ``(rows, K / 32)``: rows the operand's other dimension."""
    return s if k_axis in (-1, 1) else s.T


def _tile_check(rows: int, blocks: int) -> None:
    if rows % TILE_ROWS or blocks % TILE_BLOCKS:
        raise ValueError(f"cuBLAS's tiled scale layout takes whole 128x4 tiles: (rows, K/32) must be multiples of "
                         f"(128, 4) (M, N and K multiples of 128), got ({rows}, {blocks})")


def to_tiled(s: Any) -> Any:
    """The 1-D tiled layout cuBLAS reads block scales in (``CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0``), from
    the logical ``(rows, K / 32)`` scales of one operand (rows: its M or N; see :func:`logical`).

    The layout (https://docs.nvidia.com/cuda/cublas/index.html#d-block-scaling-factors-layout, "1D Block
    Scaling Factors Layout"): the scales are cut into tiles of 128 rows by 4 blocks of K, 512 bytes each, the
    tiles of one band of 128 rows first along K (tile ``(r // 128, c // 4)`` at ``512 * ((r // 128) * (K/32)
    / 4 + c // 4)``); inside a tile the scale of row ``r`` and block ``c`` is at ``16 * (r % 32) + 4 * ((r %
    128) // 32) + c % 4`` (the four 32-row groups interleaved). Needs rows a multiple of 128 and K / 32 of 4.

    >>> s = np.arange(128 * 4, dtype=np.uint32).reshape(128, 4)
    >>> t = to_tiled(s)
    >>> int(t[16 * 1 + 4 * 1 + 2]) == int(s[33, 2])  # row 33: r % 32 = 1, (r % 128) // 32 = 1
    True
    >>> bool((from_tiled(t, 128, 4) == s).all())
    True
    """
    rows, blocks = (int(d) for d in s.shape)
    _tile_check(rows, blocks)
    xp = array_module(family(s))
    # (row band, row group of 32, row in group, K tile, block in tile) -> (band, K tile, row in group, group, block)
    t = xp.asarray(s).reshape(rows // 128, 4, 32, blocks // 4, 4).transpose(0, 3, 2, 1, 4)
    return xp.ascontiguousarray(t).reshape(-1)


def from_tiled(t: Any, rows: int, blocks: int) -> Any:
    """The logical ``(rows, blocks)`` scales of the 1-D tiled ``t`` (the inverse of :func:`to_tiled`)."""
    _tile_check(rows, blocks)
    if tuple(int(d) for d in t.shape) != (rows * blocks,):
        raise ValueError(f"tiled scales of ({rows}, {blocks}) hold {rows * blocks} values, got shape {t.shape}")
    xp = array_module(family(t))
    return xp.ascontiguousarray(xp.asarray(t).reshape(rows // 128, blocks // 4, 32, 4, 4)
                                .transpose(0, 3, 2, 1, 4).reshape(rows, blocks))


def explain_line(fmt: str, result: str, backend: str) -> str:
    """explain()'s line for a block-scaled product on ``backend`` (nvmath's plan adds which path it took)."""
    head = f"mxfp8:      {fmt} a and b with UE8M0 block scales (one per 32 along K), result {result}"
    if backend == "nvmath":
        return head + " (the nvmath plan's mxfp8 line says whether cuBLASMp's MXFP8 path runs it)"
    return (head + f": dequantized once at the front to float32 (exact), multiplied in float32 (precision "
            f"'highest'), result rounded to {result} once; JAX has no block-scaled dot")
