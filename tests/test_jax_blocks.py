"""dmatmul.jax: allgather_matmul and matmul_reduce_scatter inside the user's shard_map.

Every result and gradient is checked against the formulation the functions
claim to equal (``all_gather(x) @ y``, ``psum_scatter(x @ y)``), run through
the same ``shard_map`` with the same specs, and differentiated by ``jax.grad``.

The case matrix (mesh shape x axis types x ring axes x operation x operand
layout x dtype x local size x precision x check_vma, under jit) is covered
pairwise by a fixed greedy selection; DMATMUL_LONG=1 adds 300 random cases,
eager ones (shard_map outside jit) among them.
"""

from __future__ import annotations

import itertools
import os
import pathlib
import random
import re
import zlib

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

import dmatmul.jax as dmj  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
LONG = os.environ.get("DMATMUL_LONG", "") not in ("", "0")

PARAMS: dict[str, list] = {
    "mesh": [(8,), (2, 4), (4, 2), (1, 8), (8, 1)],
    "types": ["explicit", "auto"],
    # on a 1-D mesh ("model",): "model" and "data,model" mean "model", "data" and "model,data" mean ("model",)
    "axis": ["model", "data", "data,model", "model,data"],
    "op": ["allgather_matmul", "matmul_reduce_scatter"],
    "operands": ["split", "replicated"],  # the ring splits y (TP weights) / both operands replicated over it
    "dtype": ["float32", "bfloat16", "float64", "complex64", "bfloat16->float32"],  # "->": preferred_element_type
    "m": [3, 5, 7],  # local rows of x (allgather_matmul) or of the result (matmul_reduce_scatter)
    "precision": [None, "highest", "DEFAULT"],
    "jit": [True, False],
    "check_vma": [True, False],
}
TOL = {"float32": 1e-5, "complex64": 1e-5, "float64": 1e-13, "bfloat16": 2e-2}  # by the compared array's dtype


def pairwise(params: dict[str, list], seed: int = 0, candidates: int = 60) -> list[dict]:
    """A small list of cases in which every pair of values of two parameters occurs."""
    rng = random.Random(seed)
    names = list(params)
    todo = {
        (a, i, b, j)
        for a, b in itertools.combinations(names, 2)
        for i in range(len(params[a]))
        for j in range(len(params[b]))
    }
    cases = []
    while todo:
        best, best_cover = None, -1
        for _ in range(candidates):
            pick = {n: rng.randrange(len(params[n])) for n in names}
            cover = sum((a, pick[a], b, pick[b]) in todo for a, b in itertools.combinations(names, 2))
            if cover > best_cover:
                best, best_cover = pick, cover
        assert best is not None
        todo -= {(a, best[a], b, best[b]) for a, b in itertools.combinations(names, 2)}
        cases.append({n: params[n][best[n]] for n in names})
    return cases


def random_cases(params: dict[str, list], count: int, seed: int = 1) -> list[dict]:
    rng = random.Random(seed)
    return [{n: rng.choice(v) for n, v in params.items()} for _ in range(count)]


# eager shard_map runs op by op (seconds per case): the pairwise cases run under jit, eager ones in long mode
PAIRWISE = {**PARAMS, "jit": [True]}
LONG_PARAMS = {**PARAMS, "dtype": [*PARAMS["dtype"], "bfloat16*float32"]}  # "*": mixed inputs
CASES = pairwise(PAIRWISE) + (random_cases(LONG_PARAMS, 300) if LONG else [])


def case_id(c: dict) -> str:
    mesh = "x".join(map(str, c["mesh"]))
    return (
        f"{c['op'][:6]}-{mesh}{c['types'][0]}-{c['axis']}-{c['operands'][:3]}-{c['dtype']}-m{c['m']}"
        f"-{c['precision']}-{'jit' if c['jit'] else 'eager'}-{'vma' if c['check_vma'] else 'novma'}"
    )


# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #
def make_mesh(shape: tuple[int, ...], types: str) -> jax.sharding.Mesh:
    names = ("model",) if len(shape) == 1 else ("data", "model")
    kind = AxisType.Explicit if types == "explicit" else AxisType.Auto
    mesh = jax.make_mesh(shape, names, axis_types=(kind,) * len(shape))
    if types == "explicit":
        assert jax.make_mesh(shape, names).axis_types == mesh.axis_types  # make_mesh's default
    return mesh


