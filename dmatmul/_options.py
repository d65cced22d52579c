"""The options of :func:`dmatmul.matmul` and :class:`dmatmul.Matmul` as one
value, :class:`Options`, and the checks of a call (as nvmath-python's
``_configuration``: a frozen dataclass that normalizes and validates itself).

An :class:`Options` holds every keyword but the operands, each in one
spelling (a Distribution as a triple, an epilog as an :class:`Epilog`, a
precision by its name...), so that it is hashable and ranks compare it
field by field. What needs the operands (the scalars against their dtype,
shapes, the bias) and the process count (``distribution`` required,
``devices`` refused under mpiexec) is checked by :func:`validate`, which
every rank runs inside one agreement, so a mistake on one rank raises on
every rank, before any collective of the product.
"""

from __future__ import annotations

import dataclasses
import enum
import numbers
from collections.abc import Sequence
from typing import Any, TypedDict

import numpy as np

from . import _mxfp8, _runtime
from . import backends as _backends
from ._distribution import Distribution
from ._epilogue import TABLE, Epilog, EpilogName, has_bias
from ._errors import DistributionError
from ._problem import Options, Spec, _require_number
from ._relay import as_given, check_mesh, check_ndims
from ._spec import (
    DTYPES,
    FP8_DTYPES,
    RESULT_TYPES,
    AlgorithmName,
    BackendName,
    Operands,
    PrecisionName,
    as_matrix,
    check_devices,
    dtype_name,
    family,
    kind,
    native_order,
    refuse_spanning,
    refuse_trace_under_mpi,
    refuse_unusable,
    to_numpy,
)

def _op_shape(name: str, shape: tuple[int, int], transposed: bool) -> str:
    op = (shape[1], shape[0]) if transposed else shape
    return f"op({name}) is {op} ({name} stored {shape}, transpose_{name}={transposed})"


def _mixed_dtypes(a: str, b: str, given: dict[str, str]) -> str:
    """The message for operands of two dtypes (the contract: A, B and C alike);
    ``given``: the operands given as no array (see :func:`_read_as`)."""
    head = f"a and b must have the same dtype, got a {a} and b {b}"
    for name, other, read in (("b", "a", b), ("a", "b", a)):
        if name in given and other not in given:
            return head + _read_as(given, name, read, f"{other}.dtype")
    return head + (
        ": cast one first (e.g. b.astype(a.dtype)); "
        "inside jax.shard_map, dmatmul.jax's blocks take mixed dtypes with preferred_element_type="
    )


def _given_as(ops: Operands) -> dict[str, str]:
    """The type of each matrix operand given as no array (a nested list, a
    memoryview...), which numpy reads with a dtype of its choosing."""
    return {name: type(x).__name__ for name in ("a", "b", "c")
            if (x := getattr(ops, name)) is not None and family(x) == "other"}


def _read_as(given: dict[str, str], name: str, read: str, want: str) -> str:
    """What a dtype message adds where ``name`` was given as no array: how
    numpy read it, and how to pass it as ``want`` (a dtype expression)."""
    if name not in given:
        return ""
    return f" ({name} was given as a {given[name]}, which numpy reads as {read}: pass np.asarray({name}, dtype={want}))"


def _scalar(x: Any, name: str, dtype: str) -> complex:
    """``alpha=`` or ``beta=`` as the value the product of ``dtype`` computes with."""
    x = _require_number(x, name)
    if isinstance(x, numbers.Complex) and not isinstance(x, numbers.Real):
        if not dtype.startswith("complex"):
            raise TypeError(f"{name}={x!r} is complex but the operands are {dtype}: use a real {name}")
        try:
            return complex(x)
        except OverflowError:
            raise ValueError(f"{name}={x!r} does not fit a complex double") from None
    try:
        # one value for one number whatever its type (ranks compare it): 1.0 and 1+0j alike for complex operands
        return complex(x) if dtype.startswith("complex") else float(x)
    except OverflowError:
        raise ValueError(f"{name}={x!r} does not fit a double") from None
    except ValueError as e:  # a number that has no float value (Decimal('sNaN'))
        raise ValueError(f"{name}={x!r} has no floating-point value: {e}") from None


