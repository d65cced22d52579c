"""``dmatmul bench --sweep``: its cases, its runner's checks and its arithmetic (never of speed).

The runner is driven on tiny cases with injected timings: which route is
fastest, and auto's ratio to it, follow from the times given, and a route
whose result is wrong is caught against numpy and never counted fastest.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dmatmul.cli.bench import sweep
from dmatmul.cli.bench.problem import TOL
from dmatmul.cli.bench.sweep import Case, CaseResult, Route


def test_case_list_covers_the_issue():
    cs = sweep.cases()
    assert len(cs) >= 60 and len(set(cs)) == len(cs)
    assert {c.family for c in cs} == {"square", "tall", "wide", "outer"}
    assert {c.dtype for c in cs} == {"float32", "bfloat16"}
    assert {c.kind for c in cs} == {"1-D", "2-D", "mixed"}
    # every family in every layout kind and dtype
    combos = {(c.family, c.kind, c.dtype) for c in cs}
    assert len(combos) == 4 * 3 * 2
    for c in cs:
        assert c.m % 8 == c.n % 8 == c.k % 8 == 0  # no route pads on 8 devices (nor on the 2x4 grid)
        if c.family == "tall":
            assert c.m >= 8 * c.n
        if c.family == "wide":
            assert c.n >= 8 * c.m
        if c.family == "outer":
            assert c.k * 8 <= min(c.m, c.n)
    assert all(c.layout in sum(sweep.LAYOUTS.values(), ()) for c in cs)
    assert any("G" in c.layout and set(c.layout) != {"G"} for c in cs)  # mixed: grid and 1-D together
    # the scale multiplies the sizes (whole multiples of the devices)
    small = sweep.cases(0.5)
    assert [(c.m, c.n, c.k) for c in small][:1] == [(512, 512, 512)] and len(small) == len(cs)


def _route(label: str, times: list[float], pred: float = 1.0, note: str | None = None) -> Route:
    return Route(label, label.split("/")[0], "ring", "", pred, times, 0.0, note)


def _result(family: str, auto_time: float, best_time: float, dtype: str = "float32") -> CaseResult:
    case = Case(family, 8, 8, 8, "XYX", dtype)
    return CaseResult(case, [_route("allgather/ring", [auto_time] * 3), _route("local/ring", [best_time, 9.0, 0.1])],
                      "allgather/ring")


def test_hit_rate_arithmetic():
    results = [
        _result("square", 1.0, 2.0),  # auto is the fastest: ratio 1
        _result("tall", 1.10, 1.0),  # exactly 10% slower: a hit
        _result("wide", 1.12, 1.0),  # a miss
        _result("outer", 3.0, 1.0, "bfloat16"),  # a miss
    ]
    assert [r.ratio for r in results] == pytest.approx([1.0, 1.10, 1.12, 3.0])
    assert [r.hit() for r in results] == [True, True, False, False]
    s = sweep.summary(results)
    assert (s["hits"], s["cases"], s["rate"]) == (2, 4, 0.5)
    assert s["by"]["family=tall"] == {"hits": 1, "cases": 1, "rate": 1.0}
    assert s["by"]["dtype=float32"] == {"hits": 2, "cases": 3, "rate": pytest.approx(2 / 3)}
    assert s["by"]["kind=1-D"]["cases"] == 4
    assert s["geomean_ratio"] == pytest.approx((1.0 * 1.10 * 1.12 * 3.0) ** 0.25)
    assert sweep.summary(results, tolerance=0.2)["hits"] == 3
    assert s["misses_beyond_noise"] == 2 and math.isnan(results[2].noise)  # no twin timed: no noise known
    results[2].twin = [1.3] * 3  # auto's route again: 1.3 / 1.12, more than its miss
    results[3].twin = [3.3] * 3
    assert results[2].noise == pytest.approx(1.3 / 1.12) and results[3].noise == pytest.approx(1.1)
    assert sweep.summary(results)["misses_beyond_noise"] == 1
    text = sweep.format_summary(results)
    assert "2/4 cases (50%)" in text and "wide 8x8x8 XYX float32: allgather/ring vs local/ring 1.12" in text
    # a wrong route is never the fastest; auto's route wrong is a miss
    r = _result("square", 2.0, 1.0)
    r.routes[1].note = "MISMATCH: max rel err 1e+00 > 1e-04"
    assert r.fastest is r.routes[0] and r.ratio == 1.0
    r.routes[0].note = r.routes[1].note
    assert r.fastest is None and r.ratio == math.inf and not r.hit()


def _fake_timer(times_of):
    """A timer that runs each route once (its first call, checked) and reports ``times_of(labels)``."""
    def timer(runners, reps, warmup, *, check=None, **_):
        for label, run in runners.items():
            check(label, run())
        return times_of(list(runners)), {label: 0.0 for label in runners}
    return timer


def test_runner_checks_every_route_and_finds_the_fastest(monkeypatch):
    from dmatmul.backends.jax._kernels import bodies

    wrong = bodies.BODIES["allgather"]
    monkeypatch.setitem(bodies.BODIES, "allgather", lambda lp, a, b: wrong(lp, a, b) * 1.5)  # broken
    case = Case("square", 40, 48, 56, "GGX", "float32")  # a shape of its own: no plan cached from elsewhere
    injected = {}

    def times_of(labels):  # any order, made up: the allgather routes get the least (they must not win)
        rng = np.random.default_rng(0)
        for label in labels:
            injected[label] = [float(x) for x in rng.uniform(0.5, 2.0, 3)]
            if label.startswith("allgather"):
                injected[label] = [0.01] * 3
        return injected

    res = sweep.run_case(case, 8, reps=3, warmup=0, timer=_fake_timer(times_of))
    algorithms = {r.algorithm for r in res.routes}
    assert {"local", "allgather", "reduce_scatter", "allreduce", "summa"} <= algorithms  # every one that fits
    assert {r.schedule for r in res.routes} >= {"ring", "one_shot"}
    for r in res.routes:
        assert r.times == injected[r.label] and r.predicted_s > 0
        if r.algorithm == "allgather":
            assert r.note and r.note.startswith("MISMATCH") and not r.ok
        else:
            assert r.max_rel_err <= TOL["float32"] and r.ok
    good = {r.label: float(np.median(r.times)) for r in res.routes if r.algorithm != "allgather"}
    assert res.fastest.label == min(good, key=good.get)
    assert res.auto in {r.label for r in res.routes} and res.twin == injected[sweep.TWIN]
    auto = res.route(res.auto)
    assert res.ratio == (auto.median / res.fastest.median if auto.ok else math.inf)
    assert "wrong: allgather" in sweep.format_case(res)


def test_sweep_command_end_to_end(tmp_path, capsys):
    from dmatmul.cli import bench as _bench

    out = tmp_path / "s.json"
    argv = ["--sweep", "--sweep-scale", "0.03", "--sweep-filter", "outer XYX float32", "--devices", "8",
            "--reps", "2", "--warmup", "0", "--json", str(out)]
    assert _bench.main(argv) == 0
    text = capsys.readouterr().out
    assert "1 cases on 8 devices" in text and "auto within 10% of the fastest route measured:" in text
    doc = json.loads(out.read_text())
    assert doc["meta"]["sweep"]["devices"] == 8 and doc["summary"]["cases"] == 1
    (case,) = doc["cases"]
    assert case["family"] == "outer" and case["layout"] == "XYX" and case["kind"] == "1-D"
    labels = [r["label"] for r in case["routes"]]
    assert case["auto"] in labels and case["fastest"] in labels
    assert all(len(r["times"]) == 2 and r["max_rel_err"] <= TOL["float32"] for r in case["routes"])
    # a route that moves an operand first is among them (reduce_scatter takes a and b split along K)
    assert any(r["moves"] for r in case["routes"])


def test_sweep_options_only_with_sweep():
    from dmatmul.cli import bench as _bench

    with pytest.raises(SystemExit):
        _bench.main(["--sweep-scale", "2"])
    with pytest.raises(SystemExit):
        _bench.main(["--sweep", "--sweep-scale", "0"])


@pytest.mark.parametrize("layout", ["GGG", "GGX", "XYG", "GXG"])
@pytest.mark.parametrize("shape", [(1032, 1040, 1048), (264, 8200, 520)])  # (shapes no other test plans)
def test_auto_takes_the_route_its_own_costs_put_first(layout, shape, monkeypatch):
    """Planning alone (nothing compiled): auto's plan costs no more than any
    route forced, each costed as the JAX backend costs it (SUMMA at the
    traffic its kernel there has, as explain() reports it), on the constants
    this 2-core machine measured under load (where SUMMA's ring and one-shot
    schedules swap places between the planner's count and the kernel's)."""
    from dmatmul import _cost
    from dmatmul.algorithms import kernels
    from dmatmul.cli.bench.calibration import with_default_collectives
    from dmatmul.cli.bench.problem import parse_layout

    measured = with_default_collectives(_cost.MachineModel(alpha=4.69e-05, beta=7.98e-10, gamma=1.89e-10), "cpu", 8)
    monkeypatch.setattr(_cost, "model_for", lambda *args, **kw: measured)

    m, n, k = shape
    a, b = np.zeros((m, k), np.float32), np.zeros((k, n), np.float32)
    dists = parse_layout(layout, 8)
    auto = sweep._planned(a, b, dists, 8, "float32")
    best = sweep._cost(auto)
    auto.free()
    for kernel in kernels():
        mm = sweep._planned(a, b, dists, 8, "float32", kernel)
        if mm is None:
            continue
        assert best.time <= sweep._cost(mm).time * (1 + 1e-12), (sweep._label(kernel), best.kernel)
        mm.free()


def test_route_calibration_samples_every_route_with_the_terms_of_its_prediction(monkeypatch):
    """``dmatmul bench --calibrate`` fits the model to the planner's routes:
    each route timed gives its terms (what the predicted time multiplies each
    constant by: they give back the prediction exactly) and its median; a
    route whose result is wrong gives nothing. With those times made by a
    known model, the fit finds that model's constants again."""
    from dmatmul import _cost, _plan
    from dmatmul.backends.jax._kernels import bodies
    from dmatmul.cli.bench import calibration

    wrong = bodies.BODIES["allreduce"]
    monkeypatch.setitem(bodies.BODIES, "allreduce", lambda lp, a, b: wrong(lp, a, b) * 1.5)  # broken
    monkeypatch.setattr(calibration, "ROUTE_SHAPES", {"square": (40, 48, 56), "outer": (64, 72, 8)})
    monkeypatch.setattr(calibration, "ROUTE_LAYOUTS", ("XYX", "GGG", "GXG"))
    model = _cost.model_for("cpu", 8)
    truth = _cost.MachineModel(alpha=3e-4, beta=9e-10, gamma=5e-11, mem=4e-10, collective_alpha=2e-5,
                               collective_beta=1.1e-9, step_gamma=1.2e-11)
    seen: dict[str, float] = {}

    def timer(runners, reps, warmup, *, check=None, **_):
        for label, run in runners.items():
            check(label, run())
        rng = np.random.default_rng(len(seen))
        times = {label: [float(x) for x in rng.uniform(1e-3, 2e-3, 3)] for label in runners}
        for label, ts in times.items():
            seen[label] = float(np.median(ts))
        return times, {label: 0.0 for label in runners}

    results = []
    run_case = sweep.run_case
    monkeypatch.setattr(sweep, "run_case", lambda *a, **kw: results.append(run_case(*a, **kw)) or results[-1])
    samples = calibration.route_samples(8, reps=3, timer=timer, say=lambda _: None)
    assert len(results) == 6 and len(samples) >= 6 * 5
    for terms, seconds in samples:
        assert len(terms) == len(_plan.TERMS) and 1e-3 <= seconds <= 2e-3
    # every route's prediction is its terms times the model's constants (the summa re-cost included), and no
    # sample comes from the broken allreduce routes
    routes = [r for res in results for r in res.routes if r.ok]
    assert len(routes) == len(samples) and not any(r.algorithm == "allreduce" for r in routes)
    assert any(r.algorithm == "allreduce" for res in results for r in res.routes)
    for r in routes:
        assert sum(getattr(model, t) * v for t, v in zip(_plan.TERMS, r.terms)) == pytest.approx(r.predicted_s)
    # times made by a known model: the fit recovers the constants the routes exercise
    made = [(terms, sum(getattr(truth, t) * v for t, v in zip(_plan.TERMS, terms))) for terms, _ in samples]
    fitted, before, after = calibration.fit_routes(model, made)
    assert after < 1e-6 < before
    for name in _plan.TERMS:
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=1e-3), name