def ring_axis(mesh: jax.sharding.Mesh, code: str):
    if len(mesh.axis_names) == 1:
        return "model" if code in ("model", "data,model") else ("model",)
    return code if "," not in code else tuple(code.split(","))


def dtypes(code: str) -> tuple[str, str, str | None]:
    """(x dtype, y dtype, preferred_element_type)."""
    if code == "bfloat16*float32":
        return "bfloat16", "float32", None
    if code == "bfloat16->float32":
        return "bfloat16", "bfloat16", "float32"
    return code, code, None


def random_array(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> jax.Array:
    a = rng.standard_normal(shape)
    if dtype.startswith("complex"):
        a = a + 1j * rng.standard_normal(shape)
    return jnp.asarray(a, dtype=dtype)


def layout(op: str, operands: str, mesh, axis, m: int, k: int = 4, n: int = 2):
    """Global shapes and specs of x, y and the result for ``op`` with ring ``axis``."""
    ring = axis if isinstance(axis, tuple) else (axis,)
    other = tuple(a for a in mesh.axis_names if a not in ring)
    o = other[0] if other else None
    p_ring = int(np.prod([mesh.shape[a] for a in ring]))
    p_other = int(np.prod([mesh.shape[a] for a in other]))
    rows = (*other, *ring)  # split over every device: the ring's ranks within each group of the others
    if op == "allgather_matmul":
        x = ((p_other * p_ring * m, k), P(rows, None))
        y = ((k, p_ring * n), P(None, ring)) if operands == "split" else ((k, n), P())
        z = P(o, ring)
    else:
        if operands == "split":  # TP's second GEMM: K split over the ring, partial sums reduced
            x = ((p_other * p_ring * m, p_ring * k), P(o, ring))
            y = ((p_ring * k, n), P(ring, None))
        else:
            x = ((p_other * p_ring * m, k), P(o, None))
            y = ((k, n), P())
        z = P(rows, None)
    return x, y, z


def references(op: str, axis, precision, preferred, bidirectional: bool = False):
    def ref(x, y):
        dot = lambda a, b: jnp.dot(a, b, precision=precision, preferred_element_type=preferred)  # noqa: E731
        if op == "allgather_matmul":
            return dot(lax.all_gather(x, axis, axis=0, tiled=True), y)
        return lax.psum_scatter(dot(x, y), axis, scatter_dimension=0, tiled=True)

    def ours(x, y):
        kw = {"bidirectional": True} if bidirectional else {}
        return getattr(dmj, op)(x, y, axis_name=axis, precision=precision, preferred_element_type=preferred, **kw)

    return ours, ref


def assert_close(got: jax.Array, want: jax.Array, what: str) -> None:
    tol = TOL[str(want.dtype)]
    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.shape, want.shape, got.dtype, want.dtype)
    g, w = np.asarray(got).astype(np.complex128), np.asarray(want).astype(np.complex128)
    scale = max(np.abs(w).max(), 1.0)
    err = np.abs(g - w).max() / scale
    assert err <= tol, f"{what}: max error {err:.3g} (relative to max |ref| {scale:.3g}) > {tol}"


def run_case(c: dict) -> None:
    mesh = make_mesh(c["mesh"], c["types"])
    axis = ring_axis(mesh, c["axis"])
    xdt, ydt, preferred = dtypes(c["dtype"])
    precision = getattr(lax.Precision, c["precision"]) if c["precision"] == "DEFAULT" else c["precision"]
    (xshape, xspec), (yshape, yspec), zspec = layout(c["op"], c["operands"], mesh, axis, c["m"])
    rng = np.random.default_rng(zlib.crc32(case_id(c).encode()))
    with jax.set_mesh(mesh):
        x = jax.device_put(random_array(rng, xshape, xdt), NamedSharding(mesh, xspec))
        y = jax.device_put(random_array(rng, yshape, ydt), NamedSharding(mesh, yspec))
        results = []
        for body in references(c["op"], axis, precision, preferred, c.get("bidirectional", False)):
            f = jax.shard_map(body, mesh=mesh, in_specs=(xspec, yspec), out_specs=zspec, check_vma=c["check_vma"])
            if not results:  # a random cotangent, in the result's dtype (at least float32)
                z = jax.eval_shape(f, x, y)
                w = random_array(rng, z.shape, str(jnp.result_type(z.dtype, jnp.float32)))

            def loss(x, y, f=f):
                return jnp.sum(jnp.real(f(x, y).astype(w.dtype) * w))

            def result_and_grads(x, y, f=f, loss=loss):  # one program: the primal and the gradients
                return f(x, y), jax.grad(loss, argnums=(0, 1))(x, y)

            results.append((jax.jit(result_and_grads) if c["jit"] else result_and_grads)(x, y))
        (z, (gx, gy)), (z_ref, (gx_ref, gy_ref)) = results
        assert_close(z, z_ref, "result")
        assert_close(gx, gx_ref, "dx")
        assert_close(gy, gy_ref, "dy")


