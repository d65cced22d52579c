"""Running one case on a backend and classifying its :class:`Outcome`:
``passed``, ``refused`` (an error the case expects: see
:meth:`~dmatmul.testing.Case.refusals`) or ``failed`` (wrong numbers, wrong
shape, dtype or array family of the result, a read-only numpy result, a
modified input, an unexpected exception of any kind, or no error where one
is required)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from .. import _plan, _runtime
from .._distribution import Distribution, split
from .._mxfp8 import BLOCK
from .._sharded import Sharded
from .._spec import BackendName, family
from .case import TUNE_REFUSALS, Case
from .compare import _reduced_precision_slack, _Result, _sharding_problems
from .operands import _global_operands, _snapshot, lay_out, random_scales
from .reference import error_ratio, finite_scale, reference, wide
from .transforms import _TransformData

__all__ = ["Outcome", "run_case", "combine"]


_ORDER = {"passed": 0, "refused": 1, "failed": 2}


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What became of one case (on one rank, or combined over the ranks)."""

    case: Case
    status: str  # "passed", "refused" or "failed"
    ratio: float = 0.0  # max error / tolerance (<= 1 passes); NaN when no result was compared
    message: str = ""
    backend: str = "jax"
    mpi: bool = False
    label: str = ""  # e.g. the case's index, for the report

    @property
    def layout_family(self) -> str:
        return self.case.layout_family

    def describe(self) -> str:
        return self.case.describe(self.backend, mpi=self.mpi)


def run_case(case: Case, *, backend: str = "jax", devices: Any = None, rng_seed: int = 0) -> Outcome:
    """Run ``case`` with ``dm.matmul`` (or ``dm.Matmul``) and classify the result.

    In one process the operands are global matrices on ``devices`` (default:
    the case's: its device list, or ``case.nranks``); under a multi-process run each rank passes its own
    blocks (``dm.split``) and checks its block of the result. The data comes
    from ``rng_seed`` (the same global matrices on every rank). Every result
    (each of a stateful case's) is checked against numpy, and a jax one in one
    process for its sharding; every input must be left as it was.
    """
    run = _Run(case, backend, devices, rng_seed)
    try:
        with run.x64, _plan.schedule(case.schedule), _default_matmul_precision(case.matmul_precision):
            results, told_wrong = run.execute()
    except Exception as e:  # noqa: BLE001 - every exception is classified
        if any(r.matches(e) for r in run.required + run.allowed):
            return run.outcome(status="refused", ratio=math.nan, message=f"{type(e).__name__}: {e}")
        why = f" (expected: {'; '.join(r.why for r in run.required)})" if run.required else ""
        return run.outcome(status="failed", ratio=math.nan, message=f"{type(e).__name__}: {e}{why}")
    return run.judge(results, told_wrong)


_GIVEN: Any = object()  # the case's own bias


