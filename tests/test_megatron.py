"""Megatron-style shardings read as they are (contract section 3a): with
``distribution=None``, ``dm.matmul(a, b)`` takes what ``a @ b`` takes on a
(data, model) mesh, runs one product per group of ranks along the axes the
shardings leave independent, and shards the result as ``jnp.matmul`` does on
an Auto mesh. Every result is checked against numpy; the compiled program is
read for its collectives (nothing of a whole operand gathered where nothing
needs to move)."""

from __future__ import annotations

import re

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

import dmatmul as dm  # noqa: E402
from dmatmul.testing.reference import assert_close, reference  # noqa: E402

RNG = np.random.default_rng(7)
M, K, N = 16, 32, 24
A = RNG.standard_normal((M, K)).astype(np.float32)
B = RNG.standard_normal((K, N)).astype(np.float32)
W2 = RNG.standard_normal((N, K)).astype(np.float32)

#: (a's spec, b's spec): the issue's shardings, and their transposed forms
CASES = {
    "x-rows@w-cols": (P("data", None), P(None, "model")),
    "tokens@w-cols": (P(("data", "model"), None), P(None, "model")),
    "k-split": (P(None, "model"), P("model", None)),
    "rows-k@k": (P("data", "model"), P("model", None)),
    "w-cols@x-rows^T": (P(None, "data"), P("model", None)),  # (used transposed: see test_transposed)
}


def mesh_of(kind: str):
    types = (AxisType.Explicit if kind == "explicit" else AxisType.Auto,) * 2
    return jax.make_mesh((2, 4), ("data", "model"), axis_types=types)


def put(x, mesh, spec):
    return jax.device_put(x, NamedSharding(mesh, spec))


