"""2.5-D SUMMA (``algorithm="summa25d"``): c layers of a q x q grid on P = q*q*c
devices, each layer's SUMMA on 1/c of K, then the layer reduce-scatter;
checked against numpy on 8 simulated CPU devices (2 x 2 x 2)."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import dmatmul as dm  # noqa: E402
from dmatmul import _cost, _plan, algorithms  # noqa: E402
from dmatmul.algorithms import summa25d  # noqa: E402
from dmatmul.testing.reference import assert_close, random_matrix, reference, reference_vjp  # noqa: E402
from _hlo import received_per_rank  # noqa: E402

X, Y, R = dm.Slab.X, dm.Slab.Y, dm.Replicated()
GRID = dm.ProcessGrid((2, 4))


def operands(seed, m, n, k, ta=False, tb=False, dtype="float32"):
    rng = np.random.default_rng(seed)
    return (random_matrix(rng, (k, m) if ta else (m, k), dtype), random_matrix(rng, (n, k) if tb else (k, n), dtype),
            random_matrix(rng, (m, n), dtype))


@pytest.mark.parametrize("schedule", ["ring", "one_shot"])
@pytest.mark.parametrize("m, n, k", [(64, 48, 40), (37, 23, 29), (13, 7, 5), (1, 1, 1), (5, 1, 3), (2, 17, 1)])
@pytest.mark.parametrize("ta, tb", list(itertools.product((False, True), repeat=2)))
def test_against_numpy_any_size_and_transposes(m, n, k, ta, tb, schedule):
    """Even, uneven, prime and size-1 products, every transpose, both schedules:
    numpy's answer, and the plan is the 2.5-D one on the (r, c, l) mesh."""
    a, b, _ = operands(m * 100 + n * 10 + k, m, n, k, ta, tb)
    with _plan.schedule(schedule), dm.Matmul(a, b, transpose_a=ta, transpose_b=tb, algorithm="summa25d",
                                             devices=8) as mm:
        got = mm.execute()
        assert mm.algorithm == "summa25d" and "mesh (r=2 x c=2 x l=2)" in mm.explain()
        assert mm._plan.cost.kernel.schedule == schedule
    assert_close(got, reference(a, b, transpose_a=ta, transpose_b=tb), "float32")


@pytest.mark.parametrize("dists", [
    (X, Y, X), (Y, X, Y), (R, R, X), (X, R, R),
    (dm.BlockNonCyclic(GRID),) * 3, (dm.BlockCyclic(dm.ProcessGrid((4, 2), layout="col"), (3, 2)),) * 3,
])
def test_any_distribution_is_re_laid_into_the_layers(dists):
    """Any input and result distribution: moved into the kernel's layouts and the
    result out of them (a 2-D grid's operands as Slab.X, on the layers' mesh)."""
    a, b, c = operands(3, 29, 31, 23)
    got = dm.matmul(a, b, c, beta=0.5, distribution=dists, algorithm="summa25d", devices=8)
    assert_close(got, reference(a, b, c, beta=0.5), "float32")


@pytest.mark.parametrize("epilog, bias_shape", [("relu", None), ("gelu_bias", (19,)), ("silu_bias", (1, 21))])
def test_c_beta_alpha_and_epilogues(epilog, bias_shape):
    a, b, c = operands(4, 19, 21, 17)
    bias = None if bias_shape is None else np.random.default_rng(5).standard_normal(bias_shape).astype(np.float32)
    got = dm.matmul(a, b, c, alpha=1.5, beta=-0.5, epilog=epilog, bias=bias, algorithm="summa25d", devices=8)
    assert_close(got, reference(a, b, c, alpha=1.5, beta=-0.5, epilog=epilog, bias=bias), "float32")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64", "complex64", "complex128"])
def test_dtypes(dtype):
    a, b, c = operands(6, 24, 20, 36, dtype=dtype)
    got = dm.matmul(a, b, c, beta=2.0, algorithm="summa25d", devices=8)
    assert got.dtype == a.dtype
    assert_close(got, reference(a, b, c, beta=2.0), dtype)


def test_empty_products_follow_blas():
    a, b, c = operands(7, 6, 5, 0)
    assert_close(dm.matmul(a, b, c, beta=3.0, algorithm="summa25d", devices=8), 3.0 * c.astype(np.float64),
                 "float32")
    assert dm.matmul(np.ones((0, 4), np.float32), np.ones((4, 3), np.float32), algorithm="summa25d",
                     devices=8).shape == (0, 3)