class _Run:
    """One run of a case: its global operands and references, the operands as
    they are passed (this rank's blocks, their families, layouts and
    placements), the call, and the judgement of what it returned."""

    def __init__(self, case: Case, backend: str, devices: Any, rng_seed: int) -> None:
        rt = _runtime.active()
        self.case, self.backend, self.rt = case, backend, rt
        self.mpi = mpi = rt is not None and rt.size > 1
        self.outcome = functools.partial(Outcome, case=case, backend=backend, mpi=mpi)
        rng = np.random.default_rng(rng_seed)
        reset = case.reset
        final_beta = case.beta if reset is None or reset.beta is None else reset.beta
        self.ops = ops = _global_operands(rng, case, case.beta)  # the global numpy operands, passed as the case says
        new = _global_operands(rng, case, final_beta) if reset is not None else {}
        self.dists = dists = case.distributions
        # MXFP8: the global block scales of a and b (drawn after the operands: the data of the other cases stays)
        self.block_scales = _global_scales(rng, case, rt.size if mpi and rt is not None else 1)
        self.refs = [self._ref(ops, case.alpha, case.beta)]
        if reset is not None:
            after = {name: new[name] if name in reset.operands else ops[name] for name in ops}
            self.refs.append(self._ref(after, case.alpha if reset.alpha is None else reset.alpha, final_beta))
        self.dd = dd = dists[2] if dists is not None else None
        self.want_shape: tuple[int, ...] | None = case.result_shape
        if mpi:
            assert rt is not None and dists is not None and dd is not None  # distribution=None: not under mpiexec
            self.want_shape = _block_shape(dd, rt.rank, case.result_shape, rt.size)
        kwargs = self._place(devices)
        self.args = args = {name: self.passed(x, name) for name, x in ops.items()}
        self.news = {name: self.passed(new[name], name) for name in reset.operands} if reset is not None else {}
        self.inputs = list(args.items()) + [(f"new {name}", x) for name, x in self.news.items()]
        fp8_options = case.fp8_options
        if self.block_scales is not None:
            passed = {name: self.passed_scales(s, name) for name, s in zip("ab", self.block_scales)}
            fp8_options["quantization_scales"] = passed
            self.inputs += [(f"quantization_scales[{name!r}]", x) for name, x in passed.items()]
        self.transformed = None
        if case.transform is not None:  # its own inputs (a cotangent, tangents, the batched operand)
            self.transformed = _TransformData(case, rng, ops, self.refs[0], self.passed)
            self.inputs += [(f"{case.transform.describe()}: {name}", x)
                            for name, x in self.transformed.inputs.items()]
        self.before = [_snapshot(x) for _, x in self.inputs]
        self.required, self.allowed = case.refusals(backend)
        self.options = dict(distribution=case.distribution, alpha=case.alpha, beta=case.beta,
                            transpose_a=case.transpose_a, transpose_b=case.transpose_b, epilog=case.epilog,
                            bias=args["bias"],
                            backend=cast(BackendName, backend),  # a name of backends.NAMES, checked by matmul
                            algorithm=case.algorithm, precision=case.precision, **fp8_options, **kwargs)

    def _ref(self, o: dict[str, Any], alpha: complex, beta: complex) -> np.ndarray:
        case = self.case
        # FP8: the float64 product of the dequantized operands, sa*A and sb*B (alpha*sa*sb: the same, exactly);
        # MXFP8: each element of a and b times its block's 2**(s - 127)
        a, b = o["a"], o["b"]
        if self.block_scales is not None:
            (ka, kb), (sa, sb) = _k_axes(case), self.block_scales
            a, b = wide(a) * np.exp2(_per_element(sa, ka, a.shape[ka]) - 127.0), \
                wide(b) * np.exp2(_per_element(sb, kb, b.shape[kb]) - 127.0)
        return reference(a, b, o["c"], alpha=alpha * case.scaled, beta=beta, transpose_a=case.transpose_a,
                         transpose_b=case.transpose_b, epilog=case.epilog, bias=o["bias"])

    def _place(self, devices: Any) -> dict[str, Any]:
        """Where the product runs: ``self.on`` (a user's mesh), ``self.mesh``
        built, ``self.ranks`` (one process, jax: the ranks' devices),
        ``self.x64``; returns the ``devices=`` keyword (one process, no mesh)."""
        case = self.case
        self.on = on = None if self.mpi else case.on_mesh
        self.uses_jax = uses_jax = case.family == "jax" or (case.has_bias and case.bias_kind == "jax")
        self.x64: Any = contextlib.nullcontext()
        self.mesh: Any = None
        self.ranks: list[Any] = []
        kwargs: dict[str, Any] = {}
        if uses_jax:
            import jax

            if case.dtype in ("float64", "complex128"):  # as a user of 64-bit jax arrays runs
                self.x64 = jax.enable_x64(True)
            if on is not None:  # placed on the user's mesh, whose devices are then the ranks
                self.mesh = on.build(jax.devices())
                self.ranks = list(self.mesh.devices.flat)
        if not self.mpi and on is None:
            if case.device_ids is not None:
                import jax

                kwargs["devices"] = self.ranks = [jax.devices()[i] for i in case.device_ids]
            else:
                kwargs["devices"] = case.nranks if devices is None else devices
                if uses_jax:
                    import jax

                    self.ranks = list(devices) if isinstance(devices, Sequence) else jax.devices()[: kwargs["devices"]]
        return kwargs

    def passed(self, x: np.ndarray | None, name: str, batch_axis: int | None = None) -> Any:
        """Global ``x`` as operand ``name`` is passed: this rank's block, its family, its layout
        (a stack of them along ``batch_axis``: jax)."""
        if x is None:
            return None
        case, rt = self.case, self.rt
        if self.mpi and name != "bias":
            assert self.dists is not None and rt is not None
            x = _block(x, self.dists["abc".index(name)], rt.rank, rt.size)
        fam = case.bias_kind if name == "bias" else case.family_of(name)
        layout = case.layouts[("a", "b", "c", "bias").index(name)]
        if fam == "list":
            return x.tolist()
        if fam == "numpy":
            return lay_out(x, layout)
        import jax
        import jax.numpy as jnp

        with jax.enable_x64(x.dtype.name in ("float64", "complex128")):
            y = jnp.asarray(x)
        if self.mesh is not None and name != "bias":
            assert self.on is not None
            y = self.on.put(y, self.mesh, self.on.placements["abc".index(name)], batch_axis)
        return y

    def passed_scales(self, s: np.ndarray, name: str) -> Any:
        """MXFP8: the global block scales ``s`` of operand ``name`` (a or b) as they are passed: under
        mpiexec this rank's, of its block (:func:`_local_scales`); numpy, or the operand's family."""
        case, rt = self.case, self.rt
        if self.mpi:
            assert self.dists is not None and rt is not None
            k_axis = _k_axes(case)["ab".index(name)]
            s = _local_scales(s, k_axis, case.a_shape if name == "a" else case.b_shape, self.dists["ab".index(name)],
                              rt.rank, rt.size)
        if case.block_scales == "operands" and case.family_of(name) == "jax":
            import jax.numpy as jnp

            return jnp.asarray(s)
        return s

    def call(self, a: Any, b: Any, c: Any, bias: Any = _GIVEN) -> Any:
        """``dm.matmul`` with the case's options (its own bias unless another is given)."""
        from .. import matmul

        return matmul(a, b, c, **{**self.options, "bias": self.args["bias"] if bias is _GIVEN else bias})

    def execute(self) -> tuple[list[_Result], str | None]:
        """Run the product as the case says: its results, each with its
        reference, and what a rank told alone was wrong about (or None)."""
        case, on, mesh, refs = self.case, self.on, self.mesh, self.refs
        a, b, c = self.args["a"], self.args["b"], self.args["c"]
        if self.transformed is not None:
            return self.transformed.run(self.call, self.args, on, mesh), None
        if case.reset is not None:
            return self._stateful()
        if on is None and not case.jit:
            return [_Result("", self.call(a, b, c), refs[0])], None
        if on is not None and on.call == "eager":
            return [_Result("", self.call(a, b, c), refs[0])], None
        import jax

        # the jax operands the jit's arguments; numpy ones closed over (JAX would make them tracers)
        traced = {name: x for name, x in (("a", a), ("b", b), ("c", c)) if family(x) == "jax"}
        jitted = lambda ops: self.call(**{"a": a, "b": b, "c": c, **ops})  # noqa: E731
        if on is None:
            return [_Result("", jax.jit(jitted)(traced), refs[0])], None
        with jax.set_mesh(mesh) if on.call == "jit under set_mesh" else contextlib.nullcontext():
            d = jax.jit(lambda: self.call(a, b, c))() if on.call == "jit on constants" else jax.jit(jitted)(traced)
        return [_Result("", d, refs[0])], None

    def _stateful(self) -> tuple[list[_Result], str | None]:
        """The stateful form: ``with dm.Matmul(...) as mm``, execute twice, reset, execute."""
        from .. import Matmul

        reset, rt, refs = self.case.reset, self.rt, self.refs
        assert reset is not None
        told: tuple[str, str] | None = None  # mm.algorithm, mm.explain() read by one rank alone first (reset.told)
        told_wrong: str | None = None
        with Matmul(self.args["a"], self.args["b"], self.args["c"], **self.options) as mm:
            if self.mpi and rt is not None and rt.rank == reset.told:  # this rank alone; the others go on
                try:
                    told = (mm.algorithm, mm.explain())
                except Exception as e:  # noqa: BLE001 - a plan that cannot be made: execute() raises it
                    told = (f"{type(e).__name__}: {e}", "")
            if reset.plan:
                mm.plan()
            if reset.tune:
                try:
                    mm.autotune(iterations=1, candidates=2)
                except ValueError as e:  # (the refusal of a product with no routes to time; any other raises)
                    if not any(why in str(e) for why in TUNE_REFUSALS):
                        raise
            d1 = mm.execute()
            if told is not None and (told[0] != mm.algorithm or "algorithm:" not in told[1]):
                told_wrong = f"rank {reset.told} alone, before the plan: mm.algorithm {told[0]!r}, " \
                             f"mm.explain() {told[1][:200]!r}; the plan made: {mm.algorithm!r}"
            results = [_Result("execute()", d1, refs[0]), _Result("execute() again", mm.execute(), refs[0])]
            mm.reset_operands(**self.news, alpha=reset.alpha, beta=reset.beta)
            results.append(_Result(reset.call(list(self.news)) + "; execute()", mm.execute(), refs[1]))
            results.append(_Result("the first execute() after the reset", d1, refs[0]))
        return results, told_wrong

    def judge(self, results: list[_Result], told_wrong: str | None) -> Outcome:
        """The outcome of a run that raised nothing: every result checked."""
        case, required = self.case, self.required
        problems = [] if told_wrong is None else [told_wrong]
        if required:
            problems.append(f"no error, expected one: {'; '.join(r.why for r in required)}")
        changed = [name for (name, x), x0 in zip(self.inputs, self.before) if _snapshot(x) != x0]
        if changed:
            problems.append(f"input(s) modified: {', '.join(changed)}")
        slack = _reduced_precision_slack(case, self.backend)
        ratios: list[float] = []
        for r in results:
            problems += self._judge_one(r, slack, ratios)
        ratio = max(ratios) if ratios else math.nan
        if problems:
            return self.outcome(status="failed", ratio=ratio, message="; ".join(problems))
        return self.outcome(status="passed", ratio=ratio)

    def _judge_one(self, r: _Result, slack: float, ratios: list[float]) -> list[str]:
        """What is wrong with one result (its error ratio appended to ``ratios`` where read)."""
        case, rt, dd, mpi = self.case, self.rt, self.dd, self.mpi
        d = r.value
        said = f"{r.what}: " if r.what else ""
        dtype = r.dtype or case.result_dtype
        fam = family(d)
        if fam != case.family:
            shown = fam if fam != "other" else f"{type(d).__module__}.{type(d).__name__}"
            return [f"{said}result is {shown}, expected {case.family}"]
        problems = []
        if fam == "numpy" and not d.flags.writeable:
            problems.append(f"{said}numpy result is read-only")
        if self.mesh is not None and r.kind != "gradient" and getattr(d.sharding, "mesh", None) != self.mesh:
            problems.append(f"{said}result not on the operands' mesh: {d.sharding}")
        if np.dtype(d.dtype).name != dtype:
            problems.append(f"{said}result dtype {np.dtype(d.dtype).name}, expected {dtype}")
        shape = r.shape or self.want_shape
        if shape is None:
            return problems
        if tuple(d.shape) != tuple(shape):
            return problems + [f"{said}result shape {tuple(d.shape)}, expected {tuple(shape)}"]
        assert dd is not None or not mpi
        ref = r.ref
        want = _block(ref, dd, rt.rank, rt.size) if mpi and rt is not None and dd is not None else ref
        scale = finite_scale(ref)
        if r.kind == "gradient" and 0 in tuple(d.shape):
            # nothing to read: JAX's own zero-size cotangent of an operand split over a mesh holds the whole
            # shape on every device, and reading it fails (as jnp.zeros((32, 0), out_sharding=P(("x", "y"),
            # None)) does under jax.set_mesh); its shape and dtype are checked above
            return problems
        try:  # a jax.Array's computation may fail only when it is read
            host = np.asarray(d)
        except Exception as e:  # noqa: BLE001
            return problems + [f"{said}reading the result raised {type(e).__name__}: {e}"]
        tol = r.tolerance or dtype
        ratio = error_ratio(host, want, tol, scale) / slack
        ratios.append(math.inf if math.isnan(ratio) else ratio)  # NaN in the result
        if not ratios[-1] <= 1.0:
            problems.append(f"{said}max error {ratios[-1]:.3g} x the tolerance")
        elif fam == "jax" and not mpi and r.kind != "gradient":
            close = lambda x, y: error_ratio(x, y, tol, scale) <= slack  # noqa: E731
            lead = (r.kind == "batched") + len(case.batch_shape) if r.kind != "gradient" else 0
            problems += [said + p for p in _sharding_problems(d, case, ref, self.ranks, close, lead)]
        return problems