def collectives(hlo: str) -> dict[str, int]:
    return {w: len(re.findall(rf" {w}(-start)?\(", hlo))
            for w in ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")}


def xla_sharding(sa, sb, a=A, b=B):
    """What jnp.matmul gives the same operands on an Auto mesh."""
    auto = mesh_of("auto")
    return (put(a, auto, sa) @ put(b, auto, sb)).sharding


@pytest.mark.parametrize("call", ["eager", "jit"])
@pytest.mark.parametrize("kind", ["explicit", "auto"])
@pytest.mark.parametrize("case", [c for c in CASES if "^T" not in c])
def test_megatron_shardings_are_read_as_they_are(case, kind, call):
    sa, sb = CASES[case]
    mesh = mesh_of(kind)
    a, b = put(A, mesh, sa), put(B, mesh, sb)
    d = (dm.matmul if call == "eager" else jax.jit(dm.matmul))(a, b)
    assert_close(np.asarray(d), reference(A, B), "float32")
    assert d.sharding.mesh.shape == mesh.shape
    # (inside jit on an Auto mesh the product is left to XLA's partitioner, which gives jnp.matmul's sharding)
    assert d.sharding.is_equivalent_to(xla_sharding(sa, sb), 2), (d.sharding, xla_sharding(sa, sb))


def test_transposed():
    mesh = mesh_of("explicit")
    a, b = put(A.T.copy(), mesh, P(None, "data")), put(B.T.copy(), mesh, P("model", None))
    d = dm.matmul(a, b, transpose_a=True, transpose_b=True)
    assert_close(np.asarray(d), reference(A, B), "float32")
    assert d.sharding.is_equivalent_to(NamedSharding(mesh, P("data", "model")), 2), d.sharding


def test_explain_says_what_is_independent_and_what_moves():
    mesh = mesh_of("explicit")
    with dm.Matmul(put(A, mesh, P(("data", "model"), None)), put(B, mesh, P(None, "model"))) as mm:
        text = mm.explain()
        assert_close(np.asarray(mm.execute()), reference(A, B), "float32")
    assert "independent: mesh axis 'data' (2) splits a's rows (M) only; nothing crosses it" in text, text
    assert "per group (ranks along model; 4 ranks)" in text, text
    assert "a all-gathered" in text and "roles a:M b:N result:N" in text, text  # what moves, within a group
    with dm.Matmul(put(A, mesh, P(None, "model")), put(B, mesh, P("model", None))) as mm:
        text = mm.explain()
    assert "mesh axis 'data' (2) splits neither operand" in text, text
    assert "GEMM + psum" in text and "result  Sharded(ProcessMesh((2, 4), ('data', 'model')), (None, None))" in text


def test_nothing_moves_where_nothing_needs_to():
    """x P(data, None) @ W P(None, model): each device its block, no collective;
    the Megatron MLP forward: one all-reduce, no all-gather (as XLA's own)."""
    mesh = mesh_of("explicit")
    x, w1, w2 = put(A, mesh, P("data", None)), put(B, mesh, P(None, "model")), put(W2, mesh, P("model", None))
    hlo = jax.jit(dm.matmul).lower(x, w1).compile().as_text()
    assert sum(collectives(hlo).values()) == 0, collectives(hlo)

    def mlp(x, w1, w2):
        return dm.matmul(jax.nn.gelu(dm.matmul(x, w1)), w2)

    out = jax.jit(mlp)(x, w1, w2)
    assert_close(np.asarray(out), np.asarray(jax.nn.gelu(A @ B) @ W2), "float32")
    assert out.sharding.is_equivalent_to(NamedSharding(mesh, P("data", None)), 2), out.sharding
    counts = collectives(jax.jit(mlp).lower(x, w1, w2).compile().as_text())
    assert counts == {"all-gather": 0, "all-reduce": 1, "reduce-scatter": 0, "all-to-all": 0,
                      "collective-permute": 0}, counts


def test_grad_and_vmap():
    mesh = mesh_of("explicit")
    x, w1, w2 = put(A, mesh, P("data", None)), put(B, mesh, P(None, "model")), put(W2, mesh, P("model", None))

    def loss(f, x, w1, w2):
        return (f(jax.nn.gelu(f(x, w1)), w2) ** 2).sum()

    got = jax.jit(jax.grad(lambda *a: loss(dm.matmul, *a), argnums=(0, 1, 2)))(x, w1, w2)
    want = jax.grad(lambda *a: loss(jnp.matmul, *a), argnums=(0, 1, 2))(A, B, W2)
    for g, w, arg in zip(got, want, (x, w1, w2)):
        assert_close(np.asarray(g), np.asarray(w), "float32")
        assert g.sharding.is_equivalent_to(arg.sharding, 2), g.sharding  # each gradient as its parameter
    with jax.set_mesh(mesh):  # eager grad (outside set_mesh JAX's own sum of an Explicit array has no devices)
        g = jax.grad(lambda a, b: dm.matmul(a, b).sum(), argnums=1)(x, w1)
    assert_close(np.asarray(g), np.asarray(jax.grad(lambda a, b: (a @ b).sum(), argnums=1)(A, B)), "float32")
    xs = put(np.stack([A, 2 * A]), mesh, P(None, "data", None))
    d = jax.vmap(dm.matmul, in_axes=(0, None))(xs, w1)
    assert_close(np.asarray(d), np.stack([A @ B, 2 * A @ B]), "float32")


def test_bias_and_epilogue():
    mesh = mesh_of("explicit")
    bias = RNG.standard_normal((1, N)).astype(np.float32)
    x, w = put(A, mesh, P("data", None)), put(B, mesh, P(None, "model"))
    d = dm.matmul(x, w, epilog="gelu_bias", bias=put(bias, mesh, P(None, "model")), alpha=0.5)
    assert_close(np.asarray(d), np.asarray(jax.nn.gelu(0.5 * (A @ B) + bias)), "float32")
    assert d.sharding.is_equivalent_to(NamedSharding(mesh, P("data", "model")), 2), d.sharding


@pytest.mark.parametrize("what", ["megatron", "batch split"])
def test_repeated_eager_calls_skip_the_front_end_and_stay_right(what, monkeypatch):
    """A second eager dm.matmul like a first one runs the first one's plan through
    its kept runner (no Matmul is made: no checks, no planning, no memory
    judgement), on new values of the same layout, and gets numpy's product; a
    deleted operand takes the full path, which names it."""
    from dmatmul import _matmul

    mesh = mesh_of("auto")
    if what == "megatron":
        sa, sb, shape_a, shape_b = P("data", None), P(None, "model"), (16, 24), (24, 32)
    else:
        sa, sb, shape_a, shape_b = P(("data", "model"), None, None), P(), (8, 6, 5), (5, 7)
    rng = np.random.default_rng(7)
    x0, x1 = (rng.standard_normal(shape_a).astype(np.float32) for _ in range(2))
    w = rng.standard_normal(shape_b).astype(np.float32)
    wj = put(w, mesh, sb)
    first = dm.matmul(put(x0, mesh, sa), wj)
    assert_close(np.asarray(first), reference(x0, w), "float32")
    made = []
    real = _matmul.Matmul.__init__
    monkeypatch.setattr(_matmul.Matmul, "__init__", lambda self, *a, **k: made.append(1) or real(self, *a, **k))
    x1j = put(x1, mesh, sa)
    d = dm.matmul(x1j, wj)
    assert made == [], "the repeated call was planned again"
    assert_close(np.asarray(d), reference(x1, w), "float32")
    assert d.sharding == first.sharding
    x1j.delete()
    with pytest.raises(ValueError, match="a is a deleted jax.Array"):
        dm.matmul(x1j, wj)
    assert made == [1]


@pytest.mark.parametrize("numpy_side", ["a", "b"])
@pytest.mark.parametrize("case", ["x-rows@w-cols", "k-split"])
def test_a_numpy_operand_beside_a_megatron_sharding(case, numpy_side):
    """A numpy operand (no placement of its own) beside a jax.Array on a Megatron
    sharding is whole on that mesh, as jnp.matmul takes it: the product runs
    (it was refused, "replicates over mesh axis ...", eagerly though it ran under
    jax.vjp; found by the differential matrix) with numpy's values and
    jnp.matmul's sharding on an Auto mesh."""
    sa, sb = CASES[case]
    mesh = mesh_of("auto")
    a, b = (A, put(B, mesh, sb)) if numpy_side == "a" else (put(A, mesh, sa), B)
    d = dm.matmul(a, b)
    assert_close(np.asarray(d), reference(A, B), "float32")
    assert d.sharding.is_equivalent_to((a @ b).sharding, 2), (d.sharding, (a @ b).sharding)


# --- inside jit on an Auto mesh: left to XLA's partitioner (backends/jax/_xla.py) ---------------------------

def _traced_matmul(*args, **kw):
    """dm.matmul under jax.jit, with the plan's algorithm and explain() of the traced call."""
    told = {}

    def f(*xs):
        with dm.Matmul(*xs, **kw) as mm:
            d = mm.execute()
            told.update(algorithm=mm.algorithm, text=mm.explain())
        return d

    return jax.jit(f)(*args), told


@pytest.mark.parametrize("case", [c for c in CASES if "^T" not in c])
def test_inside_jit_on_an_auto_mesh_the_product_is_jnp_matmuls(case):
    """Inside jit an Auto type says nothing of the layout: the product is left to
    XLA, so it compiles to what jnp.matmul compiles to (same collectives) and the
    result has jnp.matmul's sharding; explain() says so."""
    sa, sb = CASES[case]
    mesh = mesh_of("auto")
    a, b = put(A, mesh, sa), put(B, mesh, sb)
    d, told = _traced_matmul(a, b)
    assert_close(np.asarray(d), reference(A, B), "float32")
    assert d.sharding.is_equivalent_to(jax.jit(jnp.matmul)(a, b).sharding, 2), d.sharding
    assert told["algorithm"] == "xla", told
    assert "left to XLA" in told["text"] and "sharded as jnp.matmul's" in told["text"], told["text"]
    ours = collectives(jax.jit(dm.matmul).lower(a, b).compile().as_text())
    assert ours == collectives(jax.jit(jnp.matmul).lower(a, b).compile().as_text()), ours


def test_left_to_xla_keeps_every_option_and_the_batch():
    """Batched operands, transposes, c, bias, alpha/beta and an epilogue, and the
    gradients, inside jit on an Auto mesh: numpy's values, and the batch split
    where jnp.matmul keeps it."""
    mesh = mesh_of("auto")
    xs = RNG.standard_normal((4, 3, K, M)).astype(np.float32)  # stored transposed: op(a) = a^T
    w = RNG.standard_normal((N, K)).astype(np.float32)  # stored transposed too
    c = RNG.standard_normal((4, 3, M, N)).astype(np.float32)
    bias = RNG.standard_normal((1, N)).astype(np.float32)
    args = (put(xs, mesh, P("data", None, None, None)), put(w, mesh, P("model", None)),
            put(c, mesh, P("data", None, None, None)), put(bias, mesh, P()))
    kw = dict(transpose_a=True, transpose_b=True, alpha=0.5, beta=2.0, epilog="gelu_bias")

    def f(x, w, c, bias):
        return dm.matmul(x, w, c, bias=bias, **kw)

    want = jax.nn.gelu(0.5 * np.swapaxes(xs, -1, -2) @ w.T + 2.0 * c + bias)
    d = jax.jit(f)(*args)
    assert_close(np.asarray(d), np.asarray(want), "float32")
    assert d.sharding.spec[0] == "data", d.sharding  # the batch stays where it is split
    loss = lambda mm: lambda x, w, c, bias: (mm(x, w, c, bias) ** 2).sum()  # noqa: E731
    got = jax.jit(jax.grad(loss(f), argnums=(0, 1)))(*args)
    ref = jax.grad(loss(lambda x, w, c, bias: jax.nn.gelu(0.5 * jnp.swapaxes(x, -1, -2) @ w.T + 2.0 * c + bias)),
                   argnums=(0, 1))(xs, w, c, bias)
    for g, r in zip(got, ref):
        assert_close(np.asarray(g), np.asarray(r), "float32")


@pytest.mark.parametrize("how", ["distribution", "algorithm", "explicit mesh", "no mesh"])
def test_dmatmuls_kernels_where_the_layout_is_known_or_asked(how):
    """Not left to XLA: a distribution or an algorithm named, an Explicit mesh
    (its types say the layout), or no mesh of the user's (dmatmul spreads the product)."""
    sa, sb = CASES["x-rows@w-cols"]
    mesh = mesh_of("explicit" if how == "explicit mesh" else "auto")
    a, b = (A, B) if how == "no mesh" else (put(A, mesh, sa), put(B, mesh, sb))
    kw = {"distribution": dm.Slab.X} if how == "distribution" else {"algorithm": "allgather"} if how == "algorithm" else {}
    d, told = _traced_matmul(a, b, **kw)
    assert_close(np.asarray(d), reference(A, B), "float32")
    assert told["algorithm"] in dm.ALGORITHMS and "left to XLA" not in told["text"], told


@pytest.mark.parametrize("case", [c for c in CASES if "^T" not in c])
def test_eager_vjp_and_jvp_on_an_auto_mesh_read_the_values_behind_the_tracers(case):
    """Under eager jax.vjp/jax.jvp the tracers' Auto types hide the layout, but the
    concrete values behind them name it: read as they are, the result has
    jnp.matmul's sharding, and the cotangents are numpy's."""
    sa, sb = CASES[case]
    mesh = mesh_of("auto")
    a, b = put(A, mesh, sa), put(B, mesh, sb)
    want = jax.jit(jnp.matmul)(a, b).sharding
    d, pull = jax.vjp(dm.matmul, a, b)
    assert_close(np.asarray(d), reference(A, B), "float32")
    assert d.sharding.is_equivalent_to(want, 2), (d.sharding, want)
    ga, gb = pull(d)
    assert_close(np.asarray(ga), np.asarray(d) @ B.T, "float32")
    assert_close(np.asarray(gb), A.T @ np.asarray(d), "float32")
    d2, t = jax.jvp(dm.matmul, (a, b), (a, b))
    assert d2.sharding.is_equivalent_to(want, 2), (d2.sharding, want)
    assert_close(np.asarray(t), 2 * reference(A, B), "float32")
