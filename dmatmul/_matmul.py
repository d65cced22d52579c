"""The backend-neutral front end: :func:`matmul` over the :class:`Matmul` plan.

``D = epilog(alpha * op(A) @ op(B) + beta * C [+ bias])`` with ``op(X)`` = X
or X.T. ``a`` and ``b`` are the *stored* matrices: with ``transpose_a=True``
the stored ``a`` is ``(K, M)`` and its distribution describes that stored
matrix. In one process operands are global matrices; under a multi-process
launch they are this rank's local blocks.

Validation happens here, before any backend is touched, so every mistake is a
``TypeError``/``ValueError`` that names the operand, what was expected and
what was given.
"""

from __future__ import annotations

import dataclasses
import numbers
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import _runtime
from . import backends as _backends
from ._distribution import Distribution
from ._errors import DistributionError, PlanFreedError
from ._plan import ALGORITHMS

__all__ = ["matmul", "Matmul", "Spec", "Operands", "EPILOGS", "DTYPES"]

EPILOGS: tuple[str | None, ...] = (None, "relu", "gelu", "bias", "relu_bias", "gelu_bias")
DTYPES: tuple[str, ...] = ("float16", "bfloat16", "float32", "float64", "complex64", "complex128")
_BACKEND_NAMES = ("auto", "jax", "nvmath")


# --------------------------------------------------------------------------- #
# operands
# --------------------------------------------------------------------------- #
def family(x: Any) -> str:
    """The array family of ``x``: "numpy", "jax" or "cupy" (without importing any)."""
    if isinstance(x, np.ndarray):
        return "numpy"
    jax = sys.modules.get("jax")
    if jax is not None and isinstance(x, jax.Array):
        return "jax"
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(x, cupy.ndarray):
        return "cupy"
    return "other"


def _as_matrix(x: Any, name: str) -> Any:
    if family(x) == "other":
        if not hasattr(x, "__array__") and not isinstance(x, (list, tuple)):
            raise TypeError(
                f"{name} must be a 2-D numpy, jax or cupy array, got {type(x).__name__}"
            )
        x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"{name} must be a 2-D matrix, got {x.ndim}-D array of shape {tuple(x.shape)}")
    dt = np.dtype(x.dtype).name
    if dt not in DTYPES:
        raise TypeError(f"{name} has dtype {dt}; supported dtypes: {', '.join(DTYPES)}")
    return x


@dataclasses.dataclass
class Operands:
    """The arrays of one product (mutable: :meth:`Matmul.reset_operands`)."""

    a: Any
    b: Any
    c: Any = None
    bias: Any = None

    @property
    def family(self) -> str:
        fams = {family(x) for x in (self.a, self.b, self.c) if x is not None}
        for f in ("cupy", "jax"):
            if f in fams:
                return f
        return "numpy"


@dataclasses.dataclass(frozen=True)
class Spec:
    """Everything a backend needs to plan one product; hashable (a cache key).

    Shapes are global and *stored* (``a_shape`` is ``(K, M)`` when
    ``transpose_a``). ``distributions`` is ``(dist_a, dist_b, dist_result)``
    or None (one process: the backend picks).
    """

    a_shape: tuple[int, int]
    b_shape: tuple[int, int]
    dtype: str
    transpose_a: bool
    transpose_b: bool
    distributions: tuple[Distribution, Distribution, Distribution] | None
    alpha: complex
    beta: complex
    use_c: bool
    epilog: str | None
    algorithm: str
    family: str
    devices: Any = None
    nprocs: int = 1  # > 1: several processes, operands are local blocks

    @property
    def spmd(self) -> bool:
        return self.nprocs > 1

    @property
    def m(self) -> int:
        return self.a_shape[1] if self.transpose_a else self.a_shape[0]

    @property
    def k(self) -> int:
        return self.a_shape[0] if self.transpose_a else self.a_shape[1]

    @property
    def n(self) -> int:
        return self.b_shape[0] if self.transpose_b else self.b_shape[1]

    @property
    def has_bias(self) -> bool:
        return self.epilog is not None and self.epilog.endswith("bias")