def _beta_needs_c(beta: Any, fix: str) -> str:
    """The message for a ``beta`` that is not 0 where no c is given (c would be read)."""
    return f"beta={beta!r} needs c: the result is alpha*op(a)@op(b) + beta*c, and no c was given: {fix}"


def _check_local(ops: Operands, options: dict[str, Any], *, spmd: bool) -> Spec:
    """Phase 1: everything one rank can check alone (types, dtypes, names); the
    Spec of this rank's blocks (its shapes are theirs)."""
    if spmd:
        refuse_trace_under_mpi(ops.a, ops.b, ops.c, ops.bias)
    given = _given_as(ops)
    ops.a = as_matrix(ops.a, "a", batched=True)
    ops.b = as_matrix(ops.b, "b", batched=True)
    if spmd:
        for name, x in (("a", ops.a), ("b", ops.b), ("c", ops.c)):
            refuse_spanning(x, name)
    dtype = dtype_name(ops.a.dtype)
    if dtype_name(ops.b.dtype) != dtype:
        raise TypeError(_mixed_dtypes(dtype, dtype_name(ops.b.dtype), given))
    block = _mxfp8.take(options := dict(options))
    opts = Options(**options)
    if block is not None:  # MXFP8: the product of the dequantized operands, in float32 (dmatmul._mxfp8), the
        # scales held with FP8 a and b until the backend is known (nvmath may hand them to cuBLASMp)
        _mxfp8.hold(ops, block, dtype, opts.transpose_a, opts.transpose_b)
        opts = dataclasses.replace(opts, block_scaled=dtype, precision="highest")
        dtype = "float32"
    result = _check_fp8(opts, dtype)
    epilog = opts.epilog
    if epilog is not None and not epilog.info.complex and dtype.startswith("complex"):
        usable = ", ".join(repr(name) for name, e in TABLE.items() if e.complex)
        raise TypeError(f"epilog={epilog!r} is not defined for complex operands ({dtype}); use None or {usable}")
    if ops.c is not None:
        ops.c = as_matrix(ops.c, "c", batched=True)
        if dtype_name(ops.c.dtype) != result:
            got = dtype_name(ops.c.dtype)
            if dtype in FP8_DTYPES or opts.block_scaled is not None:
                raise TypeError(f"c must have the result's dtype, result_type={result!r} (a and b are {dtype}), got "
                                f"{got}: pass c.astype({result!r}), or result_type={got!r}"
                                if got in RESULT_TYPES else f"c must have the result's dtype ({result}), got {got}")
            raise TypeError(
                f"c must have the dtype of a and b ({dtype}), got {got}" + _read_as(given, "c", got, "a.dtype")
            )
    given_dtype = opts.block_scaled or dtype  # (what the caller passed, for the messages: MXFP8's FP8)
    bias_shape = _check_bias(ops, epilog, given_dtype)
    alpha, beta = _scalar(opts.alpha, "alpha", given_dtype), _scalar(opts.beta, "beta", given_dtype)
    if beta != 0 and ops.c is None:
        raise ValueError(_beta_needs_c(opts.beta, "pass c (an array of the result's shape), or leave beta=0"))
    if spmd and opts.distribution is None:
        raise ValueError(
            "distribution is required when running as several processes (each rank passes its local "
            "blocks): e.g. distribution=(dm.Slab.X, dm.Slab.Y, dm.Slab.X)"
        )
    if spmd:
        check_devices(opts.devices, spmd=True)
    if opts.distribution is not None:
        ndims = (ops.a.ndim, ops.b.ndim, max(ops.a.ndim, ops.b.ndim))
        check_ndims(opts.distribution, ndims, (f"stored shape {tuple(ops.a.shape)}", f"stored shape {tuple(ops.b.shape)}",
                                                "the batch dimensions of a and b, then (M, N)"))
        rt = _runtime.active() if spmd else None
        if rt is not None:
            # (as given: a Sharded whose 2-D form is a Slab keeps its mesh only there)
            check_mesh(as_given(options.get("distribution")), rt.size, f"{rt.size} processes", "")
    shape = lambda x: tuple(int(d) for d in x.shape)  # noqa: E731
    return Spec(shape(ops.a), shape(ops.b), dtype, opts._scaled_for(alpha, beta), family=ops.family,
                c_shape=None if ops.c is None else shape(ops.c), bias_shape=bias_shape)


