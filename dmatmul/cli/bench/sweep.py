"""``dmatmul bench --sweep``: where ``auto`` lands against the fastest route measured.

For every case of :func:`cases` (four shape families: square, tall-skinny,
short-wide and outer-product; 1-D, 2-D and mixed layouts of (a, b, result);
float32 and bfloat16) the sweep plans each *route* the planner could take
for the layout as given: a kernel of an algorithm registered in
:data:`dmatmul.algorithms.ALGORITHMS` (each schedule apart) with the moves
that bring the operands to its roles first, forced one at a time through
:func:`dmatmul._plan.schedule`. It times them interleaved on operands
already laid out (medians of ``reps``), checks each route's first result
against a float64 numpy reference (a wrong route is reported, never counted
as fastest), and reports per case the fastest measured, auto's route and its
time over the fastest's, and the model's predictions; the summary says in how
many cases auto is within 10% of the fastest. Auto's route is timed twice in
the same repetitions (its *twin*): the ratio of the two medians is how far
noise alone moves a route, and a miss by less than it is not the model's.

``routes="best"`` times, of each (algorithm, schedule), the route the model
prices cheapest (auto's own among them); ``"all"`` every kernel that plans.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..._autotune import label as _label
from .problem import TOL, as_dtype, parse_layout, rel_err
from .timing import Runner, time_interleaved

#: the shape families, (M, N, K) at scale 1: about 0.5-2 GFLOP each
SHAPES: dict[str, tuple[int, int, int]] = {
    "square": (1024, 1024, 1024),
    "tall": (8192, 256, 512),  # tall-skinny: many rows of a, few columns of the result
    "wide": (256, 8192, 512),  # short-wide
    "outer": (2048, 2048, 64),  # outer product: a thin inner dimension
}
#: layouts of (a, b, result) by kind (letters of :func:`.problem.parse_layout`; G: the squarest grid)
LAYOUTS: dict[str, tuple[str, ...]] = {
    "1-D": ("XYX", "YXY", "XXX", "YYY"),
    "2-D": ("GGG",),
    "mixed": ("GGX", "XYG", "GXG"),
}
DTYPES = ("float32", "bfloat16")
#: auto hits a case when its route's median is within this fraction of the fastest's
TOLERANCE = 0.10


@dataclasses.dataclass(frozen=True)
class Case:
    """One product of the sweep: a shape family's sizes, a layout and a dtype."""

    family: str
    m: int
    n: int
    k: int
    layout: str
    dtype: str

    @property
    def kind(self) -> str:
        """The layout's kind: "1-D", "2-D" or "mixed"."""
        return next(kind for kind, names in LAYOUTS.items() if self.layout in names)

    @property
    def name(self) -> str:
        return f"{self.family} {self.m}x{self.n}x{self.k} {self.layout} {self.dtype}"


def cases(scale: float = 1.0, p: int = 8) -> list[Case]:
    """Every case: each shape family (sizes times ``scale``, rounded to whole
    multiples of ``p`` so that no route pads) on each layout, in each dtype.

    >>> len(cases()), cases()[0].name
    (64, 'square 1024x1024x1024 XYX float32')
    >>> cases(0.5)[0].m
    512
    """
    whole = lambda x: max(p, int(round(x * scale / p)) * p)  # noqa: E731
    out = []
    for dtype in DTYPES:
        for family, (m, n, k) in SHAPES.items():
            for names in LAYOUTS.values():
                out += [Case(family, whole(m), whole(n), whole(k), layout, dtype) for layout in names]
    return out


@dataclasses.dataclass
class Route:
    """One way to run a case: a kernel forced, with the moves it needs first."""

    label: str  # "allgather/one_shot M,N->M"
    algorithm: str
    schedule: str
    moves: str  # the moves before and after the kernel, as explain() names them ("" for none)
    predicted_s: float
    times: list[float] = dataclasses.field(default_factory=list)
    max_rel_err: float | None = None
    note: str | None = None  # "MISMATCH: ..." where its result is wrong (never the fastest then)
    #: what the predicted time multiplies each constant of the model by (:func:`dmatmul._plan.time_terms`)
    terms: tuple[float, ...] = ()

    @property
    def median(self) -> float:
        return float(np.median(self.times)) if self.times else math.inf

    @property
    def ok(self) -> bool:
        return bool(self.times) and not (self.note or "").startswith("MISMATCH")


