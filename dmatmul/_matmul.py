"""The backend-neutral front end: :func:`matmul` over the :class:`Matmul` plan.

``D = epilog(alpha * op(A) @ op(B) + beta * C [+ bias])`` with ``op(X)`` = X
or X.T. ``a`` and ``b`` are the *stored* matrices: with ``transpose_a=True``
the stored ``a`` is ``(K, M)`` and its distribution describes that stored
matrix. In one process operands are global matrices; under a multi-process
launch they are this rank's local blocks.

The options are one validated value (:class:`dmatmul._options.Options`);
the checks of a call (``_options.validate``) run before any backend is
touched, so every mistake is a ``TypeError``/``ValueError`` that names the
operand, what was expected and what was given.
"""

from __future__ import annotations

import contextvars
import dataclasses
import enum
import functools
import hashlib
import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from . import _autotune, _cost, _memory, _mxfp8, _plan, _runtime
from . import backends as _backends
from ._distribution import Distribution
from ._batched import route as _route
from ._epilogue import EPILOGS, Epilog, EpilogName
from ._errors import PlanFreedError
from ._plans import PLANS, Borrowed
from ._options import _DOCS, _OPERAND_NAMES, MatmulOptions, byte_swapped, check_reset
from ._options import _held, _shapes
from ._options import validate as _validate
from ._problem import Spec
from ._recent import RECENT as _RECENT
from ._relay import RelayProduct, as_given, check_mesh, needs_relay
from ._sharded import Sharded
from ._spec import (
    DTYPES,
    AlgorithmName,
    BackendName,
    Operands,
    PrecisionName,
    in_trace,
    refuse_trace_under_mpi,
    refuse_unusable,
)

if TYPE_CHECKING:
    import jax
    from typing_extensions import Unpack

__all__ = ["matmul", "Matmul", "MatmulOptions", "plan_of", "EPILOGS", "DTYPES"]


def _passed_over(backend: str, chosen: str) -> tuple[tuple[str, str], ...]:
    """The backends ``backend="auto"`` preferred to ``chosen`` but passed over
    for this run's ranks, and why (:func:`dmatmul.backends.passed_over`)."""
    if backend != "auto":
        return ()
    names = [row.name for row in _backends.TABLE]
    earlier = names[:names.index(chosen)] if chosen in names else names
    return tuple((name, why) for name in earlier if (why := _backends.passed_over(name)) is not None)


# --------------------------------------------------------------------------- #
# the plan object and the function
# --------------------------------------------------------------------------- #
def plan_of(mm: Matmul) -> _backends.BackendPlan:
    """The backend plan a Matmul holds (planned now if needed), for dmatmul's own
    tools (``dmatmul bench``): its ``cost``, and whatever the backend adds."""
    mm.plan()
    assert mm._plan is not None
    return mm._plan.backend_plan if isinstance(mm._plan, Borrowed) else mm._plan



