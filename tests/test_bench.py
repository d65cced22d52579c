"""``dmatmul bench`` and the cost model: fast checks, never of speed.

The bench runs end to end on tiny sizes (its output is checked for form, not
for numbers); calibration is checked by fitting synthetic timings with known
constants; the lower bounds by their regimes.
"""

from __future__ import annotations

import argparse
import io
import json
import math

import pytest

from dmatmul import _cost
from dmatmul._cost import MachineModel


# --------------------------------------------------------------------------- #
# cost model: lower bounds
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize(
    "m, n, k, p, regime",
    [
        (4096, 64, 64, 8, "1-D"),  # p <= d1/d2 = 64
        (4096, 4096, 64, 8, "2-D"),  # d1/d2 = 1 < p <= d1*d2/d3^2 = 4096
        (1024, 1024, 1024, 8, "3-D"),  # square: 3-D for every p > 1
        (1024, 1024, 1024, 1, "none"),
    ],
)
def test_lower_bound_regimes(m, n, k, p, regime):
    assert _cost.lower_bound_regime(m, n, k, p) == regime
    # the bound is symmetric in the three dimensions
    assert _cost.lower_bound_words(m, n, k, p) == pytest.approx(_cost.lower_bound_words(k, m, n, p))


def test_lower_bound_formulas_per_regime():
    owned = lambda m, n, k, p: (m * n + m * k + n * k) / p  # noqa: E731
    m, n, k, p = 4096, 64, 64, 8
    assert _cost.lower_bound_words(m, n, k, p) == pytest.approx(n * k + (m * n + m * k) / p - owned(m, n, k, p))
    m, n, k, p = 4096, 4096, 64, 8
    assert _cost.lower_bound_words(m, n, k, p) == pytest.approx(
        2 * math.sqrt(m * n * k * k / p) + m * n / p - owned(m, n, k, p)
    )
    m = n = k = 1024
    assert _cost.lower_bound_words(m, n, k, 8) == pytest.approx(3 * (m * n * k / 8) ** (2 / 3) - owned(m, n, k, 8))
    assert _cost.lower_bound_words(m, n, k, 8) == pytest.approx(3 * m * m / 8)


@pytest.mark.parametrize("p", [2, 4, 8, 64])
def test_one_dimensional_algorithms_never_beat_the_bound(p):
    n = 2048
    lb = _cost.lower_bounds(n, n, n, p, 4)
    assert lb["ring_b"] == pytest.approx((p - 1) / p * n * n * 4)
    assert lb["memory_independent"] <= lb["ring_a"] <= lb["ring_c"] * 1.0000001


def test_extra_memory():
    m = n = k = 1024
    assert _cost.extra_memory_bytes("local", m, n, k, 8, 4) == 0
    assert _cost.extra_memory_bytes("allgather", m, n, k, 1, 4) == 0
    ring = _cost.extra_memory_bytes("allgather", m, n, k, 8, 4)
    one_shot = _cost.extra_memory_bytes("allgather", m, n, k, 8, 4, one_shot=True)
    assert ring < one_shot == k * n * 4
    assert _cost.extra_memory_bytes("reduce_scatter", m, n, k, 8, 2, 4) == 2 * m * n / 8 * 4
    assert _cost.extra_memory_bytes("allreduce", m, n, k, 8, 4) == m * n * 4
    with pytest.raises(ValueError, match="no memory model"):
        _cost.extra_memory_bytes("cannon", m, n, k, 8, 4)


# --------------------------------------------------------------------------- #
# cost model: calibration
# --------------------------------------------------------------------------- #
def _synthetic(model: MachineModel, noise: float = 0.0) -> list[tuple[float, float, float, float]]:
    import numpy as np

    rng = np.random.default_rng(0)
    rows = []
    for nbytes in (1 << 12, 1 << 16, 1 << 20, 1 << 24):
        rows.append((1.0, float(nbytes), 0.0))
    for flops in (1e8, 1e9, 1e10):
        rows.append((0.0, 0.0, flops))
    rows.append((7.0, 7 * 2**21, 2e9))  # a whole ring: all three terms
    out = []
    for msgs, nb, fl in rows:
        t = model.time(messages=msgs, nbytes=nb, flops=fl) * (1 + noise * rng.standard_normal())
        out.append((msgs, nb, fl, t))
    return out


def test_fit_recovers_known_constants():
    truth = MachineModel(alpha=3e-5, beta=1 / 5e9, gamma=1 / 25e9)
    model, res = _cost.fit(_synthetic(truth))
    assert model.alpha == pytest.approx(truth.alpha, rel=1e-6)
    assert model.beta == pytest.approx(truth.beta, rel=1e-6)
    assert model.gamma == pytest.approx(truth.gamma, rel=1e-6)
    assert res < 1e-9


def test_fit_with_noise_stays_close():
    truth = MachineModel(alpha=3e-5, beta=1 / 5e9, gamma=1 / 25e9)
    model, res = _cost.fit(_synthetic(truth, noise=0.05))
    assert model.alpha == pytest.approx(truth.alpha, rel=0.5)
    assert model.beta == pytest.approx(truth.beta, rel=0.2)
    assert model.gamma == pytest.approx(truth.gamma, rel=0.2)
    assert 0 < res < 0.2


def test_fit_is_non_negative():
    # timings that an unconstrained fit explains with a negative latency
    samples = [(1, 1e6, 0, 1e-4), (1, 2e6, 0, 2.5e-4), (1, 4e6, 0, 5.5e-4), (0, 0, 1e9, 0.05)]
    model, _ = _cost.fit(samples)
    assert model.alpha >= 0 and model.beta > 0 and model.gamma > 0