def _check_fp8(opts: Options, dtype: str) -> str:
    """The FP8 keywords against the operands' dtype (nvmath-python's rules: scales
    only for narrow-precision operands; an FP8 result is not offered); the
    result's dtype."""
    if dtype in FP8_DTYPES or opts.block_scaled is not None:
        return opts.result_type or "bfloat16"
    if opts.quantization_scales is not None:
        raise ValueError(
            f"quantization_scales are for FP8 operands (float8_e4m3fn, float8_e5m2), but a and b are {dtype}: "
            "scale the product with alpha= instead, or pass FP8 a and b"
        )
    if opts.result_type is not None and opts.result_type != dtype:
        raise ValueError(
            f"result_type={opts.result_type!r} is for FP8 operands; the result of {dtype} a and b is {dtype}: "
            "leave result_type=None, or cast the result"
        )
    return dtype


def _check_bias(ops: Operands, epilog: Epilog | None, dtype: str) -> tuple[int, ...] | None:
    """The bias against the epilog and the operands' dtype (put in native order
    in ``ops``); its shape, or None where there is none."""
    if has_bias(epilog) and ops.bias is None:
        raise ValueError(
            f"epilog={epilog!r} needs bias=<vector of length M> (one value per result row, shape (M,) or (M, 1)) "
            "or a bias of shape (1, N) (one value per result column), got bias=None"
        )
    if ops.bias is None:
        return None
    if not has_bias(epilog):
        with_bias = ", ".join(repr(name) for name, e in TABLE.items() if e.bias)
        raise ValueError(f"bias is given but epilog={epilog!r}: use one of the epilogs with a bias ({with_bias})")
    refuse_unusable(ops.bias, "bias")
    if family(ops.bias) == "other":
        ops.bias = to_numpy(ops.bias, "bias")
    if dtype_name(ops.bias.dtype) not in DTYPES or dtype_name(ops.bias.dtype) in FP8_DTYPES:
        usable = ", ".join(d for d in DTYPES if d not in FP8_DTYPES)
        raise TypeError(f"bias must have one of the dtypes {usable} (it is converted to the result's), "
                        f"got {dtype_name(ops.bias.dtype)}")
    if np.dtype(ops.bias.dtype).kind == "c" and not dtype.startswith("complex"):
        raise TypeError(
            f"bias is complex ({dtype_name(ops.bias.dtype)}) but a and b are real ({dtype}): its imaginary "
            "part would be lost; pass a real bias, or complex a and b"
        )
    ops.bias = native_order(ops.bias)
    bias_shape = tuple(int(x) for x in ops.bias.shape)
    matrix = bias_shape[-2:] if len(bias_shape) > 2 else bias_shape
    length = int(np.prod(matrix))
    if matrix not in ((length,), (length, 1), (1, length)):  # per rank, before ranks compare
        raise ValueError(
            "bias must be a vector: one value per result row, shape (M,) or (M, 1), or one value per result "
            f"column, shape (1, N) (for a batched product also (..., M, 1) or (..., 1, N), one per item); got "
            f"shape {bias_shape}"
        )
    return bias_shape