@pytest.mark.parametrize("schedule", ["ring", "one_shot"])
@pytest.mark.parametrize("ta, tb", [(False, False), (True, True)])
def test_gradients_against_numpy(schedule, ta, tb):
    """jax.grad through the 2.5-D kernel (its transpose: the reduce-scatter's
    all-gather, the layer's SUMMA transposed) and under jit; uneven sizes."""
    a, b, c = operands(8, 13, 11, 18, ta, tb)
    g = np.random.default_rng(9).standard_normal((13, 11)).astype(np.float32)

    def loss(x, y, z):
        d = dm.matmul(x, y, z, beta=0.5, epilog="gelu", transpose_a=ta, transpose_b=tb, algorithm="summa25d",
                      devices=8)
        return jnp.sum(d * g)

    want = reference_vjp(a, b, c, g, beta=0.5, epilog="gelu", transpose_a=ta, transpose_b=tb)
    with _plan.schedule(schedule):
        for f in (jax.grad(loss, argnums=(0, 1, 2)), jax.jit(jax.grad(loss, argnums=(0, 1, 2)))):
            got = f(jnp.asarray(a), jnp.asarray(b), jnp.asarray(c))
            for name, x in zip("abc", got):
                assert_close(np.asarray(x), want[name], "float32")


def test_jax_arrays_in_and_out():
    """jax.Array operands (sharded as Slab.X) in, a jax.Array on the same devices out."""
    a, b, _ = operands(10, 32, 16, 24)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("x",))
    spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))
    ja, jb = jax.device_put(a, spec), jax.device_put(b, spec)
    got = dm.matmul(ja, jb, algorithm="summa25d")
    assert isinstance(got, jax.Array) and got.sharding.device_set == set(jax.devices()[:8])
    assert_close(np.asarray(got), reference(a, b), "float32")


def test_jax_arrays_on_a_grid_whose_result_comes_back_replicated():
    """jax.Array operands with 2-D grid distributions whose result no sharding
    expresses (a cyclic, shifted grid layout): the result comes back replicated,
    and the product still runs on the layers' mesh (it was refused as needing
    one shared 2-D grid)."""
    a, b, c = operands(14, 12, 20, 16)
    g = dm.ProcessGrid((4, 2), layout="col")
    dists = (dm.BlockNonCyclic(g, first_process=(1, 1)), dm.BlockNonCyclic(g, first_process=(1, 0)),
             dm.BlockCyclic(g, (2, 4)))
    got = dm.matmul(jnp.asarray(a), jnp.asarray(b), jnp.asarray(c), beta=-0.5, distribution=dists,
                    algorithm="summa25d", devices=8)
    assert isinstance(got, jax.Array)
    assert_close(np.asarray(got), reference(a, b, c, beta=-0.5), "float32")


@pytest.mark.parametrize("devices", [1, 2, 4, 6])
def test_a_rank_count_that_is_no_layered_grid_is_refused(devices):
    """P not q*q*c with q >= 2 and c >= 2: a ValueError naming what it needs."""
    a, b, _ = operands(11, 8, 8, 8)
    with pytest.raises(ValueError, match=rf"summa25d.*q\*q\*c.*8 = 2\*2\*2.*runs on {devices}"):
        dm.matmul(a, b, algorithm="summa25d", devices=devices)


def test_an_empty_product_is_refused_on_a_rank_count_that_is_no_layered_grid():
    """N = 0 reads neither a nor b, but the algorithm named still needs its ranks,
    as for N = 1 (the long run of the matrix found it running)."""
    a = np.ones((1, 1), np.float32)
    for n in (0, 1):
        with pytest.raises(ValueError, match=r"summa25d.*q\*q\*c"):
            dm.matmul(a, np.ones((1, n), np.float32), algorithm="summa25d", devices=2)


def _kernel_bytes(mm, p):
    """Bytes every rank receives in the compiled kernel alone, its operands
    already in the layouts it takes (no move before nor after)."""
    from dmatmul.backends.jax import _kernels

    plan = mm._plan
    geom, kern = plan.geom, plan.kernel
    body = _kernels.body(plan.local, None)
    fn = jax.jit(jax.shard_map(body, mesh=geom.mesh, in_specs=(kern["a"].spec, kern["b"].spec),
                               out_specs=kern["d"].spec))
    args = [jax.ShapeDtypeStruct(kern[op].shape, jnp.float32, sharding=geom.sharding(kern[op])) for op in "ab"]
    with plan._own_context():
        return received_per_rank(fn.lower(*args).compile().as_text(), p)