def _op_shape(name: str, shape: tuple[int, int], transposed: bool) -> str:
    op = (shape[1], shape[0]) if transposed else shape
    return f"op({name}) is {op} ({name} stored {shape}, transpose_{name}={transposed})"


def _scalar(x: Any, name: str, dtype: str) -> complex:
    if isinstance(x, bool) or not isinstance(x, numbers.Number):
        raise TypeError(f"{name} must be a number, got {x!r} ({type(x).__name__})")
    if isinstance(x, numbers.Complex) and not isinstance(x, numbers.Real):
        if not dtype.startswith("complex"):
            raise TypeError(f"{name}={x!r} is complex but the operands are {dtype}: use a real {name}")
        return complex(x)
    return float(x)  # type: ignore[arg-type]


def _distributions(distribution: Any) -> tuple[Distribution, Distribution, Distribution] | None:
    if distribution is None:
        return None
    if isinstance(distribution, Distribution):
        return (distribution, distribution, distribution)
    if isinstance(distribution, (tuple, list)):
        if len(distribution) != 3:
            raise ValueError(
                "distribution must be one Distribution or a triple (dist_a, dist_b, dist_result), "
                f"got a sequence of length {len(distribution)}"
            )
        for name, d in zip(("a", "b", "result"), distribution):
            if not isinstance(d, Distribution):
                raise TypeError(
                    f"distribution of {name} must be a dmatmul Distribution (Slab.X, Slab.Y, "
                    f"Replicated(), BlockNonCyclic(grid), BlockCyclic(grid, blocks)), got {d!r}"
                )
        return tuple(distribution)  # type: ignore[return-value]
    raise TypeError(
        "distribution must be None, a dmatmul Distribution or a triple (dist_a, dist_b, dist_result), "
        f"got {type(distribution).__name__}"
    )


@dataclasses.dataclass(frozen=True)
class _Checked:
    """What the local checks established (phase 1 of validation)."""

    dtype: str
    transpose_a: bool
    transpose_b: bool
    alpha: complex
    beta: complex
    epilog: str | None
    distributions: tuple[Distribution, Distribution, Distribution] | None
    algorithm: str
    devices: Any
    shapes: tuple[tuple[int, int], tuple[int, int], tuple[int, int] | None]  # a, b, c as given here