def test_the_autotuned_route_is_judged_as_auto_is(monkeypatch):
    """``--sweep-autotune``: each case's route that ``Matmul.autotune()`` keeps
    (here made the second route by delaying the model's pick) is named, its
    median over the fastest's is its ratio, and the summary counts its hits
    apart from auto's."""
    import time as _time

    from dmatmul import _autotune
    from dmatmul._plans import PLANS

    real = _autotune.tune

    def tune(routes, run, iterations, what="Matmul.autotune"):
        first = routes[0][0]
        return real(routes, lambda plan: run(plan) if plan.cost.kernel != first else (_time.sleep(0.02), run(plan))[1],
                    iterations, what)

    monkeypatch.setattr(_autotune, "tune", tune)
    case = Case("square", 40, 56, 48, "GGG", "float32")
    injected = {}

    def times_of(labels):
        for i, label in enumerate(sorted(labels)):
            injected[label] = [1.0 + 0.1 * i] * 3
        return injected

    try:
        res = sweep.run_case(case, 8, reps=3, warmup=0, timer=_fake_timer(times_of), tune=True)
    finally:
        PLANS.clear("jax")  # (what autotune kept for this product: no other test's)
    assert res.tuned in {r.label for r in res.routes} and res.tuned != res.auto
    fastest = min(float(np.median(ts)) for label, ts in injected.items() if label != sweep.TWIN)
    assert res.tuned_ratio == pytest.approx(float(np.median(injected[res.tuned])) / fastest)
    s = sweep.summary([res])
    assert s["tuned"] == {"hits": int(res.tuned_ratio <= 1.1), "cases": 1}
    assert "after Matmul.autotune()" in sweep.format_summary([res]) and f"autotuned: {res.tuned}" in sweep.format_case(res)
    assert sweep.summary([_result("wide", 1.0, 1.0)])["tuned"] == {"hits": 0, "cases": 0}  # not tuned: not counted