@pytest.mark.parametrize("schedule", ["ring", "one_shot"])
def test_bytes_received_per_rank_against_summa_at_4096(schedule):
    """n = 4096 on 8 devices, each kernel on operands already in its layouts:
    2.5-D SUMMA (2 x 2 x 2) receives at most 0.8x what SUMMA on the 2 x 4 grid
    does, counted in the compiled programs (3n^2/8 against n^2/2 words in the
    backend-neutral model; JAX's SUMMA ring broadcasts its panels in ppermute
    rounds, 5n^2/8), and the plan's modelled kernel bytes are the count."""
    n, p = 4096, 8
    a = np.zeros((n, n), np.float32)
    with _plan.schedule(schedule):
        with dm.Matmul(a, a, algorithm="summa25d", devices=p) as layered:
            layered.plan()
            got = _kernel_bytes(layered, p)
            cost = layered._plan.cost
        with dm.Matmul(a, a, distribution=dm.BlockNonCyclic(GRID), algorithm="summa", devices=p) as flat:
            flat.plan()
            summa, summa_cost = _kernel_bytes(flat, p), flat._plan.cost
            assert not summa_cost.moves
    assert got.max() == got.min() == pytest.approx(cost.kernel_bytes)
    assert summa.max() == summa.min() == pytest.approx(summa_cost.kernel_bytes)
    assert got.max() <= 0.8 * summa.max(), (got.max() / n**2 / 4, summa.max() / n**2 / 4)
    neutral = _plan.kernel_cost(_plan.Problem1D(n, n, n, p, 4, 4), cost.kernel)[0]
    assert neutral == 3 * n * n / 8 * 4
    if schedule == "one_shot":  # the panels gathered whole: each byte once, as the neutral model counts
        assert got.max() == neutral
    print(schedule, got.max() / (n * n * 4), summa.max() / (n * n * 4))


def test_auto_takes_it_only_where_the_model_says_so_moves_included():
    """auto (the 32-device CPU model; on 8 its re-lays, each byte received also
    copied twice, cost about what it saves): a large square product (n = 16384) on
    AllGather+GEMM's slabs is cheapest re-laid into the layers (the
    three all-to-alls cost less than the bytes 2.5-D SUMMA saves); a small one,
    or one whose operands are replicated (a local GEMM), is not; the plan
    chosen is the cheapest, its moves counted."""
    model = _cost.model_for("cpu", 32)
    xyx = {"a": "M", "b": "N", "d": "M"}
    large, small = _plan.Problem1D(16384, 16384, 16384, 32, 4, 4), _plan.Problem1D(256, 256, 256, 32, 4, 4)
    best = _plan.choose(large, xyx, algorithm="auto", model=model, transposes=(False, False))
    assert best.algorithm == "summa25d" and {mv.operand for mv in best.moves} == {"a", "b", "d"}
    others = [pl for pl in _plan.plans(large, xyx, model) if pl.algorithm != "summa25d"]
    assert best.time < others[0].time and best.nbytes < others[0].nbytes
    assert _plan.choose(small, xyx, algorithm="auto", model=model, transposes=(False, False)).algorithm != "summa25d"
    rrm = {"a": "R", "b": "R", "d": "M"}
    assert _plan.choose(large, rrm, algorithm="auto", model=model, transposes=(False, False)).algorithm == "local"
    # on 4 ranks (no q*q*c with q, c >= 2) it is no candidate at all
    four = _plan.Problem1D(16384, 16384, 16384, 4, 4, 4)
    assert all(pl.algorithm != "summa25d" for pl in _plan.plans(four, xyx, model))


def test_the_layers_follow_the_memory_allowed():
    """On 32 ranks (2 x 2 x 8 or 4 x 4 x 2), a long K: 8 layers receive the
    fewest bytes and hold the most; a limit below that takes 2 layers."""
    alg = algorithms.ALGORITHMS["summa25d"]
    pr = _plan.Problem1D(1024, 1024, 65536, 32, 4, 4)
    free = alg.layers(pr)
    assert free == (2, 8)
    extra = {qc: alg._extra(1024, 1024, 65536, qc, 4, 4, False) for qc in summa25d.layouts(32)}
    other = next(qc for qc in extra if qc != free)
    assert alg._bytes(pr, free) < alg._bytes(pr, other)
    try:
        alg.memory_limit = (extra[free] + extra[other]) / 2 if extra[other] < extra[free] else extra[other]
        assert alg.layers(pr) == (other if extra[other] < extra[free] else free)
        alg.memory_limit = min(extra.values()) / 2  # nothing fits: no candidate, and named it is refused
        assert not alg.runs_on(pr) and "DMATMUL_MEMORY_FRACTION" in alg.refusal(pr)
        assert all(pl.algorithm != "summa25d" for pl in _plan.plans(pr, {"a": "M", "b": "N", "d": "M"},
                                                                     _cost.model_for("cpu", 32)))
        with pytest.raises(ValueError, match=r"summa25d.*MB per rank.*DMATMUL_MEMORY_FRACTION"):
            alg.layers(pr)
    finally:
        alg.memory_limit = None