def _check_global(ops: Operands, spec: Spec, nprocs: int) -> Spec:
    """Phase 2: the product's global shapes (``spec``'s, once ranks agreed) fit
    together (deterministic on every rank); the Spec on ``nprocs`` processes."""
    ta, tb = spec.transpose_a, spec.transpose_b
    _check_batch(spec)
    if spec.k != (spec.b_shape[-1] if tb else spec.b_shape[-2]):
        raise ValueError(
            f"a and b: inner dimensions differ: {_op_shape('a', spec.shapes['a'], ta)} but "
            f"{_op_shape('b', spec.shapes['b'], tb)}; op(a) must be (M, K) and op(b) (K, N)"
        )
    m, n = spec.m, spec.n
    if spec.c_shape is not None and spec.c_shape != spec.result_shape:
        batch = spec.batch_shape
        what = f"(..., M, N) = {spec.result_shape}, the batch dimensions of a and b broadcast" if batch else \
            f"(M, N) = {(m, n)}"
        fix = f": pass np.broadcast_to(c, {spec.result_shape})" if _broadcasts(spec.c_shape, spec.result_shape) \
            else ""
        raise ValueError(f"c must have the result's shape {what}, got {spec.c_shape}{fix}")
    if spec.bias_shape is not None:
        _check_bias_shape(spec)  # a bias that fits neither way raises
    return dataclasses.replace(spec, nprocs=nprocs) if nprocs != spec.nprocs else spec


def _broadcasts(shape: tuple[int, ...], to: tuple[int, ...]) -> bool:
    try:
        return tuple(np.broadcast_shapes(shape, to)) == to
    except ValueError:
        return False


def _check_batch(spec: Spec) -> None:
    """The batch dimensions of a and b broadcast as ``numpy.matmul``'s do."""
    try:
        spec.batch_shape
    except ValueError:
        raise ValueError(
            f"a and b: batch dimensions {spec.a_shape[:-2]} and {spec.b_shape[:-2]} do not broadcast (a stored "
            f"{spec.a_shape}, b stored {spec.b_shape}; numpy.matmul's rule: aligned from the right, each pair "
            "equal or one of them 1): give them equal batch dimensions, or 1 where one is shared"
        ) from None


def _check_bias_shape(spec: Spec) -> None:
    """A bias of one value per result row or column, every item's (one or two
    dimensions), or one per item (the result's batch dimensions, then (M, 1)
    or (1, N)); else a ValueError naming the fix."""
    shape, batch, m, n = spec.bias_shape, spec.batch_shape, spec.m, spec.n
    assert shape is not None
    if len(shape) <= 2:
        _bias_columns(shape, m, n)
        return
    if shape[:-2] != batch or shape[-2:] not in ((m, 1), (1, n)):
        raise ValueError(
            f"bias of shape {shape}: a bias with batch dimensions holds one vector per item of the batch "
            f"{batch}: shape (..., M, 1) = {(*batch, m, 1)} (per result row) or (..., 1, N) = {(*batch, 1, n)} "
            f"(per result column); a bias of shape (M,), (M, 1) or (1, N) is added to every item"
        )


def _bias_columns(shape: tuple[int, ...], m: int, n: int) -> bool:
    """Whether a bias of ``shape`` holds one value per result column (shape
    (1, N)) rather than per row ((M,) or (M, 1), also where M = N); a
    ValueError naming the fix for any other shape."""
    if shape in ((m,), (m, 1)):
        return False
    if shape == (1, n):
        return True
    if shape == (n,):
        raise ValueError(
            f"bias of shape {shape}: a 1-D bias holds one value per result row, of length M={m}; one value per "
            f"result column (N={n}, the `x @ W + b` of ML code) is passed as shape (1, N): bias.reshape(1, -1)"
        )
    raise ValueError(
        f"bias must hold one value per result row, shape (M,) or (M, 1) = ({m},) or ({m}, 1), or one value per "
        f"result column, shape (1, N) = (1, {n}); got shape {shape}"
    )


