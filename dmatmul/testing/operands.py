"""The operands of a case: random global matrices, laid out in memory as a case says.

:func:`rand` makes the operands of the lines :meth:`dmatmul.testing.Case.describe`
writes (``from dmatmul.testing import rand``). Needs numpy only.
"""

from __future__ import annotations

import math
from typing import Any, cast

import numpy as np

from .case import LAYOUTS, MX_SCALES, Case
from .reference import add_specials, random_matrix

__all__ = ["rand", "rand_scales", "lay_out"]


def rand(shape: tuple[int, ...], dtype: str = "float32", family: str = "numpy", *, fill: float | None = None,
         specials: bool = False, layout: str = "C", seed: int = 0) -> Any:
    """A random operand of ``shape`` (or one full of ``fill``; with
    ``specials``, a few entries inf or NaN), numpy laid out in memory as
    ``layout`` says (:func:`lay_out`), as the lines of :meth:`Case.describe`
    use it: ``from dmatmul.testing import rand``."""
    rng = np.random.default_rng(seed)
    x = random_matrix(rng, shape, dtype)
    if fill is not None:
        x[...] = fill
    if specials:
        add_specials(rng, x)
    if family == "jax":
        import jax
        import jax.numpy as jnp

        with jax.enable_x64(dtype in ("float64", "complex128")):
            return jnp.asarray(x)
    return lay_out(x, layout)


def random_scales(rng: np.random.Generator, shape: tuple[int, ...],
                  within: tuple[int, int] = MX_SCALES) -> np.ndarray:
    """Random UE8M0 block scales of ``shape``: uint8 ``within`` (both ends; default :data:`MX_SCALES`,
    ``2**-7 .. 2**7``)."""
    return rng.integers(within[0], within[1] + 1, shape).astype(np.uint8)


def rand_scales(shape: tuple[int, ...], family: str = "numpy", *, within: tuple[int, int] = MX_SCALES,
                seed: int = 0) -> Any:
    """Random MXFP8 block scales of ``shape`` (:func:`random_scales`), as the lines of
    :meth:`Case.describe` use them: ``from dmatmul.testing import rand_scales``."""
    s = random_scales(np.random.default_rng(seed), shape, within)
    if family == "jax":
        import jax.numpy as jnp

        return jnp.asarray(s)
    return s


def lay_out(x: np.ndarray, layout: str) -> np.ndarray:
    """``x``'s values in a numpy array laid out in memory as ``layout`` (one of
    :data:`LAYOUTS`) says: C order, a strided view (every other element of a
    larger array), negative strides, read-only, byte-swapped, Fortran order
    or the ``.T`` view of a C array (both column-major: for matrices)."""
    every = (slice(None, None, -1),) * x.ndim
    if layout == "C":
        return x
    if layout == "strided":
        big = np.zeros(tuple(2 * s + 1 for s in x.shape), x.dtype)
        view = big[(slice(1, None, 2),) * x.ndim]
        view[...] = x
        return view
    if layout == "negative strides":
        return x[every].copy()[every]
    if layout == "read-only":
        y = x.copy()
        y.flags.writeable = False
        return y
    if layout == "byte-swapped":
        return x.astype(x.dtype.newbyteorder("S"))
    if layout == "F":
        return np.asfortranarray(x)
    if layout == ".T view":
        return np.ascontiguousarray(x.T).T
    raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")



def _snapshot(x: Any) -> bytes | None:
    return None if x is None else np.asarray(x).tobytes()


def _global_operands(rng: np.random.Generator, case: Case, beta: complex) -> dict[str, np.ndarray | None]:
    """The global numpy a, b, c (full of NaN where ``beta`` = 0: it must not be
    read) and bias (in its own dtype and shape) of one product of ``case``."""
    ops: dict[str, np.ndarray | None] = {
        "a": random_matrix(rng, case.a_shape, case.dtype), "b": random_matrix(rng, case.b_shape, case.dtype),
        "c": None, "bias": None,
    }
    if case.use_c:
        ops["c"] = c = random_matrix(rng, case.result_shape, case.result_dtype)
        if beta == 0:
            c[...] = np.nan  # must not be read
    if case.has_bias:
        ops["bias"] = random_matrix(rng, (math.prod(case.bias_shape),), case.bias_dtype or case.dtype) \
            .reshape(case.bias_shape)
    if case.specials:
        for name in ("a", "b") if ops["c"] is None or beta == 0 else ("a", "b", "c"):
            add_specials(rng, cast(np.ndarray, ops[name]))
    return ops