@dataclasses.dataclass
class CaseResult:
    """A case's routes, timed, and the one auto takes."""

    case: Case
    routes: list[Route]
    auto: str  # the label of auto's route
    #: auto's route timed a second time in the same repetitions: how far one route's median moves by noise alone
    twin: list[float] = dataclasses.field(default_factory=list)
    #: the label of the route ``Matmul.autotune()`` keeps (timed on its own, before the sweep times the routes)
    tuned: str | None = None

    def route(self, label: str) -> Route:
        return next(r for r in self.routes if r.label == label)

    @property
    def fastest(self) -> Route | None:
        """The route of least median time among those whose result is right."""
        good = [r for r in self.routes if r.ok]
        return min(good, key=lambda r: r.median) if good else None

    @property
    def ratio(self) -> float:
        """Auto's route's median over the fastest's (1.0: auto is the fastest; inf: auto's result is wrong)."""
        fastest, auto = self.fastest, self.route(self.auto)
        if fastest is None or not auto.ok:
            return math.inf
        return auto.median / fastest.median

    @property
    def noise(self) -> float:
        """The larger over the smaller median of auto's route and its twin (1.0: no noise seen; nan: no twin)."""
        auto = self.route(self.auto)
        if not self.twin or not auto.times:
            return math.nan
        pair = sorted((float(np.median(self.twin)), auto.median))
        return pair[1] / pair[0]

    def hit(self, tolerance: float = TOLERANCE) -> bool:
        return self.ratio <= 1.0 + tolerance

    @property
    def tuned_ratio(self) -> float:
        """The autotuned route's median over the fastest's (nan: not tuned)."""
        fastest = self.fastest
        if self.tuned is None or fastest is None:
            return math.nan
        tuned = self.route(self.tuned)
        return tuned.median / fastest.median if tuned.ok else math.inf

    @property
    def predicted_fastest(self) -> Route:
        return min(self.routes, key=lambda r: r.predicted_s)

    def to_json(self) -> dict[str, Any]:
        fastest = self.fastest
        return {
            **dataclasses.asdict(self.case), "kind": self.case.kind, "auto": self.auto,
            "fastest": fastest.label if fastest else None, "auto_over_fastest": self.ratio, "hit": self.hit(),
            "twin": self.twin, "noise": self.noise, "tuned": self.tuned, "tuned_over_fastest": self.tuned_ratio,
            "routes": [{**dataclasses.asdict(r), "median_s": r.median if r.times else None} for r in self.routes],
        }


def summary(results: Sequence[CaseResult], tolerance: float = TOLERANCE) -> dict[str, Any]:
    """How often auto is within ``tolerance`` of the fastest, overall and by
    shape family, layout kind and dtype: ``{"hits", "cases", "rate", "by"}``.

    >>> summary([])["rate"]
    0.0
    """
    def count(rs: Sequence[CaseResult]) -> dict[str, Any]:
        hits = sum(r.hit(tolerance) for r in rs)
        return {"hits": hits, "cases": len(rs), "rate": hits / len(rs) if rs else 0.0}

    by: dict[str, dict[str, Any]] = {}
    for attr in ("family", "kind", "dtype"):
        for value in dict.fromkeys(getattr(r.case, attr) for r in results):
            by[f"{attr}={value}"] = count([r for r in results if getattr(r.case, attr) == value])
    ratios = [r.ratio for r in results if math.isfinite(r.ratio)]
    beyond = [r for r in results if not r.hit(tolerance) and not r.ratio <= r.noise]  # (nan noise: beyond)
    tuned = [r.tuned_ratio for r in results if not math.isnan(r.tuned_ratio)]
    return {**count(results), "tolerance": tolerance, "by": by, "misses_beyond_noise": len(beyond),
            "geomean_ratio": float(np.exp(np.mean(np.log(ratios)))) if ratios else None,
            "tuned": {"hits": sum(t <= 1.0 + tolerance for t in tuned), "cases": len(tuned)}}