def _block(x: np.ndarray, d: Distribution, rank: int, p: int) -> np.ndarray:
    """Rank ``rank``'s block of the global ``x`` (of ``p`` ranks) as ``d`` lays it out: a
    distribution of as many dimensions as ``x`` (a Sharded's spec of the batch
    dimensions too) splits it whole; a matrix distribution the last two dimensions of
    every item (each rank holds the whole batch of its blocks). A grid or mesh of
    another size, or a Sharded of another number of dimensions, is refused: any block will do."""
    own = d.grid.size if d.grid is not None else d.mesh.size if isinstance(d, Sharded) else p
    rank %= own
    ndim = d.ndim if isinstance(d, Sharded) else 2
    if ndim == x.ndim:
        return split(x, d, nranks=own)[rank]
    if ndim != 2:
        return x
    rows, cols = d.global_indices(rank, x.shape[-2:], own)
    return x[..., rows[:, None], cols[None, :]]


def _k_axes(case: Case) -> tuple[int, int]:
    """The axes of K in the stored a and b."""
    return (-2 if case.transpose_a else -1), (-1 if case.transpose_b else -2)


def _per_element(s: np.ndarray, k_axis: int, k: int) -> np.ndarray:
    """Block scales ``s`` (one per 32 elements along ``k_axis``) repeated to each of the ``k`` elements."""
    return np.take(np.repeat(s, BLOCK, axis=k_axis), np.arange(k), axis=k_axis)