# --------------------------------------------------------------------------- #
# the case matrix
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_matches_the_collective_formulation(case):
    if case["dtype"] == "float64":
        with jax.enable_x64(True):
            run_case(case)
    else:
        run_case(case)


def test_pairwise_covers_every_pair():
    for a, b in itertools.combinations(PAIRWISE, 2):
        seen = {(repr(c[a]), repr(c[b])) for c in CASES}
        assert len(seen) == len(PAIRWISE[a]) * len(PAIRWISE[b]), (a, b)


def test_eager_shard_map():
    """shard_map outside jit (op by op), with tuple axes in non-mesh order (both operations in long mode)."""
    case = {"mesh": (4, 2), "types": "explicit", "axis": "model,data", "op": "allgather_matmul", "operands": "split"}
    run_case({**case, "dtype": "float32", "m": 3, "precision": None, "jit": False, "check_vma": True})


@pytest.mark.parametrize("check_vma", [True, False])
def test_mixed_input_dtypes(check_vma):
    """bfloat16 x float32 as jnp.dot takes them: a float32 product, each gradient in its operand's dtype."""
    case = {"mesh": (2, 4), "types": "auto", "axis": "model", "op": "matmul_reduce_scatter", "operands": "split"}
    run_case({**case, "dtype": "bfloat16*float32", "m": 5, "precision": None, "jit": True, "check_vma": check_vma})