def test_fit_rejects_bad_samples():
    with pytest.raises(ValueError, match="positive time"):
        _cost.fit([(1, 0, 0, 0.0)])
    with pytest.raises(ValueError):
        _cost.fit([])


@pytest.mark.parametrize("key", sorted(_cost.DEFAULT_MODELS))
def test_two_opposite_rings_pay_on_duplex_links_for_large_blocks(key):
    """dmatmul.jax's bidirectional=None: on CPU (simulated devices, no duplex
    links) never; on GPU and TPU for blocks whose bytes outweigh a second
    message per step, not for tiny ones where latency dominates, and never on
    two ranks."""
    model = _cost.DEFAULT_MODELS[key]
    sizes = [2.0**e for e in range(0, 40, 3)]  # 1 B .. 256 GiB
    for p in (2, 3, 4, 8, 64):
        pays = [_cost.bidirectional_pays(model, nbytes, p) for nbytes in sizes]
        if key.startswith("cpu") or p == 2:
            assert not any(pays), (key, p)
        else:
            assert model.duplex and not pays[0] and pays[-1], (key, p, pays)
            assert pays == sorted(pays), (key, p, pays)  # one crossover: 2 alpha / beta
            assert _cost.bidirectional_pays(model, 2.01 * model.alpha / model.beta, p)
            assert not _cost.bidirectional_pays(model, 1.99 * model.alpha / model.beta, p)