# --------------------------------------------------------------------------- #
# planning and timing (JAX)
# --------------------------------------------------------------------------- #
def _cost(mm: Any) -> Any:
    """The planner's :class:`dmatmul._plan.Plan` of a planned Matmul (the JAX backend always has one)."""
    from ..._matmul import plan_of

    cost = plan_of(mm).cost
    assert cost is not None
    return cost


def _planned(a: Any, b: Any, dists: Any, p: int, dtype: str, kernel: Any = None) -> Any:
    """A planned Matmul of ``a @ b`` on ``dists``: auto's choice, or ``kernel`` forced (None where it runs nowhere here)."""
    import contextlib

    import dmatmul as dm
    from ... import _plan
    from .peers import precision

    forced = _plan.schedule(kernel) if kernel is not None else contextlib.nullcontext()
    try:
        with forced:
            mm = dm.Matmul(a, b, distribution=dists, backend="jax", devices=p, precision=precision(dtype))
            mm.plan()
    except (ValueError, NotImplementedError):
        return None
    return mm


def tuned_route(case: Case, a: Any, b: Any, p: int, iterations: int = 5) -> str:
    """The label of the route ``Matmul.autotune(iterations)`` keeps for ``case`` (``a``, ``b``: laid out)."""
    import dmatmul as dm

    from .peers import precision

    with dm.Matmul(a, b, distribution=parse_layout(case.layout, p), backend="jax", devices=p,
                   precision=precision(case.dtype)) as mm:
        mm.autotune(iterations=iterations)
        return _label(_cost(mm).kernel)


def plan_routes(case: Case, a: Any, b: Any, p: int, routes: str = "best") -> tuple[dict[str, Any], str]:
    """The planned Matmul of each route to time, by label, and auto's route's label (``a``, ``b``: the
    operands, laid out)."""
    from ...algorithms import kernels

    dists = parse_layout(case.layout, p)
    auto = _planned(a, b, dists, p, case.dtype)
    if auto is None:
        raise ValueError(f"case {case.name}: auto plans nothing on {p} devices")
    auto_kernel = _cost(auto).kernel
    auto.free()
    planned: dict[str, Any] = {}
    for kernel in kernels():
        mm = _planned(a, b, dists, p, case.dtype, kernel)
        if mm is not None:
            planned[_label(kernel)] = mm
    keep = set(planned)
    if routes == "best":  # of each (algorithm, schedule), the route the model prices cheapest, and auto's
        best: dict[tuple[str, str], tuple[float, str]] = {}
        for label, mm in planned.items():
            cost = _cost(mm)
            key = (cost.algorithm, cost.kernel.schedule)
            best[key] = min(best.get(key, (math.inf, "")), (cost.time, label))
        keep = {label for _, label in best.values()} | {_label(auto_kernel)}
    for label in set(planned) - keep:
        planned.pop(label).free()
    return planned, _label(auto_kernel)


def operands(case: Case, p: int) -> tuple[Any, Any, np.ndarray]:
    """``a`` and ``b`` of ``case`` as jax.Arrays laid out as its layout says on ``p`` devices, and the float64
    reference of their product."""
    import jax

    from ..._matmul import plan_of

    rng = np.random.default_rng(case.m * 7 + case.n * 131 + case.k * 1009)
    a = as_dtype(rng.standard_normal((case.m, case.k), dtype=np.float32), case.dtype)
    b = as_dtype(rng.standard_normal((case.k, case.n), dtype=np.float32), case.dtype)
    probe = _planned(a, b, parse_layout(case.layout, p), p, case.dtype)
    if probe is None:
        raise ValueError(f"case {case.name}: auto plans nothing on {p} devices")
    plan: Any = plan_of(probe)  # the JAX backend's plan: where each operand lives
    ja, jb = jax.block_until_ready((jax.device_put(a, plan.sharding("a")), jax.device_put(b, plan.sharding("b"))))
    probe.free()
    return ja, jb, a.astype(np.float64) @ b.astype(np.float64)