def test_global_result_is_the_numpy_product():
    """The reference's meaning, once against numpy: the sequence-parallel MLP layout on data x model."""
    mesh = make_mesh((2, 4), "explicit")
    rng = np.random.default_rng(3)
    x, w1, w2 = (rng.standard_normal(s).astype(np.float32) for s in ((40, 6), (6, 12), (12, 6)))
    specs = (P(("data", "model")), P(None, "model"), P("model", None))

    def mlp(x, w1, w2):
        h = dmj.allgather_matmul(x, w1, axis_name="model")
        return dmj.matmul_reduce_scatter(h, w2, axis_name="model")

    f = jax.jit(jax.shard_map(mlp, mesh=mesh, in_specs=specs, out_specs=P(("data", "model"))))
    with jax.set_mesh(mesh):
        args = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip((x, w1, w2), specs)]
        np.testing.assert_allclose(f(*args), x @ w1 @ w2, rtol=1e-5, atol=1e-5)
        gx, g1, g2 = jax.grad(lambda *a: f(*a).sum(), argnums=(0, 1, 2))(*args)
    ones = np.ones((40, 6), np.float32)
    np.testing.assert_allclose(gx, ones @ (w1 @ w2).T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(g1, x.T @ ones @ w2.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(g2, (x @ w1).T @ ones, rtol=1e-5, atol=1e-5)


PARTIAL = [((2, 4), ("data", "model"), "model"), ((4, 2), ("data", "model"), "model"),
           ((2, 2, 2), ("data", "model", "seq"), ("seq", "model"))]


@pytest.mark.parametrize("op", ["allgather_matmul", "allgather_matmul bidirectional", "matmul_reduce_scatter"])
@pytest.mark.parametrize("types", ["explicit", "auto"])
@pytest.mark.parametrize("where", ["x rows", "y columns", "nowhere"])
@pytest.mark.parametrize("shape, names, ring", PARTIAL, ids=["2x4", "4x2", "2x2x2-tuple"])
def test_partially_manual_shard_map(op, types, where, shape, names, ring):
    """shard_map(axis_names=the ring's axes): the other axis stays automatic and
    may shard the blocks (x's rows or y's columns); on Explicit axes the blocks'
    types carry it. Result and gradients equal the plain formulation's, run on
    the same devices with every axis Auto (where JAX runs it: on Explicit axes
    JAX's own psum_scatter fails there)."""
    op, bidirectional = op.split()[0], op.endswith("bidirectional")
    ring_axes = ring if isinstance(ring, tuple) else (ring,)
    p_ring, p_data = int(np.prod([dict(zip(names, shape))[a] for a in ring_axes])), shape[0]
    rows, k, n = 2 * p_ring * p_data, 6, 2 * p_data
    x_spec = P((*ring_axes, "data"), None) if where == "x rows" else P(ring_axes, None)
    y_spec = P(None, "data") if where == "y columns" else P()
    rng = np.random.default_rng(zlib.crc32(f"{op}{types}{where}{shape}{bidirectional}".encode()))
    x, y = rng.standard_normal((p_ring * rows, k)), rng.standard_normal((k, n))
    out_rows = p_ring * (p_ring * rows if op == "allgather_matmul" else rows // p_ring)
    w = rng.standard_normal((out_rows, n)).astype(np.float32)
    kind = AxisType.Explicit if types == "explicit" else AxisType.Auto
    results = []
    for body_mesh, body in (
        (jax.make_mesh(shape, names, axis_types=(kind,) * len(shape)), references(op, ring, None, None, bidirectional)[0]),
        (jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape)), references(op, ring, None, None)[1]),
    ):
        f = jax.shard_map(body, mesh=body_mesh, in_specs=(P(ring_axes), P()), out_specs=P(ring_axes),
                          axis_names=set(ring_axes))
        with jax.set_mesh(body_mesh):
            args = [jax.device_put(v.astype(np.float32), NamedSharding(body_mesh, s))
                    for v, s in ((x, x_spec), (y, y_spec))]
            loss = lambda x, y, f=f: jnp.sum(f(x, y) * w)  # noqa: E731
            results.append(jax.jit(lambda x, y, f=f, loss=loss: (f(x, y), jax.grad(loss, (0, 1))(x, y)))(*args))
    (z, (gx, gy)), (z_ref, (gx_ref, gy_ref)) = results
    assert_close(z, z_ref, "result")
    assert_close(gx, gx_ref, "dx")
    assert_close(gy, gy_ref, "dy")
    if op == "allgather_matmul":  # and once against numpy: every ring rank holds all_gather(x) @ y
        np.testing.assert_allclose(np.asarray(z), np.tile(x @ y, (p_ring, 1)), rtol=1e-4, atol=1e-4)


def test_reverse_mode_works_and_forward_mode_is_refused():
    """What the README and the module docstring promise: grad, vjp and jacrev
    (checked against numpy); jvp, linearize and jacfwd refused by JAX, as for
    any custom_vjp function."""
    mesh = make_mesh((8,), "auto")
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((16, 3)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    f = jax.jit(jax.shard_map(lambda x, y: dmj.allgather_matmul(x, y, axis_name="model"), mesh=mesh,
                              in_specs=(P("model"), P()), out_specs=P(), check_vma=False))
    np.testing.assert_allclose(jax.jacrev(lambda y: f(x, y))(y), np.einsum("mk,ni->mnki", x, np.eye(4)),
                               rtol=1e-5, atol=1e-5)
    _, vjp = jax.vjp(f, x, y)
    gx, gy = vjp(np.ones((16, 4), np.float32))
    np.testing.assert_allclose(gx, np.ones((16, 4)) @ y.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gy, x.T @ np.ones((16, 4)), rtol=1e-5, atol=1e-5)
    for forward in (lambda: jax.jvp(f, (x, y), (x, y)), lambda: jax.linearize(f, x, y)[1](x, y),
                    lambda: jax.jacfwd(lambda y: f(x, y))(y)):
        with pytest.raises(TypeError, match="custom_vjp"):
            forward()


# --------------------------------------------------------------------------- #
# rings, not collectives
# --------------------------------------------------------------------------- #
def equations(jaxpr):
    """Every equation of a jaxpr and of the jaxprs nested in its equations."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                if hasattr(sub, "eqns") or hasattr(getattr(sub, "jaxpr", None), "eqns"):
                    yield from equations(sub)


def axes_of(eqn) -> set:
    names = eqn.params.get("axis_name", eqn.params.get("axes", ()))
    return set(names if isinstance(names, tuple) else (names,))


COLLECTIVES = ("all_gather", "reduce_scatter", "all_to_all", "psum", "pbroadcast")


@pytest.mark.parametrize("op", PARAMS["op"])
@pytest.mark.parametrize("axis", ["model", ("model", "data")])
def test_forward_and_backward_are_ppermute_rings(op, axis):
    mesh = make_mesh((2, 4), "explicit")
    (xshape, xspec), (yshape, yspec), zspec = layout(op, "split", mesh, axis, 3)
    ours, _ = references(op, axis, None, None)
    f = jax.shard_map(ours, mesh=mesh, in_specs=(xspec, yspec), out_specs=zspec)
    ring = set(axis if isinstance(axis, tuple) else (axis,))
    with jax.set_mesh(mesh):
        x = jax.device_put(jnp.ones(xshape), NamedSharding(mesh, xspec))
        y = jax.device_put(jnp.ones(yshape), NamedSharding(mesh, yspec))
        grad = jax.grad(lambda x, y: f(x, y).sum(), argnums=(0, 1))
        for what, fn in (("forward", f), ("backward", grad)):
            eqns = list(equations(jax.make_jaxpr(fn)(x, y)))
            assert any(e.primitive.name == "ppermute" and axes_of(e) == ring for e in eqns), what
            # no other collective over the ring's axes (the backward sums dy over "data", where y is replicated)
            for e in eqns:
                if e.primitive.name.startswith(COLLECTIVES):
                    assert not axes_of(e) & ring, (what, e)
            hlo = jax.jit(fn).lower(x, y).as_text()
            assert "stablehlo.collective_permute" in hlo, what
            for collective in ("all_gather", "reduce_scatter", "all_to_all"):
                assert f"stablehlo.{collective}" not in hlo, (what, collective)


@pytest.mark.parametrize("op", PARAMS["op"])
@pytest.mark.parametrize("precision", [None, "highest"])
def test_precision_is_passed_to_every_dot(op, precision):
    mesh = make_mesh((8,), "auto")
    ours, _ = references(op, "model", precision, None)
    f = jax.shard_map(ours, mesh=mesh, in_specs=(P("model"), P()), out_specs=P("model"))
    grad = jax.grad(lambda x, y: f(x, y).sum(), argnums=(0, 1))
    eqns = equations(jax.make_jaxpr(grad)(jnp.ones((64, 3)), jnp.ones((3, 2))))
    dots = [e for e in eqns if e.primitive.name == "dot_general"]
    assert len(dots) >= 3  # forward, dx, dy
    for e in dots:
        assert e.params["precision"] is None if precision is None else "HIGHEST" in str(e.params["precision"]), e


@pytest.mark.parametrize("op", PARAMS["op"])
def test_a_precision_context_reaches_the_backward_dots(op):
    """precision=None is jax.default_matmul_precision when the call is traced, as
    for jnp.dot: a context around the forward pass holds for its backward dots,
    which are traced after the context ends (they fell back to None)."""
    mesh = make_mesh((8,), "auto")
    ours, ref = references(op, "model", None, None)

    def dots(body):
        f = jax.shard_map(body, mesh=mesh, in_specs=(P("model"), P()), out_specs=P("model"))

        def loss(x, y):
            with jax.default_matmul_precision("float32"):
                z = f(x, y)
            return z.sum()

        eqns = equations(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(jnp.ones((64, 3)), jnp.ones((3, 2))))
        return [str(e.params["precision"]) for e in eqns if e.primitive.name == "dot_general"]

    assert {*dots(ref)} == {"(Precision.HIGHEST, Precision.HIGHEST)"}  # what jnp.dot does
    got = dots(ours)
    assert len(got) >= 3 and {*got} == {*dots(ref)}, got


@pytest.mark.parametrize(
    "mesh, axis, m, dtype, check_vma",
    [
        ((8,), "model", 5, "float32", True),  # halves of 3 and 2 rows
        ((2, 4), "model,data", 4, "bfloat16", False),
        ((4, 2), "model", 1, "complex64", True),  # one row: nothing to split, one ring
        ((2, 4), "data", 7, "float32", False),  # two ranks: both halves go to the same neighbour
    ],
)
def test_bidirectional_allgather_matmul(mesh, axis, m, dtype, check_vma):
    case = {"mesh": mesh, "types": "explicit", "axis": axis, "op": "allgather_matmul", "operands": "replicated"}
    options = {"precision": None, "jit": True, "check_vma": check_vma, "bidirectional": True}
    run_case({**case, "dtype": dtype, "m": m, **options})


def test_bidirectional_sends_both_ways():
    mesh = make_mesh((8,), "auto")
    for bidirectional, directions in ((False, {-1}), (True, {-1, 1})):
        ours, _ = references("allgather_matmul", "model", None, None, bidirectional)
        f = jax.shard_map(ours, mesh=mesh, in_specs=(P("model"), P()), out_specs=P(None, "model"))
        for fn in (f, jax.grad(lambda x, y: f(x, y).sum(), argnums=(0, 1))):
            eqns = equations(jax.make_jaxpr(fn)(jnp.ones((32, 3)), jnp.ones((3, 2))))
            perms = [dict(e.params["perm"]) for e in eqns if e.primitive.name == "ppermute"]
            # the backward's dx ring (a reduce-scatter) always sends right
            assert {perm[1] - 1 for perm in perms} >= directions, perms
            if fn is f:
                assert {perm[1] - 1 for perm in perms} == directions, perms


# --------------------------------------------------------------------------- #
# errors
# --------------------------------------------------------------------------- #
def trace(op: str, xshape, yshape, axis="model", **kw):
    mesh = make_mesh((2, 4), "auto")
    def body(x, y):
        return getattr(dmj, op)(x, y, axis_name=axis, **kw)

    f = jax.shard_map(body, mesh=mesh, in_specs=P(), out_specs=P(), check_vma=False)
    return jax.make_jaxpr(f)(jnp.ones(xshape), jnp.ones(yshape))


@pytest.mark.parametrize("op", PARAMS["op"])
@pytest.mark.parametrize(
    "xshape, yshape, words",
    [
        ((2, 4, 3), (3, 5), ["x must be 2-D", "(2, 4, 3)", "reshape"]),
        ((4,), (4, 5), ["x must be 2-D", "(4,)"]),
        ((4, 3), (3,), ["y must be 2-D", "(3,)"]),
        ((4, 3), (2, 5), ["(4, 3)", "(2, 5)", "x's columns (3) must equal y's rows (2)"]),
    ],
)
def test_shape_errors_name_the_argument_and_the_fix(op, xshape, yshape, words):
    with pytest.raises(ValueError) as e:
        trace(op, xshape, yshape)
    for word in words:
        assert word in str(e.value), (word, str(e.value))


def test_reduce_scatter_rows_must_split_over_the_ring():
    message = r"x @ y has 6 rows .*\(6, 3\).* 4 ranks .*'model'.*pad x's rows to a multiple of 4"
    with pytest.raises(ValueError, match=message):
        trace("matmul_reduce_scatter", (6, 3), (3, 2))
    with pytest.raises(ValueError, match=r"8 ranks"):
        trace("matmul_reduce_scatter", (12, 3), (3, 2), axis=("model", "data"))
    trace("matmul_reduce_scatter", (12, 3), (3, 2))  # 12 rows over 4 ranks: fine


def test_axis_name_must_be_a_shard_map_axis():
    with pytest.raises(ValueError, match=r"axis_name='rows' is not an axis of an enclosing jax.shard_map"):
        trace("allgather_matmul", (4, 3), (3, 2), axis="rows")
    with pytest.raises(ValueError, match=r"not an axis"):
        dmj.allgather_matmul(jnp.ones((4, 3)), jnp.ones((3, 2)), axis_name="model")  # outside shard_map
    with pytest.raises(ValueError, match=r"names no mesh axis"):
        trace("allgather_matmul", (4, 3), (3, 2), axis=())
    with pytest.raises(ValueError, match=r"axis_name=\('model', 'model'\) names a mesh axis twice"):
        trace("matmul_reduce_scatter", (8, 3), (3, 2), axis=("model", "model"))
    for bad in (0, None, ("model", 1)):
        with pytest.raises(TypeError, match=r"axis_name must be a mesh axis name .* got"):
            trace("allgather_matmul", (4, 3), (3, 2), axis=bad)


def test_options_are_keyword_only():
    with pytest.raises(TypeError):
        dmj.allgather_matmul(jnp.ones((4, 3)), jnp.ones((3, 2)), "model")  # type: ignore[misc]
    for flag in ("no", "false", 0, None):  # bool("no") is True: a string would turn the two-way ring on
        with pytest.raises(TypeError, match=r"bidirectional must be True or False, got"):
            dmj.allgather_matmul(jnp.ones((4, 3)), jnp.ones((3, 2)), axis_name="model", bidirectional=flag)


# --------------------------------------------------------------------------- #
# documentation
# --------------------------------------------------------------------------- #
def test_readme_section_runs():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Inside your own shard_map", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    exec(compile(code, "README.md", "exec"), {})