# --------------------------------------------------------------------------- #
# cost model: loading
# --------------------------------------------------------------------------- #
def test_calibration_paths_expand_the_home_directory(tmp_path, monkeypatch):
    """``~`` in a path given to save_models/load_models (``--model-out=~/x.json``,
    which the shell leaves alone) is the home directory, as it is in
    ``DMATMUL_COST_MODEL``: not a directory named ``~`` in the current one."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    model = MachineModel(1e-5, 1 / 3e9, 1 / 20e9)
    written = _cost.save_models({"cpu": model}, "~/costs.json")
    assert written == tmp_path / "home" / "costs.json" and written.is_file() and not (tmp_path / "~").exists()
    assert _cost.load_models("~/costs.json")["cpu"].beta == model.beta


def test_model_loading_order(tmp_path, monkeypatch):
    path = tmp_path / "model.json"
    monkeypatch.setenv(_cost.MODEL_ENV, str(path))
    assert _cost.model_for("cpu") == _cost.DEFAULT_MODELS["cpu"]  # no file yet
    eight = MachineModel(1e-4, 1 / 3e9, 1 / 20e9)
    any_p = MachineModel(2e-5, 1 / 10e9, 1 / 90e9)
    _cost.save_models({"cpu/8": eight, "cpu": any_p}, meta={"host": "test"})
    got8 = _cost.model_for("cpu", 8)
    assert (got8.alpha, got8.beta, got8.gamma) == (eight.alpha, eight.beta, eight.gamma)
    assert got8.source.startswith("calibrated")
    got3 = _cost.model_for("cpu", 3)
    assert (got3.alpha, got3.beta, got3.gamma) == (any_p.alpha, any_p.beta, any_p.gamma)
    assert _cost.model_for("cuda") == _cost.DEFAULT_MODELS["gpu"]  # no calibration for it
    # merging keeps the other entries
    _cost.save_models({"cpu/2": MachineModel(1e-5, 1e-10, 1e-11)})
    doc = json.loads(path.read_text())
    assert set(doc["models"]) == {"cpu", "cpu/2", "cpu/8"} and doc["meta"]["host"] == "test"
    assert _cost.model_for("cpu", 2).gamma == 1e-11
    _cost.save_models({"tpu": _cost.DEFAULT_MODELS["tpu"]})  # what a link carries survives the file
    assert _cost.model_for("tpu").duplex and _cost.model_for("tpu").overlap and not _cost.model_for("cpu").duplex


def test_model_env_default_ignores_files(tmp_path, monkeypatch):
    monkeypatch.setenv(_cost.MODEL_ENV, "default")
    assert _cost.calibration_path() is None
    assert _cost.model_for("cpu") is _cost.DEFAULT_MODELS["cpu"]
    assert _cost.model_for("cpu", 8) is _cost.DEFAULT_MODELS["cpu/8"]
    assert _cost.model_for("cpu", 3) is _cost.DEFAULT_MODELS["cpu"]
    assert _cost.model_for("rocm", 8) is _cost.DEFAULT_MODELS["gpu"]
    assert _cost.model_for("metal") is _cost.DEFAULT_MODELS["cpu"]
    with pytest.raises(ValueError, match="give a path"):
        _cost.save_models({"cpu": _cost.DEFAULT_MODELS["cpu"]})


def test_default_path_is_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.delenv(_cost.MODEL_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert _cost.calibration_path() == tmp_path / "dmatmul" / f"cost_model-{_cost.machine_key()}.json"


def test_a_broken_model_file_says_how_to_fix_it(tmp_path, monkeypatch):
    path = tmp_path / "model.json"
    path.write_text("{not json")
    monkeypatch.setenv(_cost.MODEL_ENV, str(path))
    with pytest.raises(ValueError, match="dmatmul bench --calibrate"):
        _cost.model_for("cpu")


GOOD_ENTRY = {"alpha": 2e-5, "beta": 2.5e-10, "gamma": 5e-11}


@pytest.mark.parametrize("text, says", [
    ('{"version": 1, "models": [1]}', "expected an object"),  # an AttributeError escaped before
    ('{"version": 1, "models": {"cpu": 5}}', r"models\['cpu'\] must be an object"),
    (json.dumps({"models": {"cpu": {**GOOD_ENTRY, "beta": -1e-9}}}),
     r"models\['cpu'\]\.beta must be a finite number >= 0"),
    ('{"models": {"cpu": {"alpha": 2e-5, "beta": NaN, "gamma": 5e-11}}}', r"\.beta .* got nan"),
    ('{"models": {"cpu": {"alpha": Infinity, "beta": 2.5e-10, "gamma": 5e-11}}}', r"\.alpha .* got inf"),
    (json.dumps({"models": {"cpu/8": {**GOOD_ENTRY, "gamma": "5e-11"}}}), r"models\['cpu/8'\]\.gamma .* got '5e-11'"),
    (json.dumps({"models": {"cpu": {**GOOD_ENTRY, "alpha": True}}}), r"\.alpha .* got True"),
    (json.dumps({"models": {"cpu": {**GOOD_ENTRY, "collective_beta": -1}}}), r"\.collective_beta .* got -1"),
    (json.dumps({"models": {"cpu": {**GOOD_ENTRY, "overlap": "false"}}}), r"\.overlap must be true or false"),
    (json.dumps({"models": {"cpu": {**GOOD_ENTRY, "alhpa": 1e-5}}}), r"unknown field\(s\) \['alhpa'\]"),
    (json.dumps({"version": 2, "models": {"cpu": GOOD_ENTRY}}), "expected version 1, got 2"),
])
def test_a_model_file_with_wrong_values_names_the_field(tmp_path, monkeypatch, text, says):
    """Each entry is checked where the file is read: a negative, NaN or
    infinite constant (or a string, a typo'd field, a flag that is not a
    boolean) planned silently with nonsense before; now a ValueError names
    the file, the entry and field, what it must be and what it is."""
    path = tmp_path / "model.json"
    path.write_text(text)
    monkeypatch.setenv(_cost.MODEL_ENV, str(path))
    with pytest.raises(ValueError, match=says) as info:
        _cost.model_for("cpu", 8)
    assert str(path) in str(info.value) and f"{_cost.MODEL_ENV}=default" in str(info.value)


def test_a_model_path_that_is_a_directory_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(_cost.MODEL_ENV, str(tmp_path))  # it was silently ignored: the defaults planned
    with pytest.raises(ValueError, match="is not a file"):
        _cost.model_for("cpu")


def test_a_model_file_of_zeros_and_other_platforms_plans(tmp_path, monkeypatch):
    path = tmp_path / "model.json"
    path.write_text(json.dumps({"version": 1, "models": {"cpu": {"alpha": 0, "beta": 0, "gamma": 0},
                                                          "gpu": {**GOOD_ENTRY, "overlap": True}}}))
    monkeypatch.setenv(_cost.MODEL_ENV, str(path))
    assert _cost.model_for("cpu", 8).alpha == 0.0 and _cost.model_for("cuda").overlap
    assert _cost.model_for("tpu") == _cost.DEFAULT_MODELS["tpu"]


def test_calibrating_over_a_broken_file_replaces_it(tmp_path, monkeypatch):
    """``dmatmul bench --calibrate`` over a file the error told the user to
    recalibrate: the file is replaced (a TypeError escaped the merge before)."""
    path = tmp_path / "model.json"
    monkeypatch.setenv(_cost.MODEL_ENV, str(path))
    for broken in ('{"version": 1, "models": [1]}', '[1]',
                   json.dumps({"models": {"cpu/4": {**GOOD_ENTRY, "beta": -1}}})):
        path.write_text(broken)
        _cost.save_models({"cpu/2": MachineModel(1e-5, 1e-10, 1e-11)})
        assert set(json.loads(path.read_text())["models"]) == {"cpu/2"}
        assert _cost.model_for("cpu", 2).gamma == 1e-11


def test_describe():
    text = MachineModel(2e-5, 1 / 4e9, 1 / 20e9).describe()
    assert "alpha 20 us" in text and "4 GB/s" in text and "20 GFLOP/s" in text


# --------------------------------------------------------------------------- #
# the bench: pure parts
# --------------------------------------------------------------------------- #
from dmatmul.cli import bench as _bench  # noqa: E402


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="dmatmul")
    sub = parser.add_subparsers(dest="command", required=True)
    _bench.add_parser(sub)
    return parser.parse_args(["bench", *argv])


def test_parser_options():
    args = parse("--sizes", "256,512", "--devices", "2,4", "--layouts", "XYX,YXY,XYR", "--dtype", "bfloat16",
                 "--reps", "3", "--json", "out.json", "--plot", "", "--quick", "--calibrate")
    assert args.sizes == [256, 512] and args.devices == [2, 4] and args.layouts == ["XYX", "YXY", "XYR"]
    assert args.dtype == "bfloat16" and args.reps == 3 and args.json == "out.json" and args.plot == ""
    assert args.quick and args.calibrate and args.func is _bench.run
    with pytest.raises(SystemExit):
        parse("--sizes", "0")


def test_quick_shrinks_only_the_defaults():
    args = _bench.finish_args(parse("--quick"))
    assert args.sizes == list(_bench.QUICK_SIZES) and args.devices == list(_bench.QUICK_DEVICES) and args.reps == 3
    args = _bench.finish_args(parse("--quick", "--sizes", "64", "--reps", "2"))
    assert args.sizes == [64] and args.reps == 2


@pytest.mark.parametrize("argv, says", [
    (("--layouts", "XYZ"), "argument --layouts: layout 'XYZ': expected three letters"),
    (("--layouts", ""), "argument --layouts: expected comma-separated layouts"),  # timed nothing before
    (("--layouts", " , "), "argument --layouts: expected comma-separated layouts"),
    (("--peers", "xla,torch"), "argument --peers: expected comma-separated peers from xla, xla-1dev, numpy"),
])
def test_bad_layouts_and_peers_are_usage_errors(argv, says, capsys):
    """As every other option's: status 2, the usage line, the option named
    (status 1 and neither before, and an empty --layouts ran nothing)."""
    with pytest.raises(SystemExit) as info:
        parse(*argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.startswith("usage: dmatmul bench") and says in err, err
    assert parse("--peers", "").peers == []  # no peers: dmatmul alone


def test_parse_layout():
    import dmatmul as dm

    assert _bench.parse_layout("XYX") == (dm.Slab.X, dm.Slab.Y, dm.Slab.X)
    assert _bench.parse_layout("yxr") == (dm.Slab.Y, dm.Slab.X, dm.Replicated())
    with pytest.raises(ValueError, match="three letters"):
        _bench.parse_layout("XY")


def test_interleaving_varies_the_order():
    calls: list[str] = []
    runners = {name: (lambda name=name: calls.append(name)) for name in "abcd"}
    times, first = _bench.time_interleaved(runners, reps=6, warmup=1)
    assert calls[:8] == list("abcdabcd")  # first calls, then one warm-up round
    reps = [calls[8 + 4 * r: 12 + 4 * r] for r in range(6)]
    assert all(sorted(rep) == list("abcd") for rep in reps)
    assert reps == [_bench.rep_order(list("abcd"), r) for r in range(6)]  # deterministic: same on every rank
    followers = {rep[rep.index("a") + 1] for rep in reps if rep[-1] != "a"}
    assert len(followers) > 1  # "a" is not always followed by the same runner
    assert all(len(ts) == 6 for ts in times.values()) and set(first) == set("abcd")


def test_waiting_for_an_idle_machine(monkeypatch):
    busy = _bench.busy_fraction(0.01)
    assert busy is None or 0.0 <= busy <= 1.0
    readings = iter([0.9, 0.8, 0.1])
    monkeypatch.setattr(_bench.timing, "busy_fraction", lambda window=0.3: next(readings))
    waiter = _bench.IdleWaiter(0.2)
    calls: list[str] = []
    _bench.time_interleaved({"a": lambda: calls.append("a")}, reps=1, warmup=0, before=waiter)
    assert calls == ["a", "a"] and waiter.gave_up == 0  # three readings before the timed call
    monkeypatch.setattr(_bench.timing, "busy_fraction", lambda window=0.3: 1.0)
    waiter = _bench.IdleWaiter(0.2, timeout=0.0)
    waiter()
    assert waiter.gave_up == 1


def _result(impl: str, seconds: float, **kw) -> _bench.Result:
    return _bench.Result(impl=impl, n=1000, ranks=8, layout="XYX", dtype="float32", mode="devices",
                         times=[seconds, seconds * 1.1, seconds * 0.9], **kw)


def test_table_ratios_and_summary():
    group = [
        _result("dmatmul:auto", 0.1, algorithm="allgather", predicted_s=0.12, modelled_bytes=2**20,
                lower_bound_bytes=2**19),
        _result("xla", 0.2),
        _result("numpy", 0.08),
    ]
    table = _bench.format_group(group)
    row = next(line for line in table.splitlines() if line.startswith("dmatmul auto (allgather)"))
    assert "2.00x" in row and "0.80x" in row and "120.0" in row and "2.00" in row  # vs xla, vs numpy, pred, /bound
    assert "GFLOP/s" in table and "x numpy" in table and "x xla" in table
    assert group[0].gflops == pytest.approx(2e9 / 0.1 / 1e9)
    summary = _bench.format_summary(group)
    assert "allgather" in summary and "2.00x" in summary and "0.80x" in summary


def test_summary_marks_the_targets():
    group = [_result("dmatmul:auto", 0.1, algorithm="allgather"), _result("xla", 0.105), _result("numpy", 0.07)]
    for r in group:
        r.n = 2048
    summary = _bench.format_summary(group)
    assert "xla >= 1.0: met" in summary and "numpy >= 0.75: MISSED" in summary


def test_json_rows(tmp_path):
    group = [_result("dmatmul:auto", 0.1, algorithm="allgather"), _result("xla", 0.2), _result("numpy", 0.05)]
    path = tmp_path / "bench.json"
    _bench.write_json(str(path), group, {"mode": "devices"})
    doc = json.loads(path.read_text())
    auto = doc["results"][0]
    assert auto["impl"] == "dmatmul:auto" and auto["ratio_to"]["xla"] == pytest.approx(2.0)
    assert auto["median_s"] == pytest.approx(0.1) and auto["min_s"] == pytest.approx(0.09)
    assert auto["gflops"] == pytest.approx(20.0)


def test_cost_table(monkeypatch):
    monkeypatch.setenv(_cost.MODEL_ENV, "default")
    text = _bench.format_costs(1024, 8)
    assert "3-D regime" in text and "recv MiB" in text and "extra MiB" in text
    rows = {line.split()[0] + " " + " ".join(line.split()[1:4]): line.split() for line in text.splitlines()[4:]}
    ag = rows["allgather Slab.X Slab.Y Slab.X"]
    assert float(ag[4]) == pytest.approx(7 / 8 * 4.0, abs=0.01)  # (P-1)/P of B, MiB
    assert ag[6] == "7" and ag[-1] == "2.33"
    rs = rows["reduce_scatter Slab.Y Slab.X Slab.Y"]
    assert float(rs[4]) == pytest.approx(3.5, abs=0.01)
    ar = rows["allreduce Slab.Y Slab.X Replicated()"]
    assert float(ar[4]) == pytest.approx(7.0, abs=0.01) and ar[-1] == "4.67"


def test_progress_bar():
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()
    bar = _bench.Progress(10, stream=out)
    bar.step(5, "half way")
    bar.note("a message")
    bar.step(5, "done")
    bar.close()
    text = out.getvalue()
    assert "\r[" in text and "50%" in text and "100%" in text and "a message\n" in text
    quiet = io.StringIO()  # not a terminal: no bar, messages only
    bar = _bench.Progress(10, stream=quiet)
    bar.step(10, "x")
    bar.note("m")
    assert quiet.getvalue() == "m\n"
    for bar in (_bench.Progress(10, enabled=False, stream=out), _bench.Progress(10, enabled=False, stream=Tty())):
        bar.note("explained")  # --no-progress drops the bar, not --explain's accounts (it dropped both)
        bar.step(10, "x")
        assert bar.stream.getvalue().endswith("explained\n")
    silent = io.StringIO()  # a rank other than 0
    _bench.Progress(10, enabled=False, stream=silent, notes=False).note("m")
    assert silent.getvalue() == ""


# --------------------------------------------------------------------------- #
# the bench end to end (tiny sizes; simulated CPU devices from conftest)
# --------------------------------------------------------------------------- #
jax = pytest.importorskip("jax")


def test_bench_runs_end_to_end(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(_cost.MODEL_ENV, "default")
    out, plot = tmp_path / "b.json", tmp_path / "b.png"
    args = parse("--sizes", "64,128", "--devices", "2,4", "--layouts", "XYX,YXY", "--reps", "2", "--warmup", "0",
                 "--json", str(out), "--plot", str(plot), "--no-progress")
    assert _bench.run(args) == 0
    text = capsys.readouterr().out
    assert "n=64 float32, 2 devices, layout (a, b, result) = (Slab.X, Slab.Y, Slab.X)" in text
    assert "dmatmul auto (allgather)" in text and "dmatmul auto (reduce_scatter)" in text
    assert "xla jit(jnp.dot) partitioned" in text and "numpy (1 process)" in text
    assert "MISMATCH" not in text
    doc = json.loads(out.read_text())
    assert doc["meta"]["mode"] == "devices" and doc["meta"]["reps"] == 2
    rows = doc["results"]
    groups = {(r["n"], r["ranks"], r["layout"]) for r in rows}
    assert groups == {(n, p, lay) for n in (64, 128) for p in (2, 4) for lay in ("XYX", "YXY")}
    for r in rows:
        assert len(r["times"]) == 2 and r["median_s"] > 0 and r["gflops"] > 0
        assert set(r["ratio_to"]) == {"xla", "xla-1dev", "numpy"}
        if r["impl"].startswith("dmatmul:"):
            assert r["max_rel_err"] < 1e-4 and r["algorithm"]
            assert r["lower_bound_bytes"] > 0 and r["regime"] == "3-D"
        if r["impl"] != "numpy" and r["impl"] != "xla-1dev":  # peak memory per rank against the ideal
            assert r["peak_bytes"] > 0 and r["ideal_bytes"] > 0
            assert math.isfinite(r["memory_ratio"]) and r["memory_ratio"] >= 1.0
    impls = {r["impl"] for r in rows if r["layout"] == "YXY"}
    assert {"dmatmul:auto", "dmatmul:reduce_scatter", "dmatmul:allreduce"} <= impls
    assert "dmatmul:allgather" not in impls  # does not fit (Slab.Y, Slab.X, Slab.Y)
    if plot.exists():
        assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert "no plot" in text


def test_bench_reports_peak_memory_on_a_grid(tmp_path, capsys, monkeypatch):
    """SUMMA (and XLA on the same 2-D layout): the compiled program's peak bytes
    per rank and its ratio to the ideal (blocks of a, b, result + one A and one B panel)."""
    monkeypatch.setenv(_cost.MODEL_ENV, "default")
    out = tmp_path / "g.json"
    args = parse("--sizes", "96", "--devices", "8", "--layouts", "GGG", "--reps", "1", "--warmup", "0",
                 "--algorithms", "auto,summa", "--peers", "xla,numpy", "--json", str(out), "--plot", "",
                 "--no-progress")
    assert _bench.run(args) == 0
    text = capsys.readouterr().out
    assert "peak MiB" in text and "/ideal" in text and "MISMATCH" not in text
    rows = {r["impl"]: r for r in json.loads(out.read_text())["results"]}
    summa = rows["dmatmul:summa"]
    itemsize = 4
    blocks = 3 * (96 // 2) * (96 // 4) * itemsize  # a, b and the result: one 48x24 block each on the 2x4 grid
    assert summa["ideal_bytes"] > blocks  # plus one panel of A and one of B
    for impl in ("dmatmul:auto", "dmatmul:summa", "xla"):
        ratio = rows[impl]["memory_ratio"]
        assert rows[impl]["peak_bytes"] >= blocks and math.isfinite(ratio) and ratio >= 1.0
    assert rows["numpy"]["memory_ratio"] is None


def test_bench_bfloat16(tmp_path, capsys, monkeypatch):
    pytest.importorskip("ml_dtypes")
    monkeypatch.setenv(_cost.MODEL_ENV, "default")
    args = parse("--sizes", "64", "--devices", "2", "--layouts", "XYX", "--reps", "1", "--warmup", "0",
                 "--dtype", "bfloat16", "--algorithms", "auto", "--json", "", "--plot", "", "--no-progress")
    assert _bench.run(args) == 0
    text = capsys.readouterr().out
    assert "n=64 bfloat16" in text and "float32 GEMM" in text and "MISMATCH" not in text


@pytest.mark.parametrize("model_out, env, says", [
    ("", None, "argument --model-out: expected a file to save the calibration to, got ''"),
    ("{tmp}", None, "argument --model-out: expected a file to save the calibration to, got '{tmp}'"),
    (None, "{tmp}", "argument --calibrate: DMATMUL_COST_MODEL: expected a file to save the calibration to"),
    (None, "default", "argument --calibrate: DMATMUL_COST_MODEL='default' names no file to save the calibration to"),
])
def test_calibrate_checks_where_it_saves_before_measuring(tmp_path, capsys, monkeypatch, model_out, env, says):
    """Where the calibration goes is checked before anything is measured (a
    traceback after the whole calibration before: an empty path, a directory,
    or DMATMUL_COST_MODEL=default)."""
    monkeypatch.setattr(_bench.calibration, "calibration_samples", lambda p, **kw: pytest.fail("measured"))
    if env is not None:
        monkeypatch.setenv(_cost.MODEL_ENV, env.format(tmp=tmp_path))
    argv = ["--calibrate", "--devices", "2"]
    if model_out is not None:
        argv += ["--model-out", model_out.format(tmp=tmp_path)]
    with pytest.raises(SystemExit) as info:
        _bench.run(parse(*argv))
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.startswith("usage: dmatmul bench") and says.format(tmp=tmp_path) in err, err


def test_calibration_measures_and_saves(tmp_path, capsys, monkeypatch):
    samples = _bench.calibration_samples(2, reps=1, message_bytes=(1 << 12, 1 << 16), gemm_sizes=(64, 128))
    assert all(t > 0 for *_, t in samples) and any(s[2] > 0 for s in samples)
    model, _ = _cost.fit(samples)
    assert model.gamma > 0
    path = tmp_path / "model.json"
    monkeypatch.setattr(
        _bench.calibration, "calibration_samples",
        lambda p, **kw: _synthetic(MachineModel(1e-5 * p, 1 / 4e9, p / 100e9)),
    )
    # the routes' times: made by a known model on 4 devices (the fit takes it), none timed on 2 (the
    # micro-benchmarks' model stays)
    from dmatmul import _plan

    routes = MachineModel(3e-4, 9e-10, 5e-11, mem=4e-10, collective_alpha=2e-5, collective_beta=1.1e-9,
                          step_gamma=1e-11)
    terms = [(7, 0, 1e6, 0, 1e8, 2e6, 1e8), (0, 1, 0, 4e6, 2e8, 0, 0), (14, 1, 2e6, 1e6, 1e8, 1e6, 1e8),
             (0, 2, 0, 3e6, 4e8, 8e6, 0), (7, 0, 3e6, 0, 3e8, 0, 3e8), (21, 3, 1e6, 0, 1e8, 4e6, 0),
             (0, 1, 5e5, 9e6, 6e8, 1e6, 0), (7, 0, 1e6, 0, 2e8, 0, 2e8)]
    timed = [(t, sum(getattr(routes, n) * v for n, v in zip(_plan.TERMS, t))) for t in terms]
    monkeypatch.setattr(_bench.calibration, "route_samples", lambda p, **kw: timed if p == 4 else [])
    args = parse("--calibrate", "--devices", "2,4", "--model-out", str(path))
    assert _bench.run(args) == 0
    out = capsys.readouterr().out
    assert "saved to" in out and "4 devices, 8 routes: predicted/measured RMS deviation" in out
    monkeypatch.setenv(_cost.MODEL_ENV, str(path))
    for name in _plan.TERMS:  # fitted to the routes
        assert getattr(_cost.model_for("cpu", 4), name) == pytest.approx(getattr(routes, name), rel=1e-6), name
    assert _cost.model_for("cpu", 2).alpha == pytest.approx(2e-5)  # the micro-benchmarks'
    assert _cost.model_for("cpu", 2).gamma == pytest.approx(2 / 100e9)
    assert _cost.model_for("cpu").alpha == pytest.approx(3e-4)  # the largest count calibrated


def test_mpi_bench_script_names_itself_and_its_defaults():
    """``benchmarks/mpi_bench.py --help``: its own name and the defaults it runs
    with (n = 2048,4096; mpi-bench.json), not ``dmatmul bench``'s."""
    import os
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, str(root / "benchmarks" / "mpi_bench.py"), "--help"],
                         capture_output=True, text=True, timeout=120, cwd=root,
                         env={**os.environ, "PYTHONPATH": str(root)})
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert text.startswith("usage: mpi_bench.py") and "mpiexec" in text
    assert "(default: 2048,4096)" in text and "(default: mpi-bench.json)" in text and "(default: XYX,YXY)" in text