def _route(label: str, mm: Any) -> Route:
    cost = _cost(mm)
    moves = "; ".join(m.describe() for m in cost.moves)
    return Route(label, cost.algorithm, cost.kernel.schedule, moves, float(cost.time), terms=tuple(cost.terms))


#: the runner name of auto's route timed again (:attr:`CaseResult.twin`)
TWIN = "auto's route, again"
Timer = Callable[..., tuple[dict[str, list[float]], dict[str, float]]]


def run_case(
    case: Case, p: int, *, reps: int, warmup: int, routes: str = "best", timer: Timer = time_interleaved,
    before: Callable[[], None] | None = None, on_step: Callable[[str], None] | None = None, tune: bool = False,
) -> CaseResult:
    """Plan, check and time every route of ``case`` on ``p`` devices (``timer``:
    :func:`.timing.time_interleaved`'s signature; its ``check`` sees each route's first result); with
    ``tune``, first the route ``Matmul.autotune()`` keeps (:func:`tuned_route`)."""
    from .timing import blocking

    a, b, want = operands(case, p)
    planned, auto = plan_routes(case, a, b, p, routes)
    tuned = tuned_route(case, a, b, p) if tune else None
    if tuned is not None and tuned not in planned:  # (a route "best" left out: timed with the others)
        from ...algorithms import kernels

        kernel = next(k for k in kernels() if _label(k) == tuned)
        planned[tuned] = _planned(a, b, parse_layout(case.layout, p), p, case.dtype, kernel)
    out = {label: _route(label, mm) for label, mm in planned.items()}
    tol = TOL.get(case.dtype, 1e-2)

    def check(label: str, got: Any) -> None:
        if label == TWIN:  # (the same plan as auto's route: checked as that)
            return
        err = rel_err(np.asarray(got), want)
        out[label].max_rel_err = err
        if not err <= tol:  # (a NaN too)
            out[label].note = f"MISMATCH: max rel err {err:.2e} > {tol:.0e}"

    runners: dict[str, Runner] = {label: blocking(mm.execute) for label, mm in planned.items()}
    runners[TWIN] = runners[auto]
    try:
        times, _ = timer(runners, reps, warmup, check=check, before=before, on_step=on_step)
    finally:
        for mm in planned.values():
            mm.free()
    times = dict(times)  # (not the timer's own)
    twin = list(times.pop(TWIN, []))
    for label, ts in times.items():
        out[label].times = list(ts)
    return CaseResult(case, list(out.values()), auto, twin, tuned)


# --------------------------------------------------------------------------- #
# report
# --------------------------------------------------------------------------- #
def format_case(result: CaseResult) -> str:
    """One line: the case, the fastest route and its time, auto's route, their ratio, the predictions."""
    fastest, auto = result.fastest, result.route(result.auto)
    pred = result.predicted_fastest
    mark = "" if result.hit() else "  MISS"
    bad = [r.label for r in result.routes if not r.ok and r.times]
    fast = f"{fastest.label:34s} {fastest.median * 1e3:7.1f}" if fastest else f"{'-':34s} {'-':>7s}"
    return (
        f"{result.case.name:44s} {fast} {auto.label:34s} {auto.median * 1e3:7.1f} {result.ratio:6.2f}"
        f" {auto.predicted_s * 1e3:7.1f} {(fastest.predicted_s * 1e3 if fastest else math.nan):7.1f}"
        f" {pred.predicted_s / pred.median if pred.times else math.nan:5.2f} {result.noise:5.2f}{mark}"
        + (f"  wrong: {', '.join(bad)}" if bad else "")
        + (f"  autotuned: {result.tuned} {result.tuned_ratio:.2f}" if result.tuned is not None else "")
    )