def _local_scales(s: np.ndarray, k_axis: int, shape: tuple[int, ...], d: Distribution, rank: int,
                  p: int) -> np.ndarray:
    """The block scales of rank ``rank``'s block of an operand of global ``shape`` and scales ``s``, counted
    from the block's first K element (the contract: each rank passes the scales of its own block): the
    operand's per-element scales split as the operand is (:func:`_block`), one read per 32 along K."""
    block = _block(_per_element(s, k_axis, shape[k_axis]), d, rank, p)
    return np.take(block, np.arange(0, block.shape[k_axis], BLOCK), axis=k_axis)


def _splits_on_blocks(s: np.ndarray, k_axis: int, shape: tuple[int, ...], d: Distribution, p: int) -> bool:
    """Whether every rank's block of the operand holds whole blocks of 32 along K (each of its local
    blocks of 32 is one global block's, or the end of one): its local scales then say what the global
    ones do."""
    full = _per_element(s, k_axis, shape[k_axis])
    for rank in range(p):
        local = _local_scales(s, k_axis, shape, d, rank, p)
        block = _block(full, d, rank, p)
        if not np.array_equal(_per_element(local, k_axis, block.shape[k_axis]), block):
            return False
    return True


def _global_scales(rng: np.random.Generator, case: Case, p: int) -> tuple[np.ndarray, np.ndarray] | None:
    """MXFP8: random global block scales of a and b (None: the case has none). Under mpiexec (``p`` ranks)
    an operand whose K is split off the 32-element blocks (a rank's K offset no multiple of 32, a
    block-cyclic K) gets scales that vary along its other dimension only: each rank's own then say the same
    values, counted from its block's first K element, as the contract has them."""
    if case.block_scales is None:
        return None
    out = []
    for shape, k_axis, scales_shape, d in zip((case.a_shape, case.b_shape), _k_axes(case), case.scale_shapes,
                                              case.distributions or (None, None)):
        s = random_scales(rng, scales_shape, case.scale_range)
        if p > 1 and d is not None and s.shape[k_axis] > 1 and not _splits_on_blocks(s, k_axis, shape, d, p):
            s = np.repeat(np.take(s, [0], axis=k_axis), s.shape[k_axis], axis=k_axis)
        out.append(s)
    return out[0], out[1]