def validate(ops: Operands, what: str = "dmatmul.Matmul", **options: Any) -> tuple[Spec, str | None]:
    """Check everything that needs no backend; return the plan's Spec (its
    :class:`Options` with the scalars as the operands' dtype has them) and
    (several processes) the backend every rank's ``backend=`` found.

    Under several processes one small allgather carries every rank's verdict
    on its local checks, its call (dtype, transposes, distributions, scalars,
    epilog, algorithm, backend, precision) and its local shapes, before any
    collective of the product: a mistake or a difference on one rank raises
    on every rank, naming the field and the ranks. The global shapes are then
    inferred from the local ones, as nvmath does.
    """
    rt = _runtime.active()
    if rt is None or rt.size == 1:
        return _check_global(ops, _check_local(ops, options, spmd=False), nprocs=1), None

    def check() -> tuple[Spec, str]:
        local = _check_local(ops, options, spmd=True)
        return local, _backends.resolve(local.options.backend).name  # what "auto" finds on this rank's node

    def told(got: tuple[Spec, str]) -> tuple[Any, ...]:
        return got[0].call(), (got[0].a_shape, got[0].b_shape, got[0].c_shape), got[1]

    (local, runs_on), shared = _runtime.agree_and_share(check, told, what)
    _runtime.require_same_call([call for call, _, _ in shared], what)
    found = _runtime.disagreement([name for _, _, name in shared],
                                  f"the backend that backend={local.options.backend!r} finds", verbs=("finds", "find"))
    if found is not None:  # each rank would run another backend's collectives
        raise ValueError(f"{what}: {found} (this is rank {rt.rank}): every rank needs the same backends installed "
                         "and usable (`dmatmul info` on each says which), or name one: backend='jax'")
    a_shape, b_shape, c_shape = _global_shapes(local, [shapes for _, shapes, _ in shared], rt.rank)
    return _check_global(ops, dataclasses.replace(local, a_shape=a_shape, b_shape=b_shape, c_shape=c_shape),
                         nprocs=rt.size), runs_on


def _global_shapes(local: Spec, gathered: list[tuple[Any, ...]], rank: int) -> tuple[Any, ...]:
    """The global shapes of a, b and c from every rank's blocks (``gathered``:
    each rank's (a, b, c) shapes), as nvmath infers them."""
    dists = local.distributions
    assert dists is not None
    out: list[tuple[int, ...]] = []
    for i, (name, dist) in enumerate(zip(("a", "b"), dists)):
        try:
            if dist.ndim > 2:  # a Sharded of every dimension: the batch may be split too
                out.append(dist.global_shape([g[i] for g in gathered]))
                continue
            batch = _same_batch([g[i] for g in gathered], name, rank)
            out.append(batch + dist.global_shape([g[i][-2:] for g in gathered]))
        except DistributionError as e:
            raise DistributionError(f"{name}: {e} (this is rank {rank})") from None
    a_shape, b_shape = out
    if gathered[0][2] is None:  # no c (every rank agreed on that)
        return a_shape, b_shape, None
    # c's blocks are checked against the result's shape that a and b imply: a misfit names its own rank
    full = dataclasses.replace(local, a_shape=a_shape, b_shape=b_shape)
    _check_batch(full)
    if dists[2].ndim > 2:
        try:
            dists[2].check_blocks([g[2] for g in gathered], full.result_shape, "of the result, from a and b")
        except DistributionError as e:
            raise DistributionError(f"c: {e} (this is rank {rank})") from None
        return a_shape, b_shape, full.result_shape
    batch = _same_batch([g[2] for g in gathered], "c", rank)
    try:
        dists[2].check_blocks([g[2][-2:] for g in gathered], full.shapes["d"], "of the result (M, N), from a and b")
    except DistributionError as e:
        raise DistributionError(f"c: {e} (this is rank {rank})") from None
    return a_shape, b_shape, batch + full.shapes["d"]


def _same_batch(shapes: list[tuple[int, ...]], name: str, rank: int) -> tuple[int, ...]:
    """The batch dimensions of ``name``'s blocks: a distribution splits the last
    two dimensions only, so every rank holds the whole batch."""
    batches = [tuple(s[:-2]) for s in shapes]
    if len(set(batches)) > 1:
        told = ", ".join(f"rank {r}: {b}" for r, b in enumerate(batches))
        raise DistributionError(
            f"{name}: the ranks' blocks have different batch dimensions ({told}; this is rank {rank}): a "
            "distribution splits the last two dimensions, every rank holds the whole batch"
        )
    return batches[0]


