"""The float64 numpy reference every distributed result is checked against.

:func:`reference` is the product, :func:`reference_vjp` and
:func:`reference_jvp` its derivatives as ``jax.vjp`` and ``jax.jvp`` define
them, all in float64/complex128; :func:`error_ratio` and
:func:`assert_close` compare a result with it under the tolerance of a dtype
(:data:`TOLERANCE`). Used by ``dmatmul check`` and by the tests; a user's
own tests may use it too::

    import numpy as np
    import dmatmul as dm
    from dmatmul.testing import assert_close, reference

    a, b = np.ones((4, 3), np.float32), np.ones((3, 5), np.float32)
    assert_close(dm.matmul(a, b), reference(a, b), "float32")

numpy only; ``ml_dtypes`` is imported for bfloat16.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._epilogue import TABLE

__all__ = [
    "TOLERANCE", "wide", "gelu_tanh", "gelu_tanh_grad", "silu", "silu_grad",
    "reference", "reference_vjp", "reference_jvp", "error_ratio",
    "finite_scale", "assert_close", "random_matrix", "add_specials",
]

#: max |d - ref| allowed, relative to max(1, max |ref|) (accumulation in >= f32)
TOLERANCE = {
    "float16": 2e-3,
    "bfloat16": 1.6e-2,
    "float32": 2e-5,
    "complex64": 2e-5,
    "float64": 1e-12,
    "complex128": 1e-12,
}


def wide(x: Any) -> np.ndarray:
    x = np.asarray(x)
    return x.astype(np.complex128 if x.dtype.kind == "c" else np.float64)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def gelu_tanh_grad(x: np.ndarray) -> np.ndarray:
    """The derivative of :func:`gelu_tanh`.

    >>> x = np.array([-2.0, -0.3, 0.0, 0.7, 3.0]); h = 1e-6
    >>> bool(np.allclose(gelu_tanh_grad(x), (gelu_tanh(x + h) - gelu_tanh(x - h)) / (2 * h), atol=1e-8))
    True
    """
    s = math.sqrt(2 / math.pi)
    t = np.tanh(s * (x + 0.044715 * x**3))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * s * (1 + 3 * 0.044715 * x * x)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    """``1 / (1 + exp(-x))``, written so that no ``exp`` overflows."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def silu(x: np.ndarray) -> np.ndarray:
    """``x * sigmoid(x)``."""
    return x * _sigmoid(x)


def silu_grad(x: np.ndarray) -> np.ndarray:
    """The derivative of :func:`silu`.

    >>> x = np.array([-30.0, -2.0, 0.0, 0.7, 3.0]); h = 1e-6
    >>> bool(np.allclose(silu_grad(x), (silu(x + h) - silu(x - h)) / (2 * h), atol=1e-8))
    True
    """
    s = _sigmoid(x)
    return s * (1 + x * (1 - s))


def _bias_matrix(bias: Any) -> np.ndarray:
    """The bias as a matrix that broadcasts over the result: (M, 1) for one
    value per row (shape (M,) or (M, 1)), (1, N) for one per column."""
    bias = wide(bias)
    return bias if bias.ndim == 2 and bias.shape[0] == 1 and bias.shape[1] != 1 else bias.reshape(-1, 1)


def _activation(epilog: str | None) -> str | None:
    """The activation of ``epilog`` by the table of epilogues (which epilogue has which: the formulas here
    are the reference's own, in float64, not the library's)."""
    return None if epilog is None else TABLE[str(epilog)].activation


def _has_bias(epilog: str | None) -> bool:
    return epilog is not None and TABLE[str(epilog)].bias


