"""``dmatmul plan`` (named machines, the projection) and the calibration that
follows the machine (its file's key, the device kind, rank 0's broadcast).
Pure Python: no JAX, no timing."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys

import pytest

from dmatmul import _cost, _layouts, _machines, _plan, _roles, _world
from dmatmul.cli import main
from dmatmul.cli import plan as plan_cli
from dmatmul.cli.bench import calibration


# --------------------------------------------------------------------------- #
# dmatmul plan
# --------------------------------------------------------------------------- #
def _run(capsys, *argv: str) -> str:
    assert main(["plan", *argv]) == 0
    return capsys.readouterr().out


def test_plan_prints_the_planners_own_choice(capsys):
    """The algorithm, layout, time and bytes printed are those of the plan
    ``choose_distributions`` + ``choose`` make on the machine's model."""
    out = _run(capsys, "-m", "8192", "-n", "8192", "-k", "8192", "--machine", "h100-nvl8", "--dtype", "bfloat16")
    model = _machines.PROFILES["h100-nvl8"].model("bfloat16")
    problem = _plan.Problem1D(8192, 8192, 8192, 8, 2, 4)
    triple = _layouts.choose_distributions(problem, model, transposes=(False, False))
    grid = triple[0].grid  # (SUMMA on a 2-D grid here: a and b on the grid, SUMMA's own layout)
    on_grid = frozenset("abd") if grid is not None else frozenset()
    chosen = _plan.choose(
        problem if grid is None else dataclasses.replace(problem, grid=grid.shape),
        _roles.roles_of(triple, (False, False), 8), algorithm="auto", model=model, transposes=(False, False),
        native=on_grid, grid_ops=on_grid, kernels=None if grid is None else _plan.grid_kernels(_plan.KERNELS))
    assert f"algorithm: {chosen.algorithm} (" in out
    names = [f"BlockNonCyclic({d.grid.shape[0]}x{d.grid.shape[1]} grid)" if d.grid is not None else repr(d)
             for d in triple]
    assert f"layout (a, b, result): {', '.join(names)}," in out
    assert f"predicted: {chosen.time * 1e6:.1f} us" in out
    assert f"bytes per rank: {chosen.nbytes / 2**20:.2f} MiB" in out
    bound = _cost.lower_bounds(8192, 8192, 8192, 8, 2)["memory_independent"]
    assert f"{chosen.nbytes / bound:.2f}x the bound" in out
    peak = 989e12
    assert f"= {chosen.flops / chosen.time / peak:.0%} of peak" in out
    assert "runners-up" in out and "summa" in out.split("runners-up")[1]