def test_the_layers_follow_the_problems_memory():
    """Without a set limit, the memory a rank may hold (Problem1D.memory, the
    backend's devices') less its blocks bounds the layers: ample memory takes c
    up to P/4 (2 x 2 x 8 on 32), less takes 2 layers, a tiny one none."""
    alg = algorithms.ALGORITHMS["summa25d"]
    base = _plan.Problem1D(1024, 1024, 65536, 32, 4, 4)
    blocks = (1024 * 65536 * 2 + 1024 * 1024) / 32 * 4
    extra = {qc: alg._extra(1024, 1024, 65536, qc, 4, 4, False) for qc in summa25d.layouts(32)}
    assert extra[(2, 8)] > extra[(4, 2)]
    at = lambda room: dataclasses.replace(base, memory=blocks + room)  # noqa: E731
    assert alg.layers(at(extra[(2, 8)])) == (2, 8) and alg.layers(at(1e12)) == (2, 8)
    assert alg.layers(at(extra[(2, 8)] - 1)) == (4, 2)
    assert alg.runs_on(at(extra[(4, 2)])) and not alg.runs_on(at(extra[(4, 2)] - 1))
    assert not alg.runs_on(dataclasses.replace(base, memory=blocks / 2))  # not even the blocks


def test_memory_fraction_from_the_environment(monkeypatch):
    """DMATMUL_MEMORY_FRACTION: of the devices' memory (CPU: the host's share per
    device) a plan counts on. Tiny: summa25d refused by name, not chosen by auto;
    not a fraction: a ValueError naming the variable."""
    from dmatmul import _memory

    class Device:
        def memory_stats(self):
            return {"bytes_limit": 80 * 10**9, "bytes_in_use": 70 * 10**9}

    assert _memory.plan_budget([Device()] * 8) == 0.8 * 80 * 10**9  # the memory it has, not what is free
    assert _memory.plan_budget(jax.devices()[:8]) == pytest.approx(0.8 * _memory.host_total() / 8)
    a, b, _ = operands(15, 64, 64, 64)
    monkeypatch.setenv("DMATMUL_MEMORY_FRACTION", "0.5")
    assert _memory.plan_budget([Device()]) == 40 * 10**9
    assert_close(dm.matmul(a, b, algorithm="summa25d", devices=8), reference(a, b), "float32")
    monkeypatch.setenv("DMATMUL_MEMORY_FRACTION", "1e-12")  # (read as a product is planned: a new one)
    a, b, _ = operands(16, 64, 64, 48)
    with pytest.raises(ValueError, match=r"summa25d.*needs .* MB per rank.*DMATMUL_MEMORY_FRACTION"):
        dm.matmul(a, b, algorithm="summa25d", devices=8)
    with dm.Matmul(a, b, devices=8) as mm:
        assert mm.algorithm != "summa25d"
    monkeypatch.setenv("DMATMUL_MEMORY_FRACTION", "half")
    with pytest.raises(ValueError, match=r"DMATMUL_MEMORY_FRACTION='half': expected a fraction in \(0, 1\]"):
        dm.matmul(a, b[:, :40], algorithm="summa25d", devices=8)


def test_explain_states_the_bound_it_is_measured_against():
    """explain(): the bound is the larger of the memory-dependent one (0 on 8
    ranks: vacuous) and the memory-independent one (3-D regime here, computed
    below), each with its formula and source; the ratio of summa25d's bytes to it."""
    import re

    n, p = 512, 8
    independent = (3 * (n ** 3 / p) ** (2 / 3) - 3 * n * n / p) * 4  # bytes, float32
    a = np.ones((n, n), np.float32)
    with dm.Matmul(a, a, distribution=(X, Y, X), algorithm="summa25d", devices=p) as mm:  # (replicated: no bound)
        text = mm.explain()
    assert "bound is 0" not in text
    assert f"= max(memory-dependent 0 B, memory-independent {independent / 1024:.2f} KiB): the memory-independent" \
        in text
    assert summa25d.BOUND_FORMULA in text and summa25d.INDEPENDENT_FORMULA in text and "SPAA 2012" in text
    modelled = float(re.search(r"modelled: +([\d.]+) KiB", text).group(1)) * 1024
    assert f"summa25d's bytes: {modelled / independent:.2f}x the bound" in text