def _preactivation(
    a: Any, b: Any, c: Any, *, alpha: complex, beta: complex, transpose_a: bool, transpose_b: bool,
    epilog: str | None, bias: Any,
) -> np.ndarray:
    """``Z = alpha * op(a) @ op(b) + beta * c + bias`` in float64/complex128 (C not read where beta = 0;
    A and B not read where alpha = 0, as BLAS has it: NaN or Inf in them does not reach Z)."""
    a, b = wide(a), wide(b)
    opa, opb = (a.T if transpose_a else a), (b.T if transpose_b else b)
    with np.errstate(invalid="ignore"):  # inf - inf, 0 * inf in operands with inf/NaN: NaN, as it should
        z = alpha * (opa @ opb) if alpha != 0 else np.zeros((opa.shape[0], opb.shape[1]), dtype=opa.dtype)
        if c is not None and beta != 0:
            z = z + beta * wide(c)
        if _has_bias(epilog):
            z = z + _bias_matrix(bias)
    return z


def _activation_grad(z: np.ndarray, epilog: str | None, relu_at_zero: float) -> np.ndarray | float:
    """``act'(Z)``: relu's is 1 where Z > 0, 0 where Z < 0 and ``relu_at_zero`` where Z is exactly 0,
    gelu's the tanh approximation's derivative, 1 without an activation."""
    act = _activation(epilog)
    if act == "relu":
        return np.where(z > 0, 1.0, np.where(z == 0, relu_at_zero, 0.0))
    if act == "gelu":
        return gelu_tanh_grad(z)
    if act == "silu":
        return silu_grad(z)
    return 1.0


def batch_shape(a: Any, b: Any) -> tuple[int, ...] | None:
    """The broadcast batch shape of stored ``a`` (..., M, K) and ``b`` (..., K, N)
    as ``numpy.matmul`` has it; None for two matrices."""
    a, b = np.shape(a), np.shape(b)
    return None if len(a) == len(b) == 2 else tuple(np.broadcast_shapes(a[:-2], b[:-2]))


def _items(batch: tuple[int, ...], a: Any, b: Any, c: Any, bias: Any) -> Any:
    """Each batch item's ``(index, a, b, c, bias)``: a and b broadcast over
    ``batch``, c (of the result's shape) and a bias with batch dimensions taken
    at the index, a bias of one or two dimensions as it is (every item's)."""
    a, b = wide(a), wide(b)
    a = np.broadcast_to(a, batch + a.shape[-2:])
    b = np.broadcast_to(b, batch + b.shape[-2:])
    for idx in np.ndindex(*batch):
        yield (idx, a[idx], b[idx], None if c is None else np.asarray(c)[idx],
               bias if bias is None or np.ndim(bias) <= 2 else np.asarray(bias)[idx])