@pytest.mark.parametrize("nodes, rows", [(16, 8), (128, 32)])
def test_a_free_plan_is_the_cheapest_candidate_shown(nodes, rows, capsys):
    """16384^3 bfloat16 on 128 and 1024 H200s, layout free: SUMMA with a and b
    on one of the two squarest 2-D grids (placing each costs its share; which
    of the two, the panel its one-shot schedule lays out decides) is the cheapest of every
    layout the planner weighs, 1-D triples and grids, each ranked with placing
    a and b there; it is chosen (before, only 1-D layouts were weighed: 2.5-D
    SUMMA after three all-to-alls at 128, a local GEMM on a replicated b at
    1024, predicted 2.7 and 15 times slower), and no runner-up ranks below
    it (x chosen >= 1)."""
    prof, model, p = plan_cli.machine_model("h200-nvl8", "bfloat16", nodes)
    pr = plan_cli.project(16384, 16384, 16384, p, "bfloat16", model, memory=plan_cli.machine_memory(prof, p))
    problem = _plan.Problem1D(16384, 16384, 16384, p, 2, 4, memory=pr.memory)
    weighed = _layouts.weigh(problem, model, transposes=(False, False))
    assert pr.considered == sum(len(w.plans) for w in weighed)
    cheapest = min(w.cost for w in weighed)
    assert pr.chosen.cost == cheapest and pr.chosen.plan.time + pr.chosen.placement == cheapest
    assert pr.chosen.layout == "GGG" and pr.chosen.plan.algorithm == "summa"
    assert pr.chosen.grid in {(rows, p // rows), (p // rows, rows)}
    assert all(c.cost >= pr.chosen.cost for c in pr.runners_up)
    out = format_free(capsys, nodes)
    table = out.split("vs the bound\n")[1].splitlines()[:-1]
    ratios = [float(re.search(r"s +(\d+\.\d\d) +\d+\.\d\d  ", line)[1]) for line in table]  # x chosen
    assert len(ratios) == len(pr.runners_up) and min(ratios) >= 1.0
    assert f"BlockNonCyclic({pr.chosen.grid[0]}x{pr.chosen.grid[1]} grid)" in out.split("\n")[3]


def format_free(capsys, nodes: int) -> str:
    return _run(capsys, "-m", "16384", "-n", "16384", "-k", "16384", "--dtype", "bfloat16", "--machine", "h200-nvl8",
                "--nodes", str(nodes))


def test_free_layouts_weigh_grids_as_they_weigh_1d_triples():
    """choose_distributions (one process, distribution=None) on 64 GPUs, where
    SUMMA on the 8x8 grid is far cheaper than any 1-D plan: a, b and the result
    on that grid; with a result the backend cannot deliver on a grid, the
    result 1-D (a and b still on it where that is cheapest); with only kernels
    that run no grid algorithm (nvmath's), a 1-D triple as before."""
    from dmatmul import BlockNonCyclic, ProcessGrid, Replicated

    model = _machines.PROFILES["h200-nvl8"].model("bfloat16", 8)
    problem = _plan.Problem1D(16384, 16384, 16384, 64, 2, 4)
    grid = BlockNonCyclic(ProcessGrid((8, 8)))
    triple = _layouts.choose_distributions(problem, model, transposes=(False, False))
    assert triple == (grid, grid, grid)
    one_d = [w for w in _layouts.weigh(problem, model, transposes=(False, False)) if w.problem.grid is None]
    on_grid = _plan.plans(dataclasses.replace(problem, grid=(8, 8)), {"a": "G", "b": "G", "d": "G"}, model,
                          native=frozenset("abd"), grid_ops=frozenset("abd"))[0]
    share = model.beta * 2 * 16384 * 16384 * 2 / 64
    assert on_grid.time + share < 0.7 * min(w.cost for w in one_d)  # far cheaper: the grid is weighed
    kept = _layouts.choose_distributions(problem, model, transposes=(False, False),
                                         deliverable=lambda d: d.grid is None)
    assert kept[2].grid is None and Replicated() != kept[2]
    nv = [k for k in _plan.KERNELS if not _plan.ALGORITHMS[k.algorithm].grid and k.algorithm != "summa25d"]
    assert all(d.grid is None for d in _layouts.choose_distributions(problem, model, transposes=(False, False),
                                                                      kernels=nv))


def test_plan_on_a_given_layout_and_runners_up_are_each_algorithms_best(capsys):
    pr = plan_cli.project(4096, 4096, 4096, 8, "float32", _machines.PROFILES["b200-nvl8"].model("float32"), "GGG")
    problem = _plan.Problem1D(4096, 4096, 4096, 8, 4, 4, grid=(2, 4))
    every = _plan.plans(problem, {"a": "G", "b": "G", "d": "G"}, pr.model, native=frozenset("abd"),
                        grid_ops=frozenset("abd"))
    assert pr.chosen.plan == every[0] and pr.given_layout
    names = [c.plan.algorithm for c in pr.runners_up]
    assert len(names) == len(set(names)) and pr.chosen.plan.algorithm not in names
    for c in pr.runners_up:  # each the cheapest of its algorithm
        assert c.plan.time == min(pl.time for pl in every if pl.algorithm == c.plan.algorithm)
    out = _run(capsys, "-m", "4096", "-n", "4096", "-k", "4096", "--machine", "b200-nvl8", "--layout", "G,G,G")
    assert "BlockNonCyclic(2x4 grid)" in out and "as given" in out


def test_machine_and_nodes_change_the_constants(capsys):
    args = ("-m", "16384", "-n", "16384", "-k", "16384", "--dtype", "bfloat16")
    outs = {name: _run(capsys, *args, "--machine", name) for name in ("h100-nvl8", "b200-nvl8", "cpu")}
    assert len({o.split("model: ")[1].splitlines()[0] for o in outs.values()}) == 3
    two = _run(capsys, *args, "--machine", "h100-nvl8", "--nodes", "2")
    assert "16 GPUs: 2 nodes of 8" in two and "beta 50 GB/s" in two and "beta 450 GB/s" in outs["h100-nvl8"]
    h100, b200 = (_machines.PROFILES[n].model("bfloat16") for n in ("h100-nvl8", "b200-nvl8"))
    assert b200.gamma < h100.gamma and b200.beta < h100.beta
    # one node is NVLink, several InfiniBand per GPU (a collective spanning nodes pays IB)
    assert _machines.PROFILES["h200-nvl8"].model("float16", 4).beta == 1 / _machines.PROFILES["h200-nvl8"].network


def test_plan_chooses_the_layers_within_the_machines_memory(capsys, monkeypatch):
    """``dmatmul plan`` gives the planner the memory a rank of the named machine
    may count on (DMATMUL_MEMORY_FRACTION of a GPU's): 2.5-D SUMMA's layers are
    chosen within it (fewer when it is tight, none when nothing fits), as a
    product on that machine would choose them, and the memory line counts the
    layers chosen."""
    from dmatmul.algorithms import ALGORITHMS

    prof, model, p = plan_cli.machine_model("h100-nvl8", "bfloat16", 16)  # 128 GPUs: (q, c) = (4, 8) or (8, 2)
    n, alg = 32768, ALGORITHMS["summa25d"]

    def layered(memory):
        pr = plan_cli.project(n, n, n, p, "bfloat16", model, "GGG", memory)
        return pr, next((c for c in (pr.chosen, *pr.runners_up) if c.plan.algorithm == "summa25d"), None)

    free = layered(None)[1]
    assert free is not None
    blocks = 3 * n * n * 2 / p
    ring = next(k for k in alg.kernels if k.schedule == "ring")  # (the layers are chosen by the ring's memory)
    tight = blocks + alg.extra_bytes(_plan.Problem1D(n, n, n, p, 2, 4), ring) * 0.9
    pr, cand = layered(tight)
    assert cand is not None and cand.plan.nbytes > free.plan.nbytes  # fewer layers: more bytes received
    assert alg.layers(_plan.Problem1D(n, n, n, p, 2, 4, memory=tight)) != alg.layers(_plan.Problem1D(n, n, n, p, 2, 4))
    assert layered(blocks)[1] is None  # no room beyond the blocks: no layers fit
    monkeypatch.setenv("DMATMUL_MEMORY_FRACTION", "0.5")
    assert plan_cli.machine_memory(prof, p) == 0.5 * prof.memory
    out = _run(capsys, "-m", "4096", "-n", "4096", "-k", "4096", "--machine", "h100-nvl8", "--dtype", "bfloat16")
    assert f"(a plan may count on {0.5 * prof.memory / 2**30:.2f} GiB)" in out


def test_profiles_state_published_rates_and_efficiency():
    h100, h200, b200 = (_machines.PROFILES[n] for n in ("h100-nvl8", "h200-nvl8", "b200-nvl8"))
    assert h100.peak_for("bfloat16") == 989e12 and h100.peak_for("float32") == 495e12
    assert h100.peak_for("complex64") == h100.peak_for("float32") / 4
    assert h200.peak == h100.peak and h200.memory == 141e9 and h200.hbm == 4.8e12
    assert b200.peak_for("bfloat16") == 2250e12 and b200.link == 2 * h100.link
    assert h100.model("bfloat16").gamma == pytest.approx(1 / (0.65 * 989e12))
    assert {"h100-nvl8", "h200-nvl8", "b200-nvl8", "cpu", "here"} <= set(_machines.MACHINES)


@pytest.mark.parametrize("argv, message", [
    (["--machine", "h900"], "unknown machine 'h900'; known machines: h100-nvl8, h200-nvl8, b200-nvl8, cpu, here"),
    (["--layout", "X,Q,X"], "--layout 'X,Q,X': expected three letters"),
    (["--machine", "cpu", "--nodes", "2"], "--nodes 2: machine 'cpu' is one host's simulated devices"),
])
def test_plan_errors_say_what_is_known(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(["plan", "-m", "64", "-n", "64", "-k", "64", *argv])
    assert message in str(e.value)


def test_plan_imports_no_jax():
    code = ("import sys; from dmatmul.cli import main; main(['plan', '-m', '512', '-n', '512', '-k', '512']); "
            "assert 'jax' not in sys.modules, 'jax imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "algorithm:" in done.stdout


def test_published_points_of_scale_md_are_what_the_model_says():
    """docs/scale.md's predictions are the model's (recomputed here, so the doc cannot drift)."""
    from pathlib import Path

    text = (Path(__file__).parent.parent / "docs" / "scale.md").read_text()
    model = _machines.PROFILES["h100-nvl8"].model("float16")
    for p in (2, 4, 8):
        for schedule in ("ring", "one_shot"):
            with _plan.schedule(schedule):
                pr = plan_cli.project(1024 * p, 4096 * p, 4096, p, "float16", model, "XYY")
            assert f"{pr.chosen.plan.time * 1e6:.0f} us" in text, (p, schedule)


# --------------------------------------------------------------------------- #
# calibration that follows the machine
# --------------------------------------------------------------------------- #
def test_calibration_file_is_keyed_by_host_and_cores(monkeypatch, tmp_path):
    monkeypatch.delenv(_cost.MODEL_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(_cost.socket, "gethostname", lambda: "node 7/a")
    monkeypatch.setattr(_cost.os, "cpu_count", lambda: 16)
    sixteen = _cost.calibration_path()
    assert sixteen == tmp_path / "dmatmul" / "cost_model-node_7_a-16cores.json"
    monkeypatch.setattr(_cost.os, "cpu_count", lambda: 2)
    assert _cost.calibration_path() != sixteen  # another machine: another file
    _cost.save_models({"cpu/8": _cost.MachineModel(1e-5, 1e-9, 1e-10)})
    assert _cost.model_for("cpu", 8).gamma == 1e-10
    monkeypatch.setattr(_cost.os, "cpu_count", lambda: 16)
    assert _cost.model_for("cpu", 8) is _cost.DEFAULT_MODELS["cpu/8"]  # the 2-core file is not this machine's


def test_an_entry_of_another_device_kind_is_passed_over(monkeypatch, tmp_path):
    monkeypatch.setenv(_cost.MODEL_ENV, str(tmp_path / "m.json"))
    mine = _cost.MachineModel(1e-5, 1e-9, 1e-10)
    _cost.save_models({"gpu/8": mine}, meta={"device_kinds": {"gpu/8": "NVIDIA H100"}})
    _cost.save_models({"gpu/4": mine}, meta={"device_kinds": {"gpu/4": "NVIDIA H100"}})  # merged, not replaced
    assert json.loads((tmp_path / "m.json").read_text())["meta"]["device_kinds"] == {
        "gpu/8": "NVIDIA H100", "gpu/4": "NVIDIA H100"}
    assert _cost.model_for("gpu", 8, kind="NVIDIA H100").gamma == 1e-10
    assert _cost.model_for("gpu", 8, kind="NVIDIA H200") is _cost.DEFAULT_MODELS["gpu"]
    assert calibration.missing_counts([4, 8], "gpu", "NVIDIA H200", tmp_path / "m.json") == [4, 8]
    assert calibration.missing_counts([4, 8, 2], "gpu", "NVIDIA H100", tmp_path / "m.json") == [2]
    monkeypatch.setenv(_cost.CALIBRATE_ENV, "1")
    assert calibration.missing_counts([4, 8], "gpu", "NVIDIA H100", tmp_path / "m.json") == [4, 8]


class _FakeComm:
    """One rank's view of a broadcast: rank 0 sends, the others receive ``root_payload``."""

    def __init__(self, rank: int, root_payload=None):
        self.rank, self.root_payload, self.sent = rank, root_payload, None

    def Get_rank(self) -> int:
        return self.rank

    def bcast(self, obj, root=0):
        assert root == 0
        if self.rank == 0:
            self.sent = obj
            return obj
        assert obj is None  # only rank 0's value travels
        return self.root_payload


def test_every_rank_plans_with_rank_0s_calibration(monkeypatch, tmp_path):
    rank0 = _cost.MachineModel(3e-5, 1 / 7e9, 1 / 33e9)
    monkeypatch.setenv(_cost.MODEL_ENV, str(tmp_path / "rank0.json"))
    _cost.save_models({"cpu/4": rank0})
    root = _FakeComm(0)
    shared0 = _cost.share_calibration(root)
    # rank 1 has a file of its own, with other constants: rank 0's win
    monkeypatch.setenv(_cost.MODEL_ENV, str(tmp_path / "rank1.json"))
    _cost.save_models({"cpu/4": _cost.MachineModel(1e-3, 1e-8, 1e-8)})
    shared1 = _cost.share_calibration(_FakeComm(1, root.sent))
    for shared in (shared0, shared1):
        assert not isinstance(shared, str)
        _world.begin(_world.Runtime(rank=1, size=4, comm=None, local_rank=1, cost_models=shared))
        try:
            got = _cost.model_for("cpu", 4)
        finally:
            _world.end()
        assert (got.alpha, got.beta, got.gamma) == (rank0.alpha, rank0.beta, rank0.gamma)
    assert _cost.model_for("cpu", 4).alpha == 1e-3  # outside the runtime: this process's file


def test_a_file_rank_0_cannot_read_raises_on_every_rank(monkeypatch, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    monkeypatch.setenv(_cost.MODEL_ENV, str(bad))
    root = _FakeComm(0)
    assert isinstance(_cost.share_calibration(root), str)
    monkeypatch.setenv(_cost.MODEL_ENV, "default")  # rank 1 itself has none
    shared = _cost.share_calibration(_FakeComm(1, root.sent))
    _world.begin(_world.Runtime(rank=1, size=2, comm=None, local_rank=1, cost_models=shared))
    try:
        with pytest.raises(ValueError, match="is not a dmatmul calibration"):
            _cost.model_for("cpu", 2)
    finally:
        _world.end()