def _check_local(
    ops: Operands,
    *,
    distribution: Any,
    alpha: Any,
    beta: Any,
    transpose_a: bool,
    transpose_b: bool,
    epilog: Any,
    backend: Any,
    algorithm: Any,
    devices: Any,
    spmd: bool,
) -> _Checked:
    """Phase 1: everything one rank can check alone (types, dtypes, names)."""
    ops.a = _as_matrix(ops.a, "a")
    ops.b = _as_matrix(ops.b, "b")
    dtype = np.dtype(ops.a.dtype).name
    if np.dtype(ops.b.dtype).name != dtype:
        raise TypeError(f"a and b must have the same dtype, got a {dtype} and b {np.dtype(ops.b.dtype).name}")
    for name, flag in (("transpose_a", transpose_a), ("transpose_b", transpose_b)):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"{name} must be a bool, got {flag!r}")
    if epilog not in EPILOGS:
        raise ValueError(f"epilog must be one of {EPILOGS}, got {epilog!r}")
    if epilog in ("relu", "gelu", "relu_bias", "gelu_bias") and dtype.startswith("complex"):
        raise TypeError(f"epilog={epilog!r} is not defined for complex operands ({dtype}); use None or 'bias'")
    if ops.c is not None:
        ops.c = _as_matrix(ops.c, "c")
        if np.dtype(ops.c.dtype).name != dtype:
            raise TypeError(f"c must have the dtype of a and b ({dtype}), got {np.dtype(ops.c.dtype).name}")
    has_bias = epilog is not None and epilog.endswith("bias")
    if has_bias and ops.bias is None:
        raise ValueError(f"epilog={epilog!r} needs bias=<vector of length M>, got bias=None")
    if ops.bias is not None:
        if not has_bias:
            raise ValueError(f"bias is given but epilog={epilog!r}: use epilog='bias', 'relu_bias' or 'gelu_bias'")
        if family(ops.bias) == "other":
            ops.bias = np.asarray(ops.bias)
        if np.dtype(ops.bias.dtype).kind not in "fc" and np.dtype(ops.bias.dtype).name not in DTYPES:
            raise TypeError(f"bias must have a floating dtype, got {np.dtype(ops.bias.dtype).name}")
    alpha_v = _scalar(alpha, "alpha", dtype)
    beta_v = _scalar(beta, "beta", dtype)
    dists = _distributions(distribution)
    if spmd and dists is None:
        raise ValueError(
            "distribution is required when running as several processes (each rank passes its local "
            "blocks): e.g. distribution=(dm.Slab.X, dm.Slab.Y, dm.Slab.X)"
        )
    if backend not in _BACKEND_NAMES:
        raise ValueError(f"backend must be one of {_BACKEND_NAMES}, got {backend!r}")
    if algorithm != "auto" and algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be 'auto' or one of {ALGORITHMS}, got {algorithm!r}")
    if devices is not None:
        if spmd:
            raise ValueError("devices= is for one process; under mpiexec each rank uses its own device")
        if isinstance(devices, bool) or not (
            isinstance(devices, numbers.Integral) or isinstance(devices, Sequence)
        ):
            raise TypeError(f"devices must be None, an int or a list of devices, got {devices!r}")
        if isinstance(devices, numbers.Integral) and devices < 1:
            raise ValueError(f"devices must be >= 1, got {devices}")
        if not isinstance(devices, numbers.Integral):
            devices = tuple(devices)
            if not devices:
                raise ValueError("devices must not be an empty list")
    shape = lambda x: (int(x.shape[0]), int(x.shape[1]))  # noqa: E731
    return _Checked(
        dtype=dtype,
        transpose_a=bool(transpose_a),
        transpose_b=bool(transpose_b),
        alpha=alpha_v,
        beta=beta_v,
        epilog=epilog,
        distributions=dists,
        algorithm=algorithm,
        devices=devices,
        shapes=(shape(ops.a), shape(ops.b), None if ops.c is None else shape(ops.c)),
    )


def _check_global(
    ops: Operands, chk: _Checked, a_shape: tuple[int, int], b_shape: tuple[int, int],
    c_shape: tuple[int, int] | None, nprocs: int,
) -> Spec:
    """Phase 2: the product's global shapes agree (deterministic on every rank)."""
    ta, tb = chk.transpose_a, chk.transpose_b
    k_a = a_shape[0] if ta else a_shape[1]
    k_b = b_shape[1] if tb else b_shape[0]
    if k_a != k_b:
        raise ValueError(
            f"a and b: inner dimensions differ: {_op_shape('a', a_shape, ta)} but "
            f"{_op_shape('b', b_shape, tb)}; op(a) must be (M, K) and op(b) (K, N)"
        )
    m = a_shape[1] if ta else a_shape[0]
    n = b_shape[0] if tb else b_shape[1]
    if 0 in (m, n, k_a):
        raise ValueError(f"a and b: every dimension must be positive, got M={m}, N={n}, K={k_a}")
    if c_shape is not None and c_shape != (m, n):
        raise ValueError(f"c must have the result's shape (M, N) = {(m, n)}, got {c_shape}")
    if ops.bias is not None and tuple(ops.bias.shape) not in ((m,), (m, 1)):
        raise ValueError(
            f"bias must be a vector of length M={m} (one value per result row), got shape {tuple(ops.bias.shape)}"
        )
    return Spec(
        a_shape=a_shape,
        b_shape=b_shape,
        dtype=chk.dtype,
        transpose_a=ta,
        transpose_b=tb,
        distributions=chk.distributions,
        alpha=chk.alpha,
        beta=chk.beta,
        use_c=ops.c is not None and chk.beta != 0,
        epilog=chk.epilog,
        algorithm=chk.algorithm,
        family=ops.family,
        devices=chk.devices,
        nprocs=nprocs,
    )