def check_reset(
    ops: Operands, swapped: dict[str, np.ndarray], spec: Spec, a: Any, b: Any, c: Any, bias: Any,
    alpha: complex | None, beta: complex | None,
) -> tuple[Operands, dict[str, np.ndarray], Spec]:
    """The checks of :meth:`dmatmul.Matmul.reset_operands`: the new operands of
    the plan of ``spec`` (made on ``ops``, of which ``swapped`` are the
    caller's byte-swapped arrays), the byte-swapped arrays among them, and the
    spec they make (``ops`` and ``swapped`` are left as they are)."""
    new = dataclasses.replace(ops)
    swapped = dict(swapped)
    for name, value in (("a", a), ("b", b), ("c", c), ("bias", bias)):
        if value is None:
            continue
        if name in ("a", "b") and spec.options.block_scaled is not None:
            raise ValueError(f"reset_operands: {name}'s block scales (MXFP8) were applied when the plan was made "
                             f"(a and b are held dequantized): make a new Matmul with the new {name} and its "
                             "quantization_scales")
        swapped.pop(name, None)
        swapped.update(byte_swapped(**{name: value}))
        old = getattr(ops, name)
        if old is None:
            raise ValueError(f"reset_operands: {name} was not given when the plan was made; make a new Matmul")
        refuse_unusable(value, name)
        given = {name: type(value).__name__} if family(value) == "other" else {}
        if given:
            value = to_numpy(value, name) if name == "bias" else as_matrix(value, name, batched=True)
        held = kind(family(value))
        if held is not None:
            held.refuse_held(value, name)  # (a tracer would outlive its trace)
        got = (tuple(value.shape), dtype_name(value.dtype), family(value))
        want = (tuple(old.shape), dtype_name(old.dtype), family(old))
        if got != want:
            read = _read_as(given, name, got[1], repr(want[1])) if got[1] != want[1] else ""
            raise ValueError(
                f"reset_operands: {name} must match the planned (shape, dtype, family) {want}, got {got}{read}"
            )
        if held is not None:
            held.refuse_moved(value, old, name)  # (the result would come back where the plan's operands were)
        setattr(new, name, native_order(value))
    if alpha is not None or beta is not None:
        spec = dataclasses.replace(spec, options=spec.options._scaled_for(
            spec.alpha if alpha is None else _scalar(alpha, "alpha", spec.dtype),
            spec.beta if beta is None else _scalar(beta, "beta", spec.dtype),
        ))
        if spec.beta != 0 and spec.c_shape is None:
            raise ValueError("reset_operands: " + _beta_needs_c(
                beta, "the plan was made without c; make a new Matmul with c, or leave beta=0"))
    return new, swapped, spec


_OPERAND_NAMES = ("a", "b", "c", "bias")


def _shapes(ops: Operands) -> dict[str, tuple[tuple[int, ...], str]]:
    return {name: (tuple(x.shape), dtype_name(x.dtype)) for name in _OPERAND_NAMES
            if (x := getattr(ops, name)) is not None}


def _held(ops: Operands) -> tuple[tuple[str, tuple[int, ...], Any], ...]:
    """Each operand's shape and its dtype object as given: arrays that still hold
    these have the (shape, dtype name) of :func:`_shapes` (others are compared by it)."""
    return tuple((name, tuple(x.shape), x.dtype) for name in _OPERAND_NAMES if (x := getattr(ops, name)) is not None)


def byte_swapped(**given: Any) -> dict[str, np.ndarray]:
    """Those of ``given`` that are numpy arrays in non-native byte order."""
    return {name: x for name, x in given.items() if isinstance(x, np.ndarray) and not x.dtype.isnative}