def _block_shape(d: Distribution, rank: int, shape: tuple[int, ...], p: int) -> tuple[int, ...] | None:
    """The shape of rank ``rank``'s block of a result of ``shape`` (:func:`_block`), None where
    ``d`` is refused (its grid or mesh of another size, a Sharded of another number of dimensions)."""
    if (d.grid is not None and d.grid.size != p) or (isinstance(d, Sharded) and d.mesh.size != p):
        return None
    ndim = d.ndim if isinstance(d, Sharded) else 2
    if ndim == len(shape):
        return tuple(d.shape(rank, shape, p))
    if ndim != 2:
        return None
    return shape[:-2] + tuple(d.shape(rank, shape[-2:], p))


def _default_matmul_precision(name: str | None) -> contextlib.AbstractContextManager[Any]:
    """``jax.default_matmul_precision(name)``; nothing where ``name`` is None."""
    if name is None:
        return contextlib.nullcontext()
    import jax

    return jax.default_matmul_precision(name)


def combine(outcomes: Sequence[Outcome]) -> Outcome:
    """One outcome from every rank's: a failure on any rank is a failure, and
    ranks that disagree (one refused, another passed) fail."""
    statuses = {o.status for o in outcomes}
    ratios = [o.ratio for o in outcomes if not math.isnan(o.ratio)]
    ratio = max(ratios) if ratios else math.nan
    first = outcomes[0]
    if "failed" in statuses:
        bad = [r for r, o in enumerate(outcomes) if o.status == "failed"]
        msg = outcomes[bad[0]].message
        return dataclasses.replace(first, status="failed", ratio=ratio, message=f"on rank(s) {bad}: {msg}")
    if len(statuses) > 1:
        split_ = {s: [r for r, o in enumerate(outcomes) if o.status == s] for s in sorted(statuses)}
        msgs = "; ".join(o.message for o in outcomes if o.message)
        return dataclasses.replace(first, status="failed", ratio=ratio,
                                   message=f"ranks disagree: {split_}: {msgs}")
    return dataclasses.replace(first, ratio=ratio)