def test_bench_main_takes_a_scripts_defaults(monkeypatch):
    seen = []
    monkeypatch.setattr(_bench.command, "run", lambda args: seen.append(args) or 0)
    assert _bench.main(["--reps", "2"], prog="x", defaults={"sizes": "2048,4096", "json": "mpi-bench.json"}) == 0
    (args,) = seen
    assert args.sizes == [2048, 4096] and args.json == "mpi-bench.json" and args.reps == 2


# --------------------------------------------------------------------------- #
# the scripts of benchmarks/ (tiny sizes; what they time, never how fast)
# --------------------------------------------------------------------------- #
def _script(name: str):
    import importlib.util
    import pathlib

    spec = importlib.util.spec_from_file_location(
        f"bench_{name}", pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_summa_bench_variants_run_their_own_kernel():
    """benchmarks/summa.py at n = 64, where the model picks SUMMA's one-shot
    schedule: each variant must still run its own ring kernel (it timed the
    one-shot program under every variant's name). ``gemms-only`` sends
    nothing, so its numbers are wrong exactly when it ran."""
    import numpy as np

    import dmatmul as dm
    from dmatmul._matmul import plan_of

    summa = _script("summa")
    n = 64
    rng = np.random.default_rng(3)
    a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    ref = a.astype(np.float64) @ b.astype(np.float64)
    for shape in ((2, 4), (4, 2)):
        dist = dm.BlockNonCyclic(dm.ProcessGrid(shape))
        probe = plan_of(dm.Matmul(a, b, distribution=dist, algorithm="summa", devices=8))
        assert probe.plan.kernel.schedule == "one_shot"  # what the model picks at this size
        xa, xb = jax.device_put(a, probe.sharding("a")), jax.device_put(b, probe.sharding("b"))
        for name, kern in (("psum", summa.psum_summa), ("dmatmul", None), ("gemms-only", summa.gemms_only)):
            mm, peak = summa.plan_variant(xa, xb, dist, kern)
            assert plan_of(mm).plan.kernel.schedule == "ring", name
            assert plan_of(mm).spec.precision == "highest", name  # as the xla peer's jnp.dot
            err = float(np.abs(np.asarray(mm.execute()) - ref).max() / np.abs(ref).max())
            assert (err > 1e-2) if name == "gemms-only" else (err < 1e-5), (shape, name, err)
            assert peak > 3 * n * n * 4 / 8, (shape, name, peak)  # at least the blocks of a, b and the result


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_bench_runs_dmatmul_at_the_xla_peers_precision(dtype):
    """dmatmul's rows and XLA's do the same work: the XLA peer's jnp.dot runs at
    HIGHEST for float32, so dmatmul must too (precision=None is the framework's
    default, TF32 on an NVIDIA GPU: a faster, less exact product than its peer's)."""
    pytest.importorskip("ml_dtypes")
    import numpy as np

    from dmatmul._matmul import plan_of

    def xla_precision() -> str | None:
        x = jax.numpy.ones((8, 8), dtype)
        (dot,) = [e for e in jax.make_jaxpr(_bench.peers.xla_dot(dtype))(x, x).eqns if e.primitive.name == "dot_general"]
        prec = dot.params["precision"]
        prec = prec[0] if isinstance(prec, tuple) else prec
        return None if prec in (None, jax.lax.Precision.DEFAULT) else prec.name.lower()

    args = parse("--dtype", dtype, "--algorithms", "auto,allgather")
    a, b = (_bench.problem.as_dtype(x, dtype) for x in _bench.problem.operands(32, dtype))
    plans = _bench.peers.dmatmul_plans(a, b, _bench.parse_layout("XYX"), args, devices=2)
    assert set(plans) == {"auto", "allgather"}
    want = "highest" if dtype == "float32" else None
    assert xla_precision() == want
    for name, mm in plans.items():
        assert plan_of(mm).spec.precision == want, name
        got = np.asarray(mm.execute(), dtype=np.float64)
        ref = a.astype(np.float64) @ b.astype(np.float64)
        assert _bench.problem.rel_err(got, ref) < _bench.problem.TOL[dtype], name


def test_numpy_peer_under_mpiexec_runs_the_bench_dtype():
    """numpy's helper process (mpiexec runs) multiplies in the bench's element type:
    float64 for --dtype float64 (it ran float32, half the work, understating
    dmatmul's x numpy), float32 for the half precisions, as in one process."""
    from dmatmul.cli.bench.mpi import NumpyHelper
    from dmatmul.cli.bench.problem import numpy_dtype, numpy_note

    assert [numpy_dtype(d) for d in ("float32", "float64", "bfloat16", "float16")] == [
        "float32", "float64", "float32", "float32"]
    assert numpy_note("float64") is None and "float32 GEMM" in numpy_note("bfloat16")
    helper = NumpyHelper()
    try:
        for dtype in ("float64", "float32", "bfloat16"):
            seconds, ran = helper.gemm(16, numpy_dtype(dtype))
            assert ran == numpy_dtype(dtype) and seconds >= 0, (dtype, ran)
    finally:
        helper.close()


def test_bench_first_call_is_the_compiling_one_and_is_checked(tmp_path, monkeypatch):
    """Each runner is called 1 + warmup + reps times: the correctness check reads
    the first call's result, so ``first_call_s`` (the JSON's compilation time)
    is the call that compiles (a check call before it made it a warm call)."""
    monkeypatch.setenv(_cost.MODEL_ENV, "default")
    calls: dict[int, int] = {}
    blocking = _bench.devices.blocking

    def counted(fn, *args):
        run = blocking(fn, *args)
        key = len(calls)
        calls[key] = 0

        def runner():
            calls[key] += 1
            return run()

        return runner

    monkeypatch.setattr(_bench.devices, "blocking", counted)
    out = tmp_path / "f.json"
    args = parse("--sizes", "32", "--devices", "2", "--layouts", "XYX", "--reps", "2", "--warmup", "1",
                 "--algorithms", "auto", "--peers", "xla,xla-1dev", "--json", str(out), "--plot", "",
                 "--no-progress")
    assert _bench.run(args) == 0
    assert len(calls) == 3 and set(calls.values()) == {1 + 1 + 2}, calls
    rows = json.loads(out.read_text())["results"]
    assert {r["impl"] for r in rows} == {"dmatmul:auto", "xla", "xla-1dev"}
    for r in rows:
        assert r["max_rel_err"] < 1e-5 and r["first_call_s"] > 0, r["impl"]
    assert next(r for r in rows if r["impl"] == "xla")["peak_bytes"] > 0


@pytest.mark.parametrize("shape", [(2, 4), (4, 2)])
def test_summa_ideal_memory_counts_a_whole_panel_on_uneven_blocks(shape):
    """The /ideal column's SUMMA buffer is one op(A) and one op(B) panel as wide
    as the ring's block: K = 70 cut into 18, 18, 17, 17 (and 35, 35) has runs of
    18, 17, 1, 17, 17, whose common width 1 made the ideal's panels 1 column
    wide (the ideal almost the blocks alone: peak/ideal overstated). Even K
    (64: blocks of 16 and 32) keeps its 16-wide panels."""
    import numpy as np

    import dmatmul as dm
    from dmatmul._matmul import plan_of

    m, n = 100, 60
    for k, panel in ((70, 18), (64, 16)):
        a, b = np.ones((m, k), np.float32), np.ones((k, n), np.float32)
        dist = dm.BlockNonCyclic(dm.ProcessGrid(shape))
        plan = plan_of(dm.Matmul(a, b, distribution=dist, algorithm="summa", devices=8))
        blocks = sum(max(int(np.prod(dist.shape(r, s, 8))) for r in range(8)) for s in ((m, k), (k, n), (m, n)))
        m_loc, n_loc = -(-m // shape[0]), -(-n // shape[1])
        assert plan.ideal_memory_bytes() == 4 * (blocks + panel * (m_loc + n_loc)), (k, shape)
        got = np.asarray(dm.matmul(a, b, distribution=dist, algorithm="summa", devices=8))
        np.testing.assert_allclose(got, np.full((m, n), float(k)), rtol=1e-6)


def test_bench_checks_large_products_on_a_sample_of_rows(tmp_path, capsys, monkeypatch):
    """Above FULL_CHECK_MAX the bench checks a sample of rows (it checked nothing
    above n = 4096, so a fast wrong kernel was reported); here at n = 64 with the
    limit lowered, and an XLA peer that is wrong by 1%: flagged, exit status 1."""
    monkeypatch.setenv(_cost.MODEL_ENV, "default")
    monkeypatch.setattr(_bench.problem, "FULL_CHECK_MAX", 16)
    right = _bench.devices.xla_dot
    monkeypatch.setattr(_bench.devices, "xla_dot", lambda dtype: lambda x, y: right(dtype)(x, y) * 1.01)
    args = parse("--sizes", "64", "--devices", "2", "--layouts", "XYX", "--reps", "1", "--warmup", "0",
                 "--algorithms", "auto", "--peers", "xla", "--json", str(tmp_path / "s.json"), "--plot", "",
                 "--no-progress")
    assert _bench.run(args) == 1
    rows = {r["impl"]: r for r in json.loads((tmp_path / "s.json").read_text())["results"]}
    assert rows["dmatmul:auto"]["max_rel_err"] < 1e-5 and "MISMATCH" not in (rows["dmatmul:auto"]["note"] or "")
    assert rows["xla"]["note"].startswith("MISMATCH") and rows["xla"]["max_rel_err"] > 1e-3
    assert 16 < len(_bench.problem.check_rows(64)) <= 64


def test_one_device_bench_checks_every_contender(monkeypatch, capsys):
    """benchmarks/one_device.py (the GPU check: the JAX backend on one device
    against jnp.dot) at tiny sizes: every contender's result is checked, and a
    wrong one makes the exit status 1."""
    import dmatmul as dm

    one = _script("one_device")
    argv = ["--sizes", "16,33", "--dtypes", "float32,bfloat16", "--precisions", "default,highest", "--reps", "2"]
    assert one.main(argv) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("float32", "bfloat16"))]
    assert len(rows) == 8 and all(line.endswith(" ok") for line in rows), rows
    right = dm.matmul
    monkeypatch.setattr(dm, "matmul", lambda *a, **k: right(*a, **k) * 1.01)
    assert one.main(argv[:2] + ["--dtypes", "float32", "--precisions", "highest", "--reps", "1"]) == 1
    assert "MISMATCH float32 highest n=16" in capsys.readouterr().out


def test_calibration_leaves_the_model_file_plans_read_as_it_was(tmp_path, monkeypatch):
    """The routes are planned with the model just measured (its file named in
    DMATMUL_COST_MODEL while they are timed), and DMATMUL_COST_MODEL is then
    what it was: later plans in the process read what they read before."""
    import os

    seen = []
    monkeypatch.setattr(_bench.calibration, "calibration_samples",
                        lambda p, **kw: _synthetic(MachineModel(1e-5 * p, 1 / 4e9, p / 100e9)))
    monkeypatch.setattr(_bench.calibration, "route_samples",
                        lambda p, **kw: seen.append(os.environ.get(_cost.MODEL_ENV)) or [])
    path = tmp_path / "model.json"
    monkeypatch.setenv(_cost.MODEL_ENV, "default")
    assert _bench.run(parse("--calibrate", "--devices", "4", "--model-out", str(path))) == 0
    assert seen == [str(path)] and os.environ[_cost.MODEL_ENV] == "default"
    monkeypatch.delenv(_cost.MODEL_ENV)
    assert _bench.run(parse("--calibrate", "--devices", "4", "--model-out", str(path))) == 0
    assert seen == [str(path)] * 2 and _cost.MODEL_ENV not in os.environ