#: The options of :func:`matmul` and :class:`Matmul`, documented once for both (as nvmath-python does).
_DOCS = {
    "operands": """a, b: the stored matrices (global in one process; this rank's blocks
            under mpirun), or batches of them: ``(..., M, K)`` and ``(..., K, N)``
            (stored; the transposes act on the last two dimensions), the batch
            dimensions broadcast as ``numpy.matmul`` does (a distribution then
            splits the last two: every rank holds the whole batch of its
            blocks). numpy in gives numpy out; ``jax.Array`` in gives
            ``jax.Array`` out (on the user's mesh when the operands are on one).
        c: optional, with the result's shape (batch dimensions included, no
            broadcasting) and distribution; read only when ``beta != 0`` (BLAS
            convention). Never modified.""",
    "options": """distribution: a Distribution for all three, or ``(dist_a, dist_b,
            dist_result)``; describes the *stored* ``a`` and ``b``. Optional in
            one process (read off jax.Array operands' shardings, ``c``'s for
            the result where ``c`` is read; the cost model picks the rest),
            required under mpirun.
        alpha, beta: Python or numpy numbers, complex ones only for complex
            operands (not arrays, nor traced values: they are compiled into
            the plan). transpose_a, transpose_b: ``op(x) = x.T``.
        epilog: None, "relu", "gelu" (tanh approximation, as cuBLASLt),
            "silu" (``x * sigmoid(x)``), "bias", "relu_bias", "gelu_bias",
            "silu_bias"; ``bias`` holds one value per result row (shape
            ``(M,)`` or ``(M, 1)``, added to every column) or one per result
            column (shape ``(1, N)``, added to every row: ``x @ W + b``); for a
            batch, these are every item's, or ``(..., M, 1)`` / ``(..., 1, N)``
            with the result's batch dimensions one per item; of
            any of the supported dtypes: converted to the product's (a complex
            bias on real operands is refused: its imaginary part would be lost).
        backend: "auto" (nvmath where it can run, else jax; in one process,
            jax for ``jax.Array`` operands, inside a JAX trace and for
            ``devices=`` of several or a list of JAX devices), "jax" or "nvmath". algorithm: "auto" or one of
            ``dmatmul.ALGORITHMS``. precision: None (the framework's
            default: ``jax.default_matmul_precision`` on JAX, nvmath's default
            compute type on nvmath), "default", "high" or "highest", as for
            ``jnp.dot`` (a ``jax.lax.Precision`` or one of JAX's other names,
            such as "tensorfloat32", is read as the one it stands for).
        devices: an int N (the first N devices) or a list of JAX devices
            (one process; default: all local devices).
        quantization_scales: FP8 a and b only (float8_e4m3fn, float8_e5m2):
            ``{"a": sa, "b": sb}``, per-tensor float32 scalars (1 where left
            out); the product is ``alpha * (sa*a) @ (sb*b)``, accumulated in
            float32. Or block scales (MXFP8): uint8 arrays of UE8M0
            exponents (``2**(s - 127)``), one per 32 elements along K, of the
            stored operand's shape with K counted in blocks (a ``(M, K)``:
            ``(M, ceil(K/32))``; b ``(K, N)``: ``(ceil(K/32), N)``), local
            blocks' under mpiexec; emulated on every backend (dequantized to
            float32 once, see docs/guide.md). result_type: FP8 only, the dtype of the result and of
            ``c``: "bfloat16" (default), "float16" or "float32".""",
    "semantics": """``D = epilog(alpha * op(a) @ op(b) + beta * c [+ bias])``. Degenerate
    sizes follow BLAS: K = 0 gives ``epilog(beta*c [+ bias])`` (zeros without
    c), M = 0 or N = 0 an empty result. So does ``alpha == 0``: a and b are
    not read (NaN or Inf in them does not reach the result), on every backend.
    ``beta != 0`` needs ``c``.""",
}


class MatmulOptions(TypedDict, total=False):
    """The keyword options of :func:`matmul` and :class:`Matmul` (for type checkers)."""

    distribution: Distribution | Sequence[Distribution] | None
    alpha: complex
    beta: complex
    transpose_a: bool
    transpose_b: bool
    epilog: EpilogName | Epilog | None
    bias: Any
    backend: BackendName
    algorithm: AlgorithmName
    precision: PrecisionName | enum.Enum | None
    devices: int | Sequence[Any] | None
    quantization_scales: dict[str, Any] | None
    result_type: Any