class Matmul:
    """A distributed product planned once and executed many times.

    {semantics}

    ``plan()`` picks the backend's algorithm and compiles; ``execute()`` plans
    if needed and returns the result; ``reset_operands()`` swaps in new arrays
    of the same shapes, dtypes and distributions; ``free()`` releases the plan
    (using the object after ``free()`` raises :class:`dmatmul.PlanFreedError`).
    A context manager frees on exit.

    Args:
        {operands}
        {options}

    >>> import numpy as np, dmatmul as dm                    # doctest: +SKIP
    >>> with dm.Matmul(np.ones((8, 4)), np.ones((4, 6))) as mm:  # doctest: +SKIP
    ...     d = mm.execute()
    """

    @_runtime.agreed_arguments("dmatmul.Matmul")
    def __init__(
        self,
        a: Any,
        b: Any,
        c: Any = None,
        *,
        distribution: Distribution | Sequence[Distribution] | None = None,
        alpha: complex = 1.0,
        beta: complex = 0.0,
        transpose_a: bool = False,
        transpose_b: bool = False,
        epilog: EpilogName | Epilog | None = None,
        bias: Any = None,
        backend: BackendName = "auto",
        algorithm: AlgorithmName = "auto",
        precision: PrecisionName | enum.Enum | None = None,
        devices: int | Sequence[Any] | None = None,
        quantization_scales: dict[str, Any] | None = None,
        result_type: Any = None,
    ) -> None:
        self._operands = Operands(a, b, c, bias)
        swapped = byte_swapped(a=a, b=b, c=c, bias=bias)  # (validation puts native-order copies in their place)
        self._spec, runs_on = _validate(
            self._operands, _MAKER.get(), distribution=distribution, alpha=alpha, beta=beta, transpose_a=transpose_a,
            transpose_b=transpose_b, epilog=epilog, backend=backend, algorithm=algorithm, precision=precision,
            devices=devices, quantization_scales=quantization_scales, result_type=result_type,
        )
        self._runtime_of = _runtime.finalizations()  # the runtime the plan is made on (several processes)
        # several processes: the backend every rank agreed it finds (resolved once, inside the agreement)
        self._runs_on: Any = _backends.resolve(backend, self._spec) if runs_on is None else _backends.get(runs_on)
        if self._spec.spmd:
            # every rank is here (it just agreed on the call): the backend's process group starts now, not
            # in the first plan, which one rank may make alone (mm.explain()) while the others are not in
            # the start's collectives
            _runtime.ensure(self._runs_on.name)
        # what backend="auto" passed over on its way to this backend (ranks that would share a GPU), for explain()
        self._passed_over = _passed_over(backend, self._runs_on.name)
        self._given_dists = as_given(distribution)  # (a Sharded's mesh, where its 2-D form stands in the spec)
        self._backend = self._routed()
        if not self._backend.takes_block_scales:  # MXFP8 emulated: dequantized here, once
            _mxfp8.release(self._operands)
        self._plan: _backends.BackendPlan | None = None
        self._agreed = False  # several processes: every rank has made this spec's plan and agreed on it
        self._fits: Spec | None = None  # the spec judged to fit in memory (:meth:`_planned`)
        self._freed = False
        self._told: tuple[str, str] | None = None  # (algorithm, explain()) of a freed plan
        self._hold(self._operands, swapped)

    def _routed(self) -> Any:
        """The backend that plans the current spec: the product's, or (where A and
        B are not read: an empty product, alpha == 0) :class:`EmptyProduct`, the one
        place that computes ``epilog(beta*C [+ bias])``. No backend is given alpha == 0
        (cuBLASMp's quick return for it leaves a vector result unwritten)."""
        if needs_relay(self._spec, self._runs_on):  # layouts the backend does not take as they are: re-laid
            routed: Any = RelayProduct(self._runs_on)  # around a 2-D plan
        else:
            routed = _route(self._runs_on, self._spec)  # (a batch: _batched.BatchedProduct)
        if not self._spec.spmd and any(isinstance(d, Sharded) for d in self._given_dists):
            # each Sharded spans the devices in use: checked here, at every call, as a Sharded whose 2-D form
            # stands in the spec (Slab.X) keeps its mesh only as given (under mpiexec: in validate)
            ranks = routed.ranks(self._spec, self._operands)
            check_mesh(self._given_dists, ranks, f"{ranks} device{'s' if ranks > 1 else ''} in use",
                       ", or devices= that many")
        return routed

    def _hold(self, ops: Operands, swapped: dict[str, np.ndarray]) -> None:
        """Take ``ops`` (validated: native byte order) as the plan's operands;
        ``swapped``: the caller's byte-swapped arrays among them, whose copies
        :meth:`_execute` refreshes, so that values changed in place are seen
        as they are for any other numpy operand."""
        self._operands, self._swapped = ops, swapped
        # execute()'s shortcut (plan, operands, call), made by a one-process execute() on these operands
        self._fast: tuple[Any, Operands, Callable[[Operands], Any]] | None = None
        given = dataclasses.replace(ops, **swapped) if swapped else ops  # the arrays the caller holds
        self._given = _shapes(given)
        self._held = _held(given)

    # -- lifecycle ----------------------------------------------------------
    def _live(self, what: str) -> None:
        if self._freed:
            raise PlanFreedError(f"Matmul.{what}() on a freed plan: create a new dmatmul.Matmul")

    @_runtime.agreed_arguments("Matmul.plan")
    def plan(self) -> None:
        """Choose the algorithm and compile (done by execute() when needed).
        Under several processes every rank calls it: making an nvmath plan runs
        collectives. As for :meth:`execute`, a plan freed or an operand deleted
        on one rank raises on every rank."""
        rt = _runtime.active()
        if rt is None or rt.size == 1:
            self._live("plan")
            self._planned()
        else:
            self._agree_on_the_plan("Matmul.plan", lambda: self._ready("plan"))

    def _planned(self, to_run: bool = True) -> _backends.BackendPlan:
        """The backend plan, made now where there is none yet. ``to_run``: the
        plan is made to run (not only told by explain()), so the product must
        first fit in memory (once per spec; under several processes this runs
        inside the agreement before the product's collectives, so a rank that
        cannot fit raises on every rank)."""
        if to_run and self._fits is not self._spec:
            rt = _runtime.active() if self._spec.spmd else None
            fit = functools.partial(_memory.check_product, self._backend, self._spec, self._operands)
            if rt is not None and self._plan is None and self._backend.plans_collectively:
                _runtime.agree(fit, "dmatmul (memory)")  # every rank's verdict before the plan's collectives
            else:
                fit()
            self._fits = self._spec
        if self._plan is None:
            self._plan = PLANS.borrow(self._backend, self._spec, self._operands)
        return self._plan

    def _agree_on_the_plan(self, what: str, check: Callable[[], None] | None = None) -> None:
        """Several processes, before the product's collectives: ``check()`` and
        the plan made (where it is not yet) on every rank, and each rank's choice
        compared, in one small allgather (two where the plan is made now: every
        rank passes ``check()`` first). A rank that cannot plan, or that chose
        another plan (each reads its own cost model: ``dmatmul bench
        --calibrate``), raises on every rank; so do ranks that run different
        plans (one rank's ``mm2.execute()`` against the others' ``mm.execute()``),
        before either plan's collectives (where their products differ, one more
        allgather names the field)."""

        rt = _runtime.active()
        assert rt is not None
        # the plan may be made next, and making it may run collectives of its own (nvmath's): a rank that
        # fails check() must not skip them while the others wait in them. Whether to agree first is read
        # off what every rank did alike (not off self._plan: one rank's explain() may have made a plan that
        # runs no collective, the JAX backend's); ranks that differ on it run different plans, and are told
        # so in the first allgather, which each rank makes
        first = check is not None and not self._agreed
        digest = _digest(self._spec, self._backend.name)

        def ready() -> _backends.BackendPlan | None:
            if check is not None:
                check()
            return None if first else self._planned()

        _, shared = _runtime.agree_and_share(
            ready, lambda plan: (digest, first, None if plan is None else _chosen(plan)), what
        )
        if len({d for d, _, _ in shared}) > 1:  # (every rank sees it: each makes this allgather, to name the field)
            _, products = _runtime.agree_and_share(lambda: None, lambda _: _product(self._spec, self._backend.name),
                                                   what)
            _runtime.require_same_call(products, what, hint="every rank must run the same plan", verbs=("has", "have"))
        message = _runtime.disagreement(["a new plan" if f else "a plan made before" for _, f, _ in shared],
                                        "the plan", verbs=("runs", "run"))
        if message is not None:  # (of one product: another Matmul of it, made on some ranks only)
            raise ValueError(f"{what}: {message} (this is rank {rt.rank}): every rank must run the same Matmul")
        chosen = [c for _, _, c in shared]
        if first:
            _, chosen = _runtime.agree_and_share(self._planned, _chosen, what)
        for i, field in enumerate(("the algorithm", "the plan")):
            message = _runtime.disagreement([c[i] for c in chosen], field, verbs=("chose", "chose"))
            if message is not None:
                self._plan, stale = None, self._plan
                if stale is not None:
                    stale.free()
                raise ValueError(
                    f"{what}: {message} (this is rank {rt.rank}): each rank planned with its own cost model "
                    f"(${_cost.MODEL_ENV}, else its machine's calibration file {_cost.calibration_path()}); give "
                    f"every rank the same one (one shared file, or {_cost.MODEL_ENV}=default), or name the algorithm"
                )
        self._agreed = True

    @_runtime.agreed_arguments("Matmul.execute")
    def execute(self) -> Any:
        """Run the product on the current operands and return the result.

        Under several processes every rank calls it: a plan freed, an operand
        deleted, or a plan that cannot be made or differs (each rank's own cost
        model), on one rank raises on every rank (one small allgather before the
        product's collectives; two at a Matmul's first ``plan()`` or
        ``execute()``, which makes the plan)."""
        fast = self._fast
        if fast is not None and fast[0] is self._plan and fast[1] is self._operands:
            d = fast[2](fast[1])  # the same operands on the same plan again, in one process: no checks to repeat
            if d is not None:
                return d
        rt = _runtime.active()
        one = rt is None or rt.size == 1
        if one:
            self._ready()
        else:
            self._agree_on_the_plan("Matmul.execute", self._ready)
        d = self._execute()
        if one and not self._swapped and self._plan is not None:
            run = self._plan.repeat(self._operands)
            self._fast = None if run is None else (self._plan, self._operands, run)
        return d

    @_runtime.agreed_arguments("Matmul.autotune")
    def autotune(self, iterations: int = 3, candidates: int = 4) -> None:
        """Time the ``candidates`` routes the cost model prices cheapest (one per
        algorithm and schedule, its own pick among them) on the current
        operands, ``iterations`` rounds each after one untimed run, and keep the
        fastest for every later :meth:`execute` (:mod:`dmatmul._autotune`;
        ``explain()`` lists the timings). Under several processes every rank
        calls it, and the slowest rank's times decide. The JAX backend only:
        cuBLASMp runs one algorithm per layout."""
        for name, value in (("iterations", iterations), ("candidates", candidates)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Matmul.autotune: {name} must be an int >= 1, got {value!r}")
        self.plan()
        assert self._plan is not None
        ops = self._operands
        model = self._plan.cost if self._backend.name == "jax" else None
        traced = in_trace(*(x for x in (ops.a, ops.b, ops.c, ops.bias) if x is not None))
        if not isinstance(model, _plan.Plan) or traced or self._backend is not self._runs_on:
            why = ("inside a JAX trace, where nothing runs to be timed" if traced else
                   f"the {self._backend.name} backend's plan of this product weighs no routes" if
                   self._backend is self._runs_on else "a batched, re-laid or empty product is not tuned")
            raise ValueError(f"Matmul.autotune: {why}; it tunes the JAX backend's products, run eagerly")
        self._plan, _ = _autotune.autotune(self._plan, self._backend, self._spec, ops, iterations, candidates)
        self._fast = None

    def _ready(self, what: str = "execute") -> None:
        """This rank can run (``what``: or plan) the product: the plan is live
        and no operand was deleted since it was given."""
        self._live(what)
        if self._spec.spmd:
            refuse_trace_under_mpi()
            self._refuse_finalized(what)
        ops = dataclasses.replace(self._operands, **self._swapped) if self._swapped else self._operands
        for name in _OPERAND_NAMES:
            x = getattr(ops, name)
            if x is not None:  # (None has nothing to refuse)
                refuse_unusable(x, name)
        for name, shape, dtype in self._held:  # the common case, cheaply: the very shape and dtype objects
            x = getattr(ops, name)
            if x.dtype is not dtype or type(x.shape) is not tuple or x.shape != shape:
                break
        else:
            return
        now = _shapes(ops)
        for name, given in self._given.items():
            if now[name] != given:  # a numpy array's shape or dtype set in place
                raise ValueError(
                    f"Matmul.{what}: {name} now has (shape, dtype) {now[name]}, but it was given as {given}: "
                    f"its shape or dtype was changed in place; pass a new array with reset_operands({name}=...)"
                )

    def _refuse_finalized(self, what: str) -> None:
        """Several processes: raise where this plan was made before dm.finalize()."""
        if self._runtime_of != _runtime.finalizations():
            raise RuntimeError(
                f"Matmul.{what}: this plan was made before dm.finalize(), which shut its process group down "
                "for good: call dm.finalize() once, at the end of the job"
            )

    def _execute(self) -> Any:
        for name, x in self._swapped.items():  # the caller's byte-swapped arrays, as they are now
            np.copyto(getattr(self._operands, name), x)
        return self._planned().execute(self._operands)

    @_runtime.agreed_arguments("Matmul.reset_operands")
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
        """Replace operands (same shapes, dtypes, families and distributions) or scalars.

        Under several processes every rank calls it (with its own blocks): a
        mistake on one rank raises on every rank, and ranks whose alpha or beta
        would differ raise, naming them, before any collective of a product."""

        def check() -> tuple[Operands, dict[str, np.ndarray], Spec]:
            self._live("reset_operands")
            return self._reset(a, b, c, bias, alpha, beta)

        rt = _runtime.active()
        if rt is None or rt.size == 1:
            new, swapped, spec = check()
        else:
            (new, swapped, spec), shared = _runtime.agree_and_share(
                check, lambda got: (("alpha", got[2].alpha), ("beta", got[2].beta)), "Matmul.reset_operands"
            )
            _runtime.require_same_call(shared, "Matmul.reset_operands")
        self._hold(new, swapped)
        if spec != self._spec:
            if self._plan is not None:
                self._told = self._told_now()  # what it was, should none follow
                self._plan.free()
            self._spec, self._plan, self._agreed = spec, None, False  # scalars are compiled in: re-plan
            self._backend = self._routed()  # (alpha == 0, or no longer)

    def _reset(
        self, a: Any, b: Any, c: Any, bias: Any, alpha: complex | None, beta: complex | None
    ) -> tuple[Operands, dict[str, np.ndarray], Spec]:
        """The operands, the byte-swapped arrays among them (see :meth:`_hold`)
        and the spec :meth:`reset_operands` makes (nothing changed yet)."""
        return check_reset(self._operands, self._swapped, self._spec, a, b, c, bias, alpha, beta)

    def free(self) -> None:
        """Release the plan's resources. Idempotent. ``algorithm`` and
        ``explain()`` still tell what the plan was (where it was made)."""
        if self._plan is not None:
            self._told = self._told_now()
        self._release()

    def _release(self) -> None:
        if self._plan is not None:
            self._plan.free()
        self._plan = None
        self._freed = True
        self._fast = None
        # nothing runs on them again: a Matmul kept after free() no longer keeps the caller's arrays alive
        self._operands, self._swapped = Operands(None, None), {}

    def __enter__(self) -> Matmul:
        if self._freed:  # (every rank frees alike: each raises)
            raise PlanFreedError("a with statement on a freed Matmul: create a new dmatmul.Matmul")
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()

    # -- introspection --------------------------------------------------------
    @property
    def algorithm(self) -> str:
        """The algorithm chosen (plans if needed): one of ``dmatmul.ALGORITHMS``.
        Under several processes one rank may ask alone (see :meth:`explain`)."""
        if self._freed:
            return self._what_was_planned("algorithm")[0]
        return self._account()[0]

    def explain(self) -> str:
        """A human-readable account: backend, algorithm, distributions, modelled
        bytes moved per rank, the lower bound, and the predicted time.

        Plans if needed, except where making the plan runs collectives (the
        nvmath backend under several processes): there, before ``plan()`` or
        the first ``execute()``, it tells from this rank's blocks alone what
        would be planned, so ``if rank == 0: print(mm.explain())`` never
        leaves one rank in a collective."""
        if self._freed:
            return self._what_was_planned("explain")[1]
        return self._account()[1]

    def _account(self) -> tuple[str, str]:
        """(algorithm, explain()) of the plan, made now where that runs no
        collective; else what the backend tells without one."""
        # (read off the spec, not the runtime: asking that after dm.finalize() starts it again, collectively)
        if self._plan is None and self._spec.spmd:
            if self._backend.plans_collectively:
                algorithm, lines = self._backend.preview(self._spec, self._operands)
                return algorithm, self._explanation(algorithm, lines)
            self._refuse_finalized("explain")  # (planning would start the process group again, collectively)
        self._planned(to_run=False)  # (it tells what a product too large for memory would run)
        return self._told_now()

    def _what_was_planned(self, what: str) -> tuple[str, str]:
        if self._told is None:
            raise PlanFreedError(f"Matmul.{what} on a plan freed before it was made: create a new dmatmul.Matmul")
        return self._told

    def _told_now(self) -> tuple[str, str]:
        """(algorithm, explain()) of the plan made: what a freed plan still tells."""
        assert self._plan is not None
        lines = self._plan.explain()
        tuned = getattr(self._plan, "tuning", None)  # (a plan autotune kept: _autotune.autotune)
        if tuned is not None:
            lines += tuned[0].explain(tuned[1])
        return self._plan.algorithm, self._explanation(self._plan.algorithm, lines)

    def _explanation(self, algorithm: str, lines: list[str]) -> str:
        s = self._spec
        head = [
            f"dmatmul.Matmul: D[{s.m}x{s.n}] = op(A)[{s.m}x{s.k}] @ op(B)[{s.k}x{s.n}], {s.dtype}, "
            f"transpose_a={s.transpose_a}, transpose_b={s.transpose_b}"
            + (f", precision={s.precision!r}" if s.precision is not None else ""),
            *([f"  fp8:        scales a={s.scales[0]!r} b={s.scales[1]!r}, applied once as alpha*sa*sb = "
               f"{s.scaled_alpha!r}; accumulated in float32, result {s.result_dtype}"] if s.fp8 else []),
            *([f"  {_mxfp8.explain_line(s.options.block_scaled, s.result_dtype, self._backend.name)}"]
              if s.options.block_scaled is not None else []),
            f"  backend:    {self._backend.name}",
            *(f"  {name + ':':11s} passed over: {why}" for name, why in self._passed_over),
            f"  algorithm:  {algorithm}",
        ]
        return "\n".join(head + ["  " + line for line in lines])

    def __repr__(self) -> str:
        state = "freed" if self._freed else ("planned" if self._plan is not None else "unplanned")
        return f"<dmatmul.Matmul {self._spec.m}x{self._spec.n}x{self._spec.k} {self._spec.dtype} {state}>"


def _product(spec: Spec, backend: str) -> tuple[tuple[str, Any], ...]:
    """What every rank's plan must agree on before it runs (each rank may hold
    another ``Matmul``): the product, as the call that made it had it."""
    return (
        ("the global shape of a", spec.a_shape),
        ("the global shape of b", spec.b_shape),
        ("dtype", spec.dtype),
        *spec.options.agreed(backend),
        ("whether c is read", spec.use_c),
    )


@functools.lru_cache(maxsize=64)
def _digest(spec: Spec, backend: str) -> str:
    """A short digest of :func:`_product`, compared on every execute (where ranks
    differ, they exchange the product itself to name the field)."""
    return hashlib.blake2b(repr(_product(spec, backend)).encode(), digest_size=8).hexdigest()


def _chosen(plan: _backends.BackendPlan) -> tuple[str, str]:
    """What every rank's plan of one product must agree on: its algorithm, and its
    kernel and moves (what the cost model chose)."""
    cost = plan.cost
    if cost is None:
        return plan.algorithm, ""
    kernel = cost.kernel
    moves = ", ".join(f"{m.operand}: {m.src} -> {m.dst}" for m in cost.moves)
    return plan.algorithm, f"roles a:{kernel.a} b:{kernel.b} result:{kernel.d}" + (f"; moves {moves}" if moves else "")


#: The call that makes a Matmul (:func:`matmul` makes one too), as ranks compare it: a rank in
#: ``dm.Matmul(...)`` and one in ``dm.matmul(...)`` must not take each other's calls for their own
#: (the one goes on to plan, which runs collectives on nvmath, the other to its next call)
_MAKER: contextvars.ContextVar[str] = contextvars.ContextVar("dmatmul_maker", default="dmatmul.Matmul")


@overload
def matmul(
    a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None, **options: Unpack[MatmulOptions]
) -> np.ndarray: ...
@overload
def matmul(a: jax.Array, b: Any, c: Any = None, **options: Unpack[MatmulOptions]) -> jax.Array: ...
@overload
def matmul(a: Any, b: jax.Array, c: Any = None, **options: Unpack[MatmulOptions]) -> jax.Array: ...
@overload
def matmul(a: Any, b: Any, c: Any = None, **options: Unpack[MatmulOptions]) -> Any: ...
@_runtime.agreed_arguments("dmatmul.matmul")
def matmul(a: Any, b: Any, c: Any = None, **options: Unpack[MatmulOptions]) -> Any:
    """``epilog(alpha * op(a) @ op(b) + beta * c [+ bias])``, distributed.

    {semantics}

    Args:
        {operands}
        {options}

    Plans are cached per problem (shapes, dtype, distributions, options),
    so repeated calls compile once; in one process, a call on jax.Arrays of
    the shapes, dtypes and shardings of a recent call, with the same options,
    also skips that call's argument checks. The keywords are those of
    :class:`Matmul`, which this function plans, runs and frees.
    """
    key = _RECENT.key(a, b, c, options)
    if key is not None:
        d = _RECENT.run(key, Operands(a, b, c, options.get("bias")))
        if d is not None:
            return d
    made_by = _MAKER.set("dmatmul.matmul")
    try:
        mm = Matmul(a, b, c, **options)
    finally:
        _MAKER.reset(made_by)
    try:
        if mm._spec.spmd:  # the operands were checked on every rank a moment ago; the plans are compared now
            mm._agree_on_the_plan("dmatmul.matmul")
        d = mm._execute()
        if key is not None and not mm._swapped and mm._plan is not None:
            _RECENT.keep(key, mm._plan, Operands(a, b, c, options.get("bias")))
        return d
    finally:
        mm._release()




Matmul.__doc__ = (Matmul.__doc__ or "").format(**_DOCS)
matmul.__doc__ = (matmul.__doc__ or "").format(**_DOCS)
# help(dm.matmul) and IDEs show Matmul's keywords (the one place they are written)
matmul.__signature__ = inspect.signature(Matmul.__init__).replace(  # type: ignore[attr-defined]
    parameters=list(inspect.signature(Matmul.__init__).parameters.values())[1:], return_annotation="Any"
)