def _stacked(batch: tuple[int, ...], parts: list[np.ndarray], shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    out = np.zeros(batch + shape, dtype)
    for idx, x in zip(np.ndindex(*batch), parts):
        out[idx] = x
    return out


def _unbroadcast(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``x`` summed over the dimensions an operand of ``shape`` was broadcast along."""
    lead = x.ndim - len(shape)
    x = x.sum(axis=tuple(range(lead))) if lead else x
    along = tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1)
    return x.sum(axis=along, keepdims=True) if along else x


def _wide_kind(*xs: Any) -> Any:
    return np.complex128 if any(np.asarray(x).dtype.kind == "c" for x in xs) else np.float64


def reference(
    a: Any, b: Any, c: Any = None, *, alpha: complex = 1.0, beta: complex = 0.0,
    transpose_a: bool = False, transpose_b: bool = False, epilog: str | None = None, bias: Any = None,
) -> np.ndarray:
    """``epilog(alpha * op(a) @ op(b) + beta * c + bias)`` in float64/complex128;
    ``a`` and ``b`` may have batch dimensions (``numpy.matmul``'s broadcasting,
    the transposes of the last two), ``c`` then has the result's and ``bias``
    is every item's or has the result's batch dimensions ((..., M, 1), (..., 1, N)).

    >>> reference(np.ones((2, 1, 3, 4)), np.ones((5, 4, 2))).shape
    (2, 5, 3, 2)
    """
    batch = batch_shape(a, b)
    if batch is not None:
        kw: dict[str, Any] = dict(alpha=alpha, beta=beta, transpose_a=transpose_a, transpose_b=transpose_b,
                                  epilog=epilog)
        parts = [reference(ai, bi, ci, bias=bi_, **kw) for _, ai, bi, ci, bi_ in _items(batch, a, b, c, bias)]
        m = np.shape(a)[-1 if transpose_a else -2]
        n = np.shape(b)[-2 if transpose_b else -1]
        # (complex where a part is: a complex c, bias or alpha on real operands, as a matrix's reference is)
        return _stacked(batch, parts, (m, n), _wide_kind(a, b, *parts))
    d = _preactivation(a, b, c, alpha=alpha, beta=beta, transpose_a=transpose_a, transpose_b=transpose_b,
                       epilog=epilog, bias=bias)
    with np.errstate(invalid="ignore"):
        act = _activation(epilog)
        if act == "relu":
            d = np.maximum(d, 0)
        elif act == "gelu":
            d = gelu_tanh(d)
        elif act == "silu":
            d = silu(d)
    return d


def reference_vjp(
    a: Any, b: Any, c: Any, g: Any, *, alpha: complex = 1.0, beta: complex = 0.0, transpose_a: bool = False,
    transpose_b: bool = False, epilog: str | None = None, bias: Any = None, relu_at_zero: float = 0.0,
) -> dict[str, np.ndarray]:
    """The gradients of :func:`reference`'s product for the cotangent ``g``
    (float64/complex128), as ``jax.vjp`` defines them: ``dZ = g * act'(Z)``,
    ``d op(A) = alpha dZ op(B)^T``, ``d op(B) = alpha op(A)^T dZ`` (plain
    transposes: the vjp of a holomorphic function is its linear transpose, no
    conjugation; zero where alpha = 0: A and B are not read), ``dC = beta dZ``
    (zero where beta = 0: C is not read) and ``dbias`` the row sums of ``dZ``
    (for a bias of shape (1, N): the column sums) in bias's shape (their real
    part for a real bias of complex operands). Keys: "a", "b", "c" (where ``c`` is given)
    and "bias" (where the epilog has one). relu has no derivative at 0: where
    Z is exactly 0 its ``act'`` is ``relu_at_zero`` (``jax.nn.relu`` takes 0,
    ``jnp.maximum(z, 0)`` 0.5; half-precision data meets exact zeros, as C and
    bias cancel).

    >>> a, b, g = np.arange(6.0).reshape(2, 3), np.ones((3, 2)), np.array([[1.0, 0.0], [0.0, 2.0]])
    >>> grads = reference_vjp(a, b, None, g, alpha=2.0)
    >>> grads["a"].tolist(), grads["b"].tolist()
    ([[2.0, 2.0, 2.0], [4.0, 4.0, 4.0]], [[0.0, 12.0], [2.0, 16.0], [4.0, 20.0]])
    """
    batch = batch_shape(a, b)
    if batch is not None:  # each item's, summed over what an operand was broadcast along
        kw: dict[str, Any] = dict(alpha=alpha, beta=beta, transpose_a=transpose_a, transpose_b=transpose_b,
                                  epilog=epilog, relu_at_zero=relu_at_zero)
        parts = [reference_vjp(ai, bi, ci, wide(g)[idx], bias=bb, **kw)
                 for idx, ai, bi, ci, bb in _items(batch, a, b, c, bias)]
        given = {"a": a, "b": b, "c": c, "bias": bias}
        out = {}
        for name in [k for k in given if given[k] is not None and (k != "bias" or _has_bias(epilog))]:
            shape = np.shape(given[name])
            item = shape[-2:] if name != "bias" or len(shape) > 2 else shape
            kind = _wide_kind(a, b) if name != "bias" else (np.complex128 if np.asarray(bias).dtype.kind == "c"
                                                            else np.float64)
            full = _stacked(batch, [p[name] for p in parts], tuple(item), kind)
            out[name] = _unbroadcast(full, shape)
        return out
    z = _preactivation(a, b, c, alpha=alpha, beta=beta, transpose_a=transpose_a, transpose_b=transpose_b,
                       epilog=epilog, bias=bias)
    dz = wide(g) * _activation_grad(z, epilog, relu_at_zero)
    opa, opb = (wide(a).T if transpose_a else wide(a)), (wide(b).T if transpose_b else wide(b))
    if alpha != 0:
        d_opa, d_opb = alpha * (dz @ opb.T), alpha * (opa.T @ dz)
    else:  # A and B are not read: they do not reach the result
        d_opa, d_opb = np.zeros((dz.shape[0], opb.shape[0]), dz.dtype), np.zeros((opa.shape[1], dz.shape[1]), dz.dtype)
    out = {"a": d_opa.T if transpose_a else d_opa, "b": d_opb.T if transpose_b else d_opb}
    if c is not None:
        out["c"] = beta * dz if beta != 0 else np.zeros_like(dz)
    if _has_bias(epilog):
        bias = np.asarray(bias)
        # summed over the dimensions the bias is broadcast along (both for a (1, 1) bias)
        along = tuple(i for i, extent in enumerate(_bias_matrix(bias).shape) if extent == 1)
        sums = dz.sum(axis=along)
        if bias.dtype.kind != "c":
            sums = sums.real
        out["bias"] = sums.reshape(bias.shape)
    return out


def reference_jvp(
    a: Any, b: Any, c: Any, tangents: dict[str, Any], *, alpha: complex = 1.0, beta: complex = 0.0,
    transpose_a: bool = False, transpose_b: bool = False, epilog: str | None = None, bias: Any = None,
    relu_at_zero: float = 0.0,
) -> np.ndarray:
    """The tangent of :func:`reference`'s product for ``tangents`` of some of
    "a", "b", "c", "bias" (the others' tangents are zero), float64/complex128:
    ``act'(Z) * (alpha (op(dA) op(B) + op(A) op(dB)) + beta dC + dbias)``
    (dC not read where beta = 0, dA and dB where alpha = 0; relu's ``act'`` at an exact 0 of Z as in
    :func:`reference_vjp`).

    >>> a, b = np.arange(6.0).reshape(2, 3), np.ones((3, 2))
    >>> reference_jvp(a, b, None, {"b": np.eye(3)[:, :2]}).tolist()
    [[0.0, 1.0], [3.0, 4.0]]
    """
    batch = batch_shape(a, b)
    if batch is not None:
        kw: dict[str, Any] = dict(alpha=alpha, beta=beta, transpose_a=transpose_a, transpose_b=transpose_b,
                                  epilog=epilog, relu_at_zero=relu_at_zero)
        t = {k: wide(v) for k, v in tangents.items()}
        t_a = np.broadcast_to(t["a"], batch + t["a"].shape[-2:]) if "a" in t else None
        t_b = np.broadcast_to(t["b"], batch + t["b"].shape[-2:]) if "b" in t else None
        parts = []
        for idx, ai, bi, ci, bb in _items(batch, a, b, c, bias):
            ti = {k: v for k, v in (("a", None if t_a is None else t_a[idx]), ("b", None if t_b is None else t_b[idx]),
                                     ("c", t["c"][idx] if "c" in t else None),
                                     ("bias", (t["bias"] if t["bias"].ndim <= 2 else t["bias"][idx])
                                      if "bias" in t else None)) if v is not None}
            parts.append(reference_jvp(ai, bi, ci, ti, bias=bb, **kw))
        m = np.shape(a)[-1 if transpose_a else -2]
        n = np.shape(b)[-2 if transpose_b else -1]
        # (complex where a part is: a complex c, bias or alpha on real operands, as a matrix's reference is)
        return _stacked(batch, parts, (m, n), _wide_kind(a, b, *parts))
    z = _preactivation(a, b, c, alpha=alpha, beta=beta, transpose_a=transpose_a, transpose_b=transpose_b,
                       epilog=epilog, bias=bias)
    op = lambda x, t: wide(x).T if t else wide(x)  # noqa: E731
    dz = np.zeros_like(z)
    if "a" in tangents and alpha != 0:  # (A and B are not read where alpha = 0)
        dz = dz + alpha * (op(tangents["a"], transpose_a) @ op(b, transpose_b))
    if "b" in tangents and alpha != 0:
        dz = dz + alpha * (op(a, transpose_a) @ op(tangents["b"], transpose_b))
    if "c" in tangents and beta != 0:
        dz = dz + beta * wide(tangents["c"])
    if "bias" in tangents and _has_bias(epilog):
        dz = dz + _bias_matrix(tangents["bias"])
    return _activation_grad(z, epilog, relu_at_zero) * dz


def finite_scale(want: np.ndarray) -> float:
    """max |want| over its finite entries (1 where it has none): what the
    tolerance scales with."""
    finite = np.abs(want[np.isfinite(want)]) if want.size else want
    return float(finite.max()) if finite.size else 1.0


def error_ratio(d: Any, want: np.ndarray, dtype: str, scale: float | None = None) -> float:
    """max |d - want| over the tolerance of ``dtype`` times ``max(1, scale)``
    (``scale`` defaults to max |want| over its finite entries): at most 1
    passes. Where ``want`` is not finite, ``d`` must hold the same value there
    (NaN where NaN, the same infinity where one), else the ratio is infinite;
    NaN where ``d`` has NaN and ``want`` has none.

    >>> error_ratio(np.array([np.inf, np.nan, 1.0]), np.array([np.inf, np.nan, 1.0]), "float64")
    0.0
    >>> error_ratio(np.array([np.nan, 1.0]), np.array([np.inf, 1.0]), "float64")
    inf
    """
    d = wide(d)
    if scale is None:
        scale = finite_scale(want)
    finite = np.isfinite(want)
    if not finite.all():
        same = np.where(np.isnan(want), np.isnan(d), d == want)
        if not same[~finite].all():
            return math.inf
        d, want = d[finite], want[finite]
    err = float(np.abs(d - want).max()) if d.size else 0.0
    return err / (TOLERANCE[dtype] * max(1.0, scale))


def assert_close(d: Any, ref: np.ndarray, dtype: str) -> None:
    d = wide(d)
    assert d.shape == ref.shape, f"result shape {d.shape}, expected {ref.shape}"
    ratio = error_ratio(d, ref, dtype)
    assert ratio <= 1.0, f"max error {ratio:.3g} x the tolerance {TOLERANCE[dtype]} x max(1, max|ref|) ({dtype})"


def random_matrix(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    x = rng.standard_normal(shape)
    if dtype.startswith("complex"):
        x = x + 1j * rng.standard_normal(shape)
    if dtype == "bfloat16" or dtype.startswith("float8"):
        import ml_dtypes

        return x.astype(getattr(ml_dtypes, dtype))
    return x.astype(dtype)


#: the values :func:`add_specials` plants
SPECIALS = (math.inf, -math.inf, math.nan)


def add_specials(rng: np.random.Generator, x: np.ndarray, most: int = 3) -> np.ndarray:
    """``x`` (real, modified in place and returned) with 1 to ``most`` entries
    at random positions set to +inf, -inf or NaN: each poisons one row or
    column of a product, and a zero of padding that meets one poisons a result
    entry that should stay finite (0 * inf = NaN)."""
    if x.size:
        for _ in range(int(rng.integers(1, most + 1))):
            x.flat[int(rng.integers(x.size))] = SPECIALS[int(rng.integers(len(SPECIALS)))]
    return x
