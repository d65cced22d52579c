"""A product too large for memory raises MemoryError before anything is allocated
(CONTRACT section 6): dmatmul/_memory.py, the JAX and nvmath backends' needs."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

import dmatmul as dm
from dmatmul import _memory
from dmatmul._memory import HOST, Need

jax = pytest.importorskip("jax")
jnp = jax.numpy


@pytest.fixture(autouse=True)
def _fresh_verdicts():
    """No verdict kept from another test (a product judged to fit is not judged again for a second)."""
    _memory._fits.clear()
    yield
    _memory._fits.clear()


def _rss() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


# --------------------------------------------------------------------------- #
# the pure functions
# --------------------------------------------------------------------------- #
def test_judge_names_the_operand_the_bytes_needed_and_available():
    needs = [Need(HOST, "d", "the result as a numpy array", 40_000_000_000),
             Need(HOST, "d", "the result's blocks on 8 cpu devices", 40_000_000_000),
             Need(HOST, "b", "b's blocks on 8 cpu devices", 3_200_000)]
    words = {"d": "the result, 100000 x 100000 float32"}
    message = _memory.judge(needs, {HOST: 22_900_000_000}, shapes=words, fixes={"d": "split the result"})
    assert message is not None
    for part in ("d (the result, 100000 x 100000 float32)", "needs 80.0 GB on the host", "22.9 GB is available",
                 "40.0 GB for the result as a numpy array", "3.2 MB for b's blocks", "split the result", _memory.ENV):
        assert part in message, (part, message)
    assert _memory.judge(needs, {HOST: 80_003_200_000}, shapes=words) is None  # exactly what it needs: fits
    assert _memory.judge(needs, {HOST: None}, shapes=words) is None  # a place that does not say is not judged


def test_judge_names_the_operand_that_takes_most_where_it_does_not_fit():
    needs = [Need(HOST, "d", "the result as a numpy array", 10),
             Need("gpu", "d", "the result's block", 10), Need("gpu", "a", "a whole on every device", 1000)]
    message = _memory.judge(needs, {HOST: 100, "gpu": 500}, shapes={"a": "4096 x 64 float32"},
                            fixes={"a": "split a", "d on gpu": "not this one"})
    assert message is not None and message.startswith("a (4096 x 64 float32) needs 1.0 kB on gpu")
    assert "500 B is available" in message and "split a" in message
    assert _memory.shortfall(needs, {HOST: 5, "gpu": 5}) == (HOST, 10, 5)  # the first place that does not fit


def test_check_reads_the_host_and_can_be_switched_off(monkeypatch):
    needs = [Need(HOST, "d", "the result", 2000)]
    monkeypatch.setattr(_memory, "host_available", lambda: 1000)
    with pytest.raises(MemoryError, match="needs 2.0 kB on the host.*1.0 kB is available"):
        _memory.check(needs, shapes={})
    monkeypatch.setenv(_memory.ENV, "0")
    _memory.check(needs, shapes={})
    monkeypatch.delenv(_memory.ENV)
    monkeypatch.setattr(_memory, "host_available", lambda: 4000)
    _memory.check(needs, shapes={})
    monkeypatch.setattr(_memory, "host_available", lambda: 1000)
    _memory.check(needs, shapes={})  # judged to fit a moment ago: not read again


def test_the_host_reading_is_a_positive_figure():
    got = _memory.host_available()
    assert got is None or 0 < got < 1 << 60


# --------------------------------------------------------------------------- #
# products
# --------------------------------------------------------------------------- #
def _too_large() -> int:
    """N for an (N, 1) @ (1, N) float32 product whose result alone is twice what the host has now."""
    have = _memory.host_available()
    if have is None:
        pytest.skip("this host does not say how much memory it has")
    return max(100_000, -(-(math.isqrt(2 * have // 4) + 1) // 64) * 64)  # (a multiple of the devices: split evenly)


@pytest.mark.parametrize("kind", ["numpy", "jax"])
def test_a_result_larger_than_the_host_is_refused_before_it_is_allocated(kind):
    n = _too_large()
    a, b = np.ones((n, 1), np.float32), np.ones((1, n), np.float32)
    if kind == "jax":
        a, b = jnp.asarray(a), jnp.asarray(b)
    before, start = _rss(), time.monotonic()
    with pytest.raises(MemoryError) as info:
        dm.matmul(a, b)
    took, after = time.monotonic() - start, _rss()
    message = str(info.value)
    assert took < 10, took
    if before is not None and after is not None:
        assert after - before < 200e6, (before, after)  # nothing of the result was allocated
    gb = f"{n * n * 4 / 1e9:.1f} GB"
    assert message.startswith(f"d (the result, {n} x {n} float32) needs"), message
    assert "on the host" in message and "is available" in message and gb in message, message
    assert ("numpy" in message) == (kind == "numpy"), message  # the numpy result is counted (and its fix given)


def test_a_plan_too_large_still_explains_and_refuses_to_run():
    n = _too_large()
    mm = dm.Matmul(np.ones((n, 1), np.float32), np.ones((1, n), np.float32))
    assert "algorithm" in mm.explain()  # telling what would run allocates nothing
    with pytest.raises(MemoryError, match="d \\(the result"):
        mm.plan()
    with pytest.raises(MemoryError, match="d \\(the result"):
        mm.execute()
    mm.free()


def test_a_product_that_fits_the_figure_runs_and_one_that_does_not_is_refused(monkeypatch):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((256, 8)).astype(np.float32), rng.standard_normal((8, 256)).astype(np.float32)
    monkeypatch.setattr(_memory, "host_available", lambda: 1000)
    with pytest.raises(MemoryError, match="d \\(the result, 256 x 256 float32\\) needs .* 1.0 kB is available"):
        dm.matmul(a, b)
    monkeypatch.setenv(_memory.ENV, "off")
    np.testing.assert_allclose(dm.matmul(a, b), a @ b, rtol=1e-5, atol=1e-5)
    monkeypatch.delenv(_memory.ENV)
    monkeypatch.setattr(_memory, "host_available", lambda: 10**9)
    np.testing.assert_allclose(dm.matmul(a, b), a @ b, rtol=1e-5, atol=1e-5)


def test_an_operand_gathered_whole_on_every_device_is_named(monkeypatch):
    a, b = np.ones((4096, 64), np.float32), np.ones((64, 8), np.float32)
    R, X = dm.Replicated(), dm.Slab.X
    # a held whole by each of the 8 devices (8 x 1 MB), the result split (128 kB in all)
    monkeypatch.setattr(_memory, "host_available", lambda: 4_000_000)
    with pytest.raises(MemoryError) as info:
        dm.matmul(a, b, distribution=(R, R, X))
    assert str(info.value).startswith("a (4096 x 64 float32) needs"), info.value
    assert "give a a distribution that splits it" in str(info.value)


def test_devices_that_report_their_memory_are_judged_on_it(monkeypatch):
    from dmatmul.backends.jax import _backend, _compile

    a, b = np.ones((64, 32), np.float32), np.ones((32, 48), np.float32)
    plan = _backend.JaxBackend().plan(
        dm.Matmul(a, b, backend="jax", distribution=(dm.Slab.X, dm.Replicated(), dm.Slab.X))._spec,
        dm._matmul.Operands(a, b))
    needs, probes = plan.memory_needs()
    assert probes == {}  # CPU devices say nothing: they use the host's memory, where their blocks are counted
    assert {n.place for n in needs} == {HOST}
    device_bytes = sum(n.nbytes for n in needs if n.what != "the result as a numpy array")
    assert device_bytes >= (64 * 32 + 8 * 32 * 48 + 64 * 48) * 4  # a and the result split, b on every device

    class Device:
        def __init__(self, limit, used):
            self.stats = {"bytes_limit": limit, "bytes_in_use": used}

        def memory_stats(self):
            return self.stats

    assert _compile._device_room([Device(100, 10), Device(100, 40)]) == 60
    assert _compile._device_room([Device(100, 10), type("Cpu", (), {"memory_stats": lambda self: None})()]) is None


def test_the_repeated_call_path_does_not_judge_again(monkeypatch):
    a, b = jnp.ones((64, 32), jnp.float32), jnp.ones((32, 48), jnp.float32)
    dm.matmul(a, b)  # kept as a recent call
    calls = []
    monkeypatch.setattr(_memory, "check", lambda *args, **kw: calls.append(args))
    dm.matmul(a, b)
    assert calls == []


# --------------------------------------------------------------------------- #
# nvmath (the fake: numpy on the CPU, and a GPU that reports what it has)
# --------------------------------------------------------------------------- #
def test_nvmath_judges_the_gpu_and_the_host(fake_nvmath, monkeypatch):
    a, b = np.ones((300, 20), np.float32), np.ones((20, 400), np.float32)
    fake_nvmath.GPU_MEMORY[0] = 100_000  # 0.1 MB free: the result (480 kB) does not fit
    with pytest.raises(MemoryError) as info:
        dm.matmul(a, b, backend="nvmath")
    message = str(info.value)
    assert message.startswith("d (the result, 300 x 400 float32) needs"), message
    assert "on this process's GPU" in message and "100.0 kB is available" in message, message
    assert "24.0 kB for a's matrix copied there" in message, message
    fake_nvmath.GPU_MEMORY[0] = 10**9
    monkeypatch.setattr(_memory, "host_available", lambda: 1000)
    with pytest.raises(MemoryError, match="on the host"):
        dm.matmul(a, b, backend="nvmath")
    monkeypatch.setattr(_memory, "host_available", lambda: 10**9)
    np.testing.assert_allclose(dm.matmul(a, b, backend="nvmath"), a @ b)