def _validate(ops: Operands, **options: Any) -> Spec:
    """Check everything that needs no backend; return the plan's Spec.

    Under several processes the local checks are agreed on by all ranks first,
    then the local shapes are gathered (one small allgather, as nvmath does)
    and the global shapes inferred from the distributions: a bad block on one
    rank raises on every rank.
    """
    rt = _runtime.active()
    if rt is None or rt.size == 1:
        chk = _check_local(ops, spmd=False, **options)
        return _check_global(ops, chk, *chk.shapes, nprocs=1)
    chk = _runtime.agree(lambda: _check_local(ops, spmd=True, **options))
    gathered = rt.comm.allgather(chk.shapes)
    assert chk.distributions is not None

    def infer() -> tuple[tuple[int, int], ...]:
        out = []
        for i, (name, dist) in enumerate(zip(("a", "b", "c"), chk.distributions + (chk.distributions[2],))):
            locals_ = [g[i] for g in gathered]
            if name == "c" and locals_[0] is None:
                out.append(None)
                continue
            try:
                out.append(dist.global_shape(locals_))
            except DistributionError as e:
                raise DistributionError(f"{name}: {e}") from None
        return tuple(out)  # type: ignore[return-value]

    a_shape, b_shape, c_shape = infer()
    return _check_global(ops, chk, a_shape, b_shape, c_shape, nprocs=rt.size)


# --------------------------------------------------------------------------- #
# the plan object and the function
# --------------------------------------------------------------------------- #
class Matmul:
    """A distributed product planned once and executed many times.

    Takes the arguments of :func:`matmul`. ``plan()`` picks the backend's
    algorithm and compiles; ``execute()`` plans if needed and returns the
    result; ``reset_operands()`` swaps in new arrays of the same shapes,
    dtypes and distributions; ``free()`` releases the plan (use after it
    raises :class:`dmatmul.PlanFreedError`). A context manager frees on exit.

    >>> import numpy as np, dmatmul as dm                    # doctest: +SKIP
    >>> with dm.Matmul(np.ones((8, 4)), np.ones((4, 6))) as mm:  # doctest: +SKIP
    ...     d = mm.execute()
    """

    def __init__(
        self,
        a: Any,
        b: Any,
        c: Any = None,
        *,
        distribution: Any = None,
        alpha: complex = 1.0,
        beta: complex = 0.0,
        transpose_a: bool = False,
        transpose_b: bool = False,
        epilog: str | None = None,
        bias: Any = None,
        backend: str = "auto",
        algorithm: str = "auto",
        devices: Any = None,
    ) -> None:
        self._operands = Operands(a, b, c, bias)
        self._options = dict(
            distribution=distribution,
            transpose_a=transpose_a,
            transpose_b=transpose_b,
            epilog=epilog,
            backend=backend,
            algorithm=algorithm,
            devices=devices,
        )
        self._spec = _validate(self._operands, alpha=alpha, beta=beta, **self._options)
        self._backend = _backends.resolve(backend, self._spec)
        self._plan: _backends.BackendPlan | None = None
        self._freed = False

    # -- lifecycle ----------------------------------------------------------
    def _live(self, what: str) -> None:
        if self._freed:
            raise PlanFreedError(f"Matmul.{what}() on a freed plan: create a new dmatmul.Matmul")

    def plan(self) -> None:
        """Choose the algorithm and compile (done by execute() when needed)."""
        self._live("plan")
        if self._plan is None:
            self._plan = self._backend.plan(self._spec, self._operands)

    def execute(self) -> Any:
        """Run the product on the current operands and return the result."""
        self._live("execute")
        self.plan()
        assert self._plan is not None
        return self._plan.execute(self._operands)

    def reset_operands(
        self,
        a: Any = None,
        b: Any = None,
        c: Any = None,
        *,
        bias: Any = None,
        alpha: complex | None = None,
        beta: complex | None = None,
    ) -> None:
        """Replace operands (same shapes, dtypes, families and distributions) or scalars."""
        self._live("reset_operands")
        new = dataclasses.replace(self._operands)
        for name, value in (("a", a), ("b", b), ("c", c), ("bias", bias)):
            if value is None:
                continue
            old = getattr(self._operands, name)
            if old is None:
                raise ValueError(f"reset_operands: {name} was not given when the plan was made; make a new Matmul")
            if family(value) == "other":
                value = np.asarray(value)
            got = (tuple(value.shape), np.dtype(value.dtype).name, family(value))
            want = (tuple(old.shape), np.dtype(old.dtype).name, family(old))
            if got != want:
                raise ValueError(
                    f"reset_operands: {name} must match the planned (shape, dtype, family) {want}, got {got}"
                )
            setattr(new, name, value)
        spec = self._spec
        if alpha is not None or beta is not None:
            spec = dataclasses.replace(
                spec,
                alpha=spec.alpha if alpha is None else _scalar(alpha, "alpha", spec.dtype),
                beta=spec.beta if beta is None else _scalar(beta, "beta", spec.dtype),
            )
            spec = dataclasses.replace(spec, use_c=new.c is not None and spec.beta != 0)
        self._operands = new
        if spec != self._spec:
            if self._plan is not None:
                self._plan.free()
            self._spec, self._plan = spec, None  # scalars are compiled in: re-plan

    def free(self) -> None:
        """Release the plan's resources. Idempotent."""
        if self._plan is not None:
            self._plan.free()
        self._plan = None
        self._freed = True

    def __enter__(self) -> Matmul:
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()

    # -- introspection --------------------------------------------------------
    @property
    def algorithm(self) -> str:
        """The algorithm chosen (plans if needed): one of ``dmatmul.ALGORITHMS``."""
        self.plan()
        assert self._plan is not None
        return self._plan.algorithm

    def explain(self) -> str:
        """A human-readable account: backend, algorithm, distributions, modelled
        bytes moved per rank, the lower bound, and the predicted time."""
        self.plan()
        assert self._plan is not None
        s = self._spec
        head = [
            f"dmatmul.Matmul: D[{s.m}x{s.n}] = op(A)[{s.m}x{s.k}] @ op(B)[{s.k}x{s.n}], {s.dtype}, "
            f"transpose_a={s.transpose_a}, transpose_b={s.transpose_b}",
            f"  backend:    {self._backend.name}",
            f"  algorithm:  {self._plan.algorithm}",
        ]
        return "\n".join(head + ["  " + line for line in self._plan.explain()])

    def __repr__(self) -> str:
        state = "freed" if self._freed else ("planned" if self._plan is not None else "unplanned")
        return f"<dmatmul.Matmul {self._spec.m}x{self._spec.n}x{self._spec.k} {self._spec.dtype} {state}>"