HEADER = (
    f"{'case':44s} {'fastest measured':34s} {'ms':>7s} {'auto ran':34s} {'ms':>7s} {'/fast':>6s}"
    f" {'pred ms':>7s} {'pred fast':>7s} {'p/m':>5s} {'noise':>5s}"
)


def format_summary(results: Sequence[CaseResult], tolerance: float = TOLERANCE) -> str:
    """The summary lines: the hit rate overall and by family, layout kind and dtype, and the misses."""
    s = summary(results, tolerance)
    lines = [
        f"auto within {tolerance:.0%} of the fastest route measured: {s['hits']}/{s['cases']} cases "
        f"({s['rate']:.0%}); geometric mean of auto/fastest {s['geomean_ratio'] or math.nan:.3f}",
        "  " + "; ".join(f"{key} {v['hits']}/{v['cases']}" for key, v in s["by"].items()),
    ]
    lines.append(f"  misses by more than the noise (auto's route against its own twin): {s['misses_beyond_noise']}")
    if s["tuned"]["cases"]:
        t = s["tuned"]
        lines.append(f"after Matmul.autotune() (the model's 4 cheapest routes timed, the fastest kept): within "
                     f"{tolerance:.0%} of the fastest in {t['hits']}/{t['cases']} cases ({t['hits'] / t['cases']:.0%})")
    misses = [r for r in results if not r.hit(tolerance)]
    if misses:
        lines.append("misses (auto's route, the fastest, auto/fastest, noise):")
        lines += [f"  {r.case.name}: {r.auto} vs {r.fastest.label if r.fastest else '-'} {r.ratio:.2f} {r.noise:.2f}"
                  for r in misses]
    return "\n".join(lines)


# --------------------------------------------------------------------------- #
# the command
# --------------------------------------------------------------------------- #
def selected(args: Any) -> list[Case]:
    """The cases of ``--sweep-scale`` on ``max(--devices)`` whose name holds every word of ``--sweep-filter``."""
    words = (args.sweep_filter or "").split()
    return [c for c in cases(args.sweep_scale, max(args.devices)) if all(w in c.name for w in words)]


def run_sweep(args: Any) -> int:
    """``dmatmul bench --sweep``: every case in one process on ``max(--devices)`` simulated devices;
    returns 1 if any route's result was wrong."""
    import json
    import os

    from .devices import start_jax
    from .report import run_meta
    from .timing import IdleWaiter

    p = max(args.devices)
    start_jax(p)
    chosen = selected(args)
    meta = {**run_meta(args, "devices"), "sweep": {"scale": args.sweep_scale, "routes": args.sweep_routes,
                                                     "devices": p, "filter": args.sweep_filter}}
    print(f"dmatmul bench --sweep: {len(chosen)} cases on {p} devices, routes: {args.sweep_routes}, "
          f"{args.reps} interleaved repetitions after {args.warmup} warm-up (medians, ms)\n{HEADER}", flush=True)
    waiter = IdleWaiter(args.wait_idle) if args.wait_idle is not None else None
    results: list[CaseResult] = []
    for case in chosen:
        results.append(run_case(case, p, reps=args.reps, warmup=args.warmup, routes=args.sweep_routes,
                                before=waiter, tune=args.sweep_autotune))
        print(format_case(results[-1]), flush=True)
        if args.json:  # after every case: a long sweep stopped early keeps what it measured
            tmp = f"{args.json}.tmp"
            with open(tmp, "w") as f:
                json.dump({"meta": meta, "summary": summary(results), "cases": [r.to_json() for r in results]},
                          f, indent=1, default=float)
            os.replace(tmp, args.json)
    print("\n" + format_summary(results))
    if args.json:
        print(f"wrote {args.json}")
    return 1 if any(not r.ok for res in results for r in res.routes if r.times) else 0