def matmul(
    a: Any,
    b: Any,
    c: Any = None,
    *,
    distribution: Any = None,
    alpha: complex = 1.0,
    beta: complex = 0.0,
    transpose_a: bool = False,
    transpose_b: bool = False,
    epilog: str | None = None,
    bias: Any = None,
    backend: str = "auto",
    algorithm: str = "auto",
    devices: Any = None,
) -> Any:
    """``epilog(alpha * op(a) @ op(b) + beta * c [+ bias])``, distributed.

    Args:
        a, b: the stored matrices (global in one process; this rank's blocks
            under mpirun). numpy in gives numpy out; ``jax.Array`` in gives
            ``jax.Array`` out.
        c: optional, with the result's shape and distribution; read only when
            ``beta != 0`` (BLAS convention). Never modified.
        distribution: a Distribution for all three, or ``(dist_a, dist_b,
            dist_result)``; describes the *stored* ``a`` and ``b``. Optional in
            one process (the cost model picks), required under mpirun.
        alpha, beta: scalars. transpose_a, transpose_b: ``op(x) = x.T``.
        epilog: None, "relu", "gelu" (tanh approximation, as cuBLASLt),
            "bias", "relu_bias", "gelu_bias"; ``bias`` is a length-M vector
            added to every column.
        backend: "auto", "jax" or "nvmath". algorithm: "auto" or one of
            ``dmatmul.ALGORITHMS``. devices: an int N (the first N devices)
            or a list of JAX devices (one process).

    Plans are cached per problem (shapes, dtype, distributions, options),
    so repeated calls compile once.
    """
    with Matmul(
        a,
        b,
        c,
        distribution=distribution,
        alpha=alpha,
        beta=beta,
        transpose_a=transpose_a,
        transpose_b=transpose_b,
        epilog=epilog,
        bias=bias,
        backend=backend,
        algorithm=algorithm,
        devices=devices,
    ) as mm:
        return mm.execute()
