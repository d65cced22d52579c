"""dmatmul.jax: allgather_matmul and matmul_reduce_scatter inside the user's shard_map.

One generated matrix (``test_generated_blocks``) draws every option of the two
blocks independently: the operation; a ring of 2..8 ranks on a mesh of 2..8 of
the 8 devices in any order (one to three axes, Explicit or Auto each; the ring
one axis or a tuple of two in either order; the other axes independent rings);
the operands' layout; local sizes m, k, n in 1..40 (1, primes, uneven); the six
dtypes, mixed input dtypes and preferred_element_type (those jnp.dot refuses
must be refused too); precision; bidirectional; jit or eager; check_vma; and
reverse mode by jax.grad or jax.vjp. The result and both gradients are checked
against numpy and against the formulation the functions claim to equal
(``all_gather(x) @ y``, ``psum_scatter(x @ y)``, with ``jnp.dot``), run through
the same ``shard_map`` with the same specs and differentiated the same way.
DMATMUL_LONG=1 draws 600 cases instead of 60. ``test_generated_programs``
chains the blocks (an MLP either way round, a scan over layers) under
jax.vmap (outside shard_map, or inside it) and jax.checkpoint, operands split
over any mesh axes, and checks the result and the gradient (along random
directions) against a numpy simulation of the ranks (5 drawn and 3 pinned
programs; DMATMUL_LONG=1: 300).

Where JAX cannot run its own formulation, a block must fail as it does (the
same exception type) or run and match numpy. JAX 0.10 on the CPU cannot:
  * empty blocks: m = 0 and n = 0 are drawn, under jit only (eager, a
    shard_map's empty output comes back with every shard of the global shape,
    which np.asarray refuses: plain JAX code as well). ``all_gather`` /
    ``psum_scatter`` of 0 rows fail JAX's verifier ("Cannot lower jaxpr with
    verifier errors"); the blocks run them. k = 0 is not drawn: x and y are
    then both empty, and any shard_map (or jit inside one) whose operands are
    all empty fails in XLA's lowering ("'func.call' op expected at least one
    operand of @xla.sdy.manual_computation_body ... to be produced by a
    xla.sdy.GlobalToLocalShape CustomCallOp"), a bare jnp.dot inside shard_map
    as well as the formulation and the blocks;
  * eager jax.grad on a mesh of Explicit and Auto axes, a result sharded over
    an Explicit one: "Expected cotangent type float32[6@model,6] but got
    float32[6,6]" (jit, or jax.vjp, work); the blocks fail the same way.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
import re
import zlib
from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax")
st = pytest.importorskip("hypothesis.strategies")
import jax.numpy as jnp  # noqa: E402
from hypothesis import example, given, settings  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import dmatmul.jax as dmj  # noqa: E402
from dmatmul import _cost  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
LONG = os.environ.get("DMATMUL_LONG", "") not in ("", "0")

OPS = ("allgather_matmul", "matmul_reduce_scatter")
TOL = {"float32": 1e-5, "complex64": 1e-5, "float64": 1e-13, "bfloat16": 2e-2}  # by the compared array's dtype


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


def layout(op: str, operands: str, mesh, axis, m: int, k: int = 4, n: int = 2):
    """Global shapes and specs of x, y and the result for ``op`` with ring ``axis``:
    x's rows split over every device (the ring's ranks within each group of the
    other axes), and y split over the ring ("split") or both operands replicated
    over it ("replicated"); m, k and n are the local sizes."""
    ring = axis if isinstance(axis, tuple) else (axis,)
    other = tuple(a for a in mesh.axis_names if a not in ring)
    o = other or None
    p_ring = math.prod(mesh.shape[a] for a in ring)
    p_other = math.prod(mesh.shape[a] for a in other)
    rows = (*other, *ring)
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


def references(op: str, axis, precision, preferred, bidirectional: bool | None = None):
    """(dmatmul's block, the formulation it equals) as shard_map bodies."""
    def ref(x, y):
        dot = lambda a, b: jnp.dot(a, b, precision=precision, preferred_element_type=preferred)  # noqa: E731
        if op == "allgather_matmul":
            return dot(lax.all_gather(x, axis, axis=0, tiled=True), y)
        return lax.psum_scatter(dot(x, y), axis, scatter_dimension=0, tiled=True)

    def ours(x, y):
        return getattr(dmj, op)(x, y, axis_name=axis, precision=precision, preferred_element_type=preferred,
                                bidirectional=bidirectional)

    return ours, ref


def assert_close(got: jax.Array, want: jax.Array, what: str) -> None:
    tol = TOL[str(want.dtype)]
    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.shape, want.shape, got.dtype, want.dtype)
    g, w = np.asarray(got).astype(np.complex128), np.asarray(want).astype(np.complex128)
    scale = max(np.abs(w).max(), 1.0)
    err = np.abs(g - w).max() / scale
    assert err <= tol, f"{what}: max error {err:.3g} (relative to max |ref| {scale:.3g}) > {tol}"


def random_numpy(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    a = rng.standard_normal(shape)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        a = a + 1j * rng.standard_normal(shape)
    return a.astype(jnp.dtype(dtype))


# --------------------------------------------------------------------------- #
# the generated matrix
# --------------------------------------------------------------------------- #
DTYPES = ("float16", "bfloat16", "float32", "float64", "complex64", "complex128")
EPS = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24, "complex64": 2.0**-24,
       "float64": 2.0**-53, "complex128": 2.0**-53}
PRECISIONS = (None, "default", "high", "highest", lax.Precision.DEFAULT, (lax.Precision.HIGH, lax.Precision.HIGHEST))
AXIS_NAMES = ("data", "model", "seq")
SIZES = st.one_of(st.sampled_from((1, 2, 3, 5, 7, 11, 13, 31, 37)), st.integers(1, 40))  # local k
EMPTY_OR_SIZES = st.one_of(st.sampled_from((1, 2, 3, 5, 7, 11, 13, 31, 37, 0)), st.integers(1, 40))  # m, n


@dataclasses.dataclass(frozen=True)
class Block:
    """One call of a block inside shard_map, and how it is run and differentiated."""

    op: str
    shape: tuple[int, ...]  # the mesh, its axes named AXIS_NAMES in order
    explicit: tuple[bool, ...]  # each mesh axis Explicit (else Auto)
    devices: tuple[int, ...]  # which of jax.devices(), in the mesh's order
    axis: Any  # axis_name: one axis, or a tuple in any order
    operands: str  # "split" / "replicated" (see layout)
    m: int
    k: int
    n: int
    x: str  # dtypes
    y: str
    preferred: str | None
    precision: Any
    bidirectional: bool | None  # None: the cost model's choice (on CPU: one way)
    jit: bool
    check_vma: bool
    grad: str  # "grad" (of a loss) or "vjp" (of a cotangent)
    seed: int

    @property
    def x64(self) -> bool:
        return any(d in ("float64", "complex128") for d in (self.x, self.y, self.preferred))

    @property
    def ring(self) -> tuple[str, ...]:
        return self.axis if isinstance(self.axis, tuple) else (self.axis,)

    @property
    def p(self) -> int:
        return math.prod(self.shape[AXIS_NAMES.index(a)] for a in self.ring)


def factorizations(n: int, most: int) -> list[tuple[int, ...]]:
    """Ordered factorizations of n > 1 into at most ``most`` factors > 1."""
    out = [(n,)]
    if most > 1:
        out += [(a, *rest) for a in range(2, n) if n % a == 0 for rest in factorizations(n // a, most - 1)]
    return out


@st.composite
def blocks(draw) -> Block:
    op = draw(st.sampled_from(OPS))
    p = draw(st.integers(2, 8))  # ranks on the ring
    q = draw(st.integers(1, 8 // p))  # independent rings (the other axes)
    # the ring: one axis or two (one of them may have size 1); the other axes: none, one or two
    ring_sizes = draw(st.sampled_from([*factorizations(p, 2), (1, p), (p, 1)]))
    others = factorizations(q, 3 - len(ring_sizes)) if q > 1 else [(), (), (1,)]
    other_sizes = draw(st.sampled_from(others))
    roles = draw(st.permutations([(s, True) for s in ring_sizes] + [(s, False) for s in other_sizes]))
    names = AXIS_NAMES[: len(roles)]
    ring = draw(st.permutations([a for a, (_, on_ring) in zip(names, roles) if on_ring]))
    axis = tuple(ring) if len(ring) > 1 or draw(st.booleans()) else ring[0]
    x = draw(st.sampled_from(DTYPES))
    jit = not draw(st.booleans())  # else eager: shard_map op by op
    m, k, n = draw(EMPTY_OR_SIZES), draw(SIZES), draw(EMPTY_OR_SIZES)
    return Block(
        op=op,
        shape=tuple(s for s, _ in roles),
        explicit=tuple(draw(st.booleans()) for _ in roles),
        devices=tuple(draw(st.permutations(range(8)))[: p * q]),
        axis=axis,
        operands=draw(st.sampled_from(("split", "replicated"))),
        m=m if jit else max(m, 1), k=k, n=n if jit else max(n, 1),  # empty blocks under jit (module docstring)
        x=x,
        y=draw(st.one_of(st.just(x), st.sampled_from(DTYPES))),  # or mixed input dtypes
        preferred=draw(st.one_of(st.none(), st.sampled_from((*DTYPES, "bfloat")))),  # (a typo: refused)
        precision=draw(st.sampled_from(PRECISIONS)),
        bidirectional=draw(st.sampled_from((None, False, True))),
        jit=jit,
        check_vma=draw(st.booleans()),
        grad=draw(st.sampled_from(("grad", "vjp"))),
        seed=draw(st.integers(0, 2**32 - 1)),
    )


def numpy_reference(c: Block, x: np.ndarray, y: np.ndarray, w: np.ndarray, real: bool):
    """The global result and the gradients for cotangent ``w`` of what ``layout``
    lays out, in complex128; ``real``: the product is real (preferred_element_type
    real with complex operands keeps the real part, as jnp.dot does)."""
    def dot(a, b):
        return (a @ b).real if real else a @ b

    x, y, w = (v.astype(np.complex128) for v in (x, y, w))
    if c.op == "allgather_matmul" and c.operands == "replicated":  # every ring rank's columns: all_gather(x) @ y
        w_sum = sum(np.split(w, c.p, axis=1))
        return np.tile(dot(x, y), (1, c.p)), dot(w_sum, y.T), dot(x.T, w_sum)
    times = c.p if c.op == "matmul_reduce_scatter" and c.operands == "replicated" else 1  # p equal partial sums
    return times * dot(x, y), times * dot(w, y.T), times * dot(x.T, w)


def assert_near(what: str, got: np.ndarray, want: np.ndarray, scale: float, tol: float) -> None:
    """max |got - want| within ``tol`` of ``scale`` (that of |x| @ |y|: a bound on every partial sum)."""
    got = np.asarray(got).astype(np.complex128)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    if got.size:
        err = np.abs(got - want).max() / scale
        assert err <= tol, f"{what}: max error {err:.3g} x max(|x| @ |y|) = {scale:.3g}, tolerance {tol:.3g}"


def run_block(c: Block) -> None:
    names = AXIS_NAMES[: len(c.shape)]
    kinds = tuple(AxisType.Explicit if e else AxisType.Auto for e in c.explicit)
    devices = np.array([jax.devices()[i] for i in c.devices], dtype=object).reshape(c.shape)
    mesh = Mesh(devices, names, axis_types=kinds)
    (xshape, xspec), (yshape, yspec), zspec = layout(c.op, c.operands, mesh, c.axis, c.m, c.k, c.n)
    rng = np.random.default_rng(c.seed)
    xn, yn = random_numpy(rng, xshape, c.x), random_numpy(rng, yshape, c.y)
    bodies = references(c.op, c.axis, c.precision, c.preferred, c.bidirectional)
    fs = [jax.shard_map(body, mesh=mesh, in_specs=(xspec, yspec), out_specs=zspec, check_vma=c.check_vma)
          for body in bodies]
    with jax.set_mesh(mesh):
        x = jax.device_put(xn, NamedSharding(mesh, xspec))
        y = jax.device_put(yn, NamedSharding(mesh, yspec))
        local = [jax.ShapeDtypeStruct(s, d) for s, d in ((xshape, c.x), (yshape, c.y))]
        try:  # what jnp.dot makes of the dtypes
            product = jax.eval_shape(lambda u, v: jnp.dot(u, v, preferred_element_type=c.preferred), *local).dtype
        except TypeError:  # it refuses this preferred_element_type for these operands: so must the blocks
            with pytest.raises(TypeError):
                jax.eval_shape(fs[1], x, y)
            words = rf"{c.op}: preferred_element_type={c.preferred!r} .* x \({c.x}\) and y \({c.y}\).*=None"
            with pytest.raises(TypeError, match=words):
                jax.eval_shape(fs[0], x, y)
            return
        zn = random_numpy(rng, jax.eval_shape(fs[1], x, y).shape, product)
        w = jax.device_put(zn, NamedSharding(mesh, zspec))

        def result_and_grads(x, y, f):
            if c.grad == "vjp":
                z, pullback = jax.vjp(f, x, y)
                return z, pullback(w)
            return f(x, y), jax.grad(lambda x, y: jnp.sum(jnp.real(f(x, y) * w)), argnums=(0, 1))(x, y)

        run = jax.jit(result_and_grads, static_argnums=2) if c.jit else result_and_grads
        ours, ref = (outcome(run, x, y, f) for f in fs)
    if isinstance(ref, Exception):  # JAX cannot run its formulation here (see the module docstring)
        if isinstance(ours, Exception):
            assert type(ours) is type(ref), (ours, ref)  # nor the block
            return
        ref = None  # the block runs: against numpy alone
    elif isinstance(ours, Exception):
        raise ours
    z, (dx, dy) = ours
    real = not jnp.issubdtype(product, jnp.complexfloating)
    want = numpy_reference(c, xn, yn, zn, real)
    bound = numpy_reference(c, *(np.abs(v.astype(np.complex128)) for v in (xn, yn, zn)), False)
    refs = (None, None, None) if ref is None else (ref[0], *ref[1])
    for what, got, r, w_, b, dtype in zip(("result", "dx", "dy"), (z, dx, dy), refs, want, bound,
                                          (product, x.dtype, y.dtype)):
        assert got.dtype == dtype, (what, got.dtype, dtype)
        if not jnp.issubdtype(dtype, jnp.complexfloating):
            w_ = w_.real
        eps = max(EPS[str(jnp.dtype(d))] for d in (c.x, c.y, product, dtype))
        if jax.default_backend() != "cpu" and c.precision not in ("highest", lax.Precision.HIGHEST):
            eps = max(eps, EPS["bfloat16"])  # an accelerator's float32 GEMM may run TF32 or bfloat16 passes
        tol = eps * 2 * (c.p + 4)  # a few roundings per GEMM and per ring step (measured: below a fifth of this)
        scale = max(np.abs(b).max(initial=0.0), 1e-30)
        assert_near(f"{what} against numpy", got, w_, scale, tol)
        if r is not None:
            assert r.dtype == dtype, (what, r.dtype, dtype)
            assert_near(f"{what}: the formulation against numpy", r, w_, scale, tol)
            assert_near(f"{what} against the formulation", got, np.asarray(r).astype(np.complex128), scale, 2 * tol)


def outcome(run, *args):
    """run(*args), or the error where JAX fails to lower or run it."""
    try:
        return run(*args)
    except (ValueError, jax.errors.JaxRuntimeError) as e:
        return e


def pinned(**kw) -> Block:
    """A case every run checks (besides the drawn ones)."""
    case = dict(op="allgather_matmul", shape=(8,), explicit=(True,), devices=tuple(range(8)), axis="data",
                operands="split", m=3, k=4, n=2, x="float32", y="float32", preferred=None, precision=None,
                bidirectional=False, jit=True, check_vma=True, grad="grad", seed=0)
    return Block(**{**case, **kw})


@pytest.mark.filterwarnings("error:Casting from complex to real")  # JAX: soon a ValueError
@given(c=blocks())
@example(c=pinned(x="float32", y="complex64", grad="vjp"))  # a real operand's gradient: the real part of a complex one
@example(c=pinned(op="matmul_reduce_scatter", shape=(1, 2), explicit=(False, False), devices=(0, 1),
                  axis=("data", "model"), m=1, k=1, n=1, x="complex64", y="complex64",
                  preferred="float32"))  # a real product of complex operands: real gradients, as jnp.dot's
@example(c=pinned(shape=(7,), devices=(6, 5, 4, 3, 2, 1, 0), m=1, x="complex128", y="complex128", jit=False,
                  bidirectional=True, grad="vjp"))  # an odd ring, eager; one row: nothing to split both ways
@example(c=pinned(shape=(2, 4), explicit=(True, True), devices=tuple(range(8)), m=7, x="bfloat16", y="bfloat16",
                  operands="replicated", bidirectional=True, check_vma=False))  # two ranks: both halves one way
@example(c=pinned(op="matmul_reduce_scatter", shape=(2, 4), explicit=(False, False), axis="model", m=5, k=3, n=5,
                  x="bfloat16", y="float32"))  # mixed input dtypes
@example(c=pinned(op="matmul_reduce_scatter", shape=(4, 2), explicit=(True, False), axis=("model", "data"), m=5,
                  bidirectional=True, grad="vjp"))  # 8 ranks, a tuple in reverse mesh order; odd rows: 3 + 2
@example(c=pinned(op="matmul_reduce_scatter", shape=(4, 2), explicit=(False, True), axis="data", m=6,
                  x="complex64", y="complex64", bidirectional=True, jit=False))  # 4 ranks, eager; even rows: 3 + 3
@example(c=pinned(op="matmul_reduce_scatter", shape=(2, 4), explicit=(True, True), devices=(7, 5, 3, 1, 6, 4, 2, 0),
                  axis="data", m=3, x="bfloat16", y="bfloat16", operands="replicated", bidirectional=True,
                  check_vma=False))  # two ranks: both halves one way
@example(c=pinned(op="matmul_reduce_scatter", shape=(4, 2), explicit=(True, False), axis=("model", "data"),
                  m=5, k=7, n=11, x="float16", y="float16", preferred="float32", precision="high", jit=False))
@example(c=pinned(shape=(3, 2), explicit=(False, True), devices=(5, 0, 3, 1, 4, 2), axis="data", k=13, n=1,
                  x="float64", y="complex64", precision="highest", grad="vjp"))
@example(c=pinned(op="matmul_reduce_scatter", shape=(5,), devices=(1, 3, 5, 7, 0), x="complex64", y="complex64",
                  preferred="float16"))  # refused, as jnp.dot refuses it
@example(c=pinned(op="matmul_reduce_scatter", shape=(2, 2), explicit=(False, False), devices=(3, 2, 1, 0),
                  axis="model", m=0, k=5))  # empty blocks: against numpy only
@settings(max_examples=600 if LONG else 60, deadline=None)
def test_generated_blocks(c):
    with jax.enable_x64(c.x64):
        run_block(c)


# --------------------------------------------------------------------------- #
# composed programs: chained blocks under vmap, checkpoint and scan
# --------------------------------------------------------------------------- #
@dataclasses.dataclass(frozen=True)
class Program:
    """Blocks chained in one shard_map body, against a numpy simulation of the
    ranks (the result, and the gradient's derivative along random directions)."""

    prog: str  # "mlp": rs(tanh(ag(x, w1)), w2); "rev": ag(tanh(rs(x, w1)), w2); "scan": x + mlp(x), per layer
    names: tuple[str, ...]  # the mesh's axes, in its order
    shape: tuple[int, ...]
    explicit: tuple[bool, ...]
    devices: tuple[int, ...]
    axis: Any  # the ring: one axis, or a tuple of any of them in any order
    specs: tuple[Any, ...]  # in_specs of x, w1, w2: any mesh axes on any dimension
    out: Any  # out_specs: every axis the result varies over
    sizes: tuple[int, int, int, int]  # local m, k, h, n
    wrap: str  # "" / "vmap outside" / "vmap inside" / "checkpoint body" / "checkpoint blocks"
    bidirectional: bool
    check_vma: bool
    seed: int

    @property
    def size(self) -> dict[str, int]:
        return dict(zip(self.names, self.shape))

    @property
    def ring(self) -> tuple[str, ...]:
        return self.axis if isinstance(self.axis, tuple) else (self.axis,)


def spec_parts(spec: Any, ndim: int) -> list[tuple[str, ...]]:
    parts = list(spec) + [None] * (ndim - len(spec))
    return [() if s is None else (s,) if isinstance(s, str) else tuple(s) for s in parts]


@st.composite
def programs(draw) -> Program:
    shape = tuple(draw(st.lists(st.sampled_from((2, 1, 4, 3)), min_size=1, max_size=3)
                       .filter(lambda s: 2 <= math.prod(s) <= 8)))
    total = math.prod(shape)
    names = tuple(draw(st.permutations(AXIS_NAMES))[: len(shape)])
    ring = draw(st.lists(st.sampled_from(names), min_size=1, max_size=len(names), unique=True))
    axis = tuple(ring) if len(ring) > 1 or draw(st.booleans()) else ring[0]
    prog = draw(st.sampled_from(("mlp", "rev", "scan")))
    wrap = draw(st.sampled_from(("", "vmap outside", "checkpoint body", "checkpoint blocks")
                                + (("vmap inside",) if prog != "scan" else ())))
    layers = prog == "scan"
    ndims = (2 + (wrap == "vmap inside"), 2 + layers, 2 + layers)  # x, w1, w2

    def spec(ndim: int, first: int) -> Any:  # each axis nowhere or on one dimension (from ``first``)
        parts: list[list[str]] = [[] for _ in range(ndim)]
        for a in draw(st.permutations(names)):
            d = draw(st.integers(first - 1, ndim - 1))
            if d >= first:
                parts[d].append(a)
        return P(*(tuple(s) if len(s) > 1 else s[0] if s else None for s in parts))

    # x's batch dimension (vmapped inside) and the weights' layer dimension (scan) unsplit
    specs = (spec(ndims[0], int(wrap == "vmap inside")) if not layers else spec(2, 0), spec(ndims[1], layers),
             spec(ndims[2], layers))
    used = set(ring).union(*(a for s in specs for a in spec_parts(s, 3)))
    out: list[list[str]] = [[] for _ in range(2 + (wrap == "vmap inside"))]
    for a in draw(st.permutations(names)):
        if a in used or draw(st.booleans()):
            out[draw(st.integers(0, len(out) - 1))].append(a)
    m, k, h, n = (draw(st.integers(1, 5)) for _ in range(4))
    if prog == "rev":
        m *= math.prod(dict(zip(names, shape))[a] for a in ring)
    return Program(
        prog=prog, names=names, shape=shape, explicit=tuple(draw(st.booleans()) for _ in shape),
        devices=tuple(draw(st.permutations(range(8)))[:total]), axis=axis, specs=specs,
        out=P(*(tuple(s) if len(s) > 1 else s[0] if s else None for s in out)), sizes=(m, k, h, n), wrap=wrap,
        bidirectional=draw(st.booleans()), check_vma=draw(st.booleans()), seed=draw(st.integers(0, 2**32 - 1)),
    )


class Ranks:
    """numpy's view of the program: every rank's blocks, and the blocks' collectives."""

    def __init__(self, c: Program):
        self.c = c
        self.coords = [dict(zip(c.names, t)) for t in np.ndindex(*c.shape)]

    def index(self, coord: dict[str, int], axes: tuple[str, ...]) -> int:  # row-major, as lax.axis_index
        return int(np.ravel_multi_index([coord[a] for a in axes], [self.c.size[a] for a in axes])) if axes else 0

    def split(self, a: np.ndarray, spec: Any) -> list[np.ndarray]:
        parts = spec_parts(spec, a.ndim)
        out = []
        for coord in self.coords:
            at = []
            for d, axes in enumerate(parts):
                b = a.shape[d] // math.prod(self.c.size[x] for x in axes)
                at.append(slice(self.index(coord, axes) * b, (self.index(coord, axes) + 1) * b))
            out.append(a[tuple(at)])
        return out

    def join(self, blocks: list[np.ndarray], spec: Any) -> np.ndarray:
        parts = spec_parts(spec, blocks[0].ndim)
        shape = [s * math.prod(self.c.size[x] for x in axes) for s, axes in zip(blocks[0].shape, parts)]
        out = np.zeros(shape, blocks[0].dtype)
        for coord, blk in zip(self.coords, blocks):
            at = tuple(slice(self.index(coord, axes) * s, (self.index(coord, axes) + 1) * s)
                       for s, axes in zip(blk.shape, parts))
            out[at] = blk
        return out

    def group(self, r: int) -> list[int]:  # rank r's ring, in ring order
        same = [q for q, co in enumerate(self.coords)
                if all(co[a] == self.coords[r][a] for a in self.c.names if a not in self.c.ring)]
        return sorted(same, key=lambda q: self.index(self.coords[q], self.c.ring))

    def ag(self, xs: list[np.ndarray], ys: list[np.ndarray]) -> list[np.ndarray]:
        return [np.concatenate([xs[q] for q in self.group(r)], axis=-2) @ ys[r] for r in range(len(xs))]

    def rs(self, xs: list[np.ndarray], ys: list[np.ndarray]) -> list[np.ndarray]:
        out = []
        for r in range(len(xs)):
            total = sum(xs[q] @ ys[q] for q in self.group(r))
            rows = total.shape[-2] // len(self.group(r))
            i = self.index(self.coords[r], self.c.ring)
            out.append(total[..., i * rows:(i + 1) * rows, :])
        return out


def program_numpy(c: Program, x: np.ndarray, w1: np.ndarray, w2: np.ndarray) -> np.ndarray:
    """The global result, numpy in float64 (x batched along axis 0 for "vmap outside")."""
    if c.wrap == "vmap outside":
        return np.stack([program_numpy(dataclasses.replace(c, wrap=""), xb, w1, w2) for xb in x])
    ranks = Ranks(c)
    xs, w1s, w2s = (ranks.split(v, s) for v, s in zip((x, w1, w2), c.specs))
    if c.prog == "mlp":
        z = ranks.rs([np.tanh(v) for v in ranks.ag(xs, w1s)], w2s)
    elif c.prog == "rev":
        z = ranks.ag([np.tanh(v) for v in ranks.rs(xs, w1s)], w2s)
    else:
        z = xs
        for i in range(w1.shape[0]):
            hs = ranks.ag(z, [w[i] for w in w1s])
            z = [a + b for a, b in zip(z, ranks.rs([np.tanh(v) for v in hs], [w[i] for w in w2s]))]
    return ranks.join(z, c.out)


def program_body(c: Program):
    kw = dict(axis_name=c.axis)

    def ag(x, y):
        return dmj.allgather_matmul(x, y, bidirectional=c.bidirectional, **kw)

    def rs(x, y):
        return dmj.matmul_reduce_scatter(x, y, bidirectional=c.bidirectional, **kw)

    if c.wrap == "checkpoint blocks":
        ag, rs = jax.checkpoint(ag), jax.checkpoint(rs)

    def body(x, w1, w2):
        if c.prog == "mlp":
            return rs(jnp.tanh(ag(x, w1)), w2)
        if c.prog == "rev":
            return ag(jnp.tanh(rs(x, w1)), w2)
        # scan over the layers; the carry varies over every axis a layer's result varies over
        varying = set(c.ring).union(*(a for s in c.specs for a in spec_parts(s, 3)))
        has = set(a for part in spec_parts(c.specs[0], 2) for a in part) if c.check_vma else set()
        missing = tuple(a for a in c.names if a in varying - has)
        x = lax.pcast(x, missing, to="varying") if missing else x
        return lax.scan(lambda z, w: (z + rs(jnp.tanh(ag(z, w[0])), w[1]), None), x, (w1, w2))[0]

    if c.wrap == "vmap inside":  # the blocks batched inside shard_map
        return lambda x, w1, w2: jax.vmap(body, in_axes=(0, None, None))(x, w1, w2)
    return jax.checkpoint(body) if c.wrap == "checkpoint body" else body


def run_program(c: Program) -> None:
    rng = np.random.default_rng(c.seed)
    m, k, h, n = c.sizes
    layers = (2,) if c.prog == "scan" else ()
    batch = (2,) if c.wrap == "vmap inside" else ()
    local = {"mlp": ((*batch, m, k), (k, h), (h, n)), "rev": ((*batch, m, k), (k, h), (h, n)),
             "scan": ((m, k), (*layers, k, h), (*layers, h, k))}[c.prog]
    shapes = [tuple(s * math.prod(c.size[a] for a in axes) for s, axes in zip(shp, spec_parts(spec, len(shp))))
              for shp, spec in zip(local, c.specs)]
    if c.wrap == "vmap outside":
        shapes[0] = (2, *shapes[0])
    args_np = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    kinds = tuple(AxisType.Explicit if e else AxisType.Auto for e in c.explicit)
    mesh = Mesh(np.array([jax.devices()[i] for i in c.devices], dtype=object).reshape(c.shape), c.names,
                axis_types=kinds)
    f = jax.shard_map(program_body(c), mesh=mesh, in_specs=c.specs, out_specs=c.out, check_vma=c.check_vma)
    if c.wrap == "vmap outside":
        f = jax.vmap(f, in_axes=(0, None, None))
    want = program_numpy(c, *args_np)
    w = rng.standard_normal(want.shape).astype(np.float32)
    with jax.set_mesh(mesh):
        specs = (P(None, *c.specs[0]) if c.wrap == "vmap outside" else c.specs[0], *c.specs[1:])
        args = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(args_np, specs)]
        z, grads = jax.jit(lambda *a: (f(*a), jax.grad(lambda *a: jnp.sum(f(*a) * w), argnums=(0, 1, 2))(*a)))(*args)
    bound = program_numpy(c, *(np.abs(a) for a in args_np))  # |tanh(t)| = tanh(|t|): a bound on every sum
    tol = 2.0**-24 * 8 * (math.prod(c.shape) + 4) * (4 if c.prog == "scan" else 2)
    assert_near("result", np.asarray(z), want.astype(np.complex128), max(np.abs(bound).max(), 1e-30), tol)
    for g, a in zip(grads, args_np):
        assert g.shape == a.shape and g.dtype == np.float32, (g.shape, a.shape, g.dtype)
    for _ in range(2):  # the gradient along random directions: against numpy's central difference
        v = [rng.standard_normal(a.shape) for a in args_np]
        step = 1e-6
        up, down = (program_numpy(c, *(a + s * d for a, d in zip(args_np, v))) for s in (step, -step))
        slope = np.sum((up - down) * w) / (2 * step)
        ours = sum(np.sum(np.asarray(g, np.float64) * d) for g, d in zip(grads, v))
        scale = sum(np.sum(np.abs(np.asarray(g, np.float64) * d)) for g, d in zip(grads, v))
        assert abs(ours - slope) <= 20 * tol * scale + 1e-9, (
            f"the gradient along a random direction: {ours:.8g}, numpy's central difference {slope:.8g}")


def pinned_program(**kw) -> Program:
    case = dict(names=("seq", "data", "model"), shape=(2, 2, 2), explicit=(True, False, True),
                devices=(7, 6, 5, 4, 3, 2, 1, 0), bidirectional=True, check_vma=True, seed=1)
    return Program(**{**case, **kw})


@given(c=programs())
@example(c=pinned_program(  # reduce-scatter first; a ring tuple in reverse mesh order, not adjacent
    prog="rev", axis=("model", "seq"), specs=(P("data", None), P(None, "seq"), P("model", None)),
    out=P(("data", "seq"), "model"), sizes=(4, 3, 5, 2), wrap="checkpoint blocks"))
@example(c=pinned_program(  # blocks vmapped inside shard_map, odd rows both ways round the ring
    prog="mlp", names=("data", "model"), shape=(2, 4), explicit=(False, True), devices=(3, 0, 6, 1, 7, 2, 5, 4),
    axis=("model", "data"), specs=(P(None, "model", None), P(None, "data"), P("data", None)),
    out=P(None, ("model", "data"), None), sizes=(3, 5, 2, 7), wrap="vmap inside", check_vma=False))
@example(c=pinned_program(  # a scan over layers under checkpoint, every operand split
    prog="scan", axis=("data", "model"), specs=(P("seq", "data"), P(None, "data", "model"), P(None, "model", "seq")),
    out=P("seq", ("data", "model")), sizes=(2, 3, 4, 1), wrap="checkpoint body", bidirectional=False))
@settings(max_examples=300 if LONG else 5, deadline=None)
def test_generated_programs(c):
    """Both blocks chained (an MLP either way round, a scan over layers), inside
    jax.vmap (a batch outside shard_map, or blocks batched inside it) or
    jax.checkpoint, on meshes of one to three axes in any order and ring tuples
    in any order, every operand split over any mesh axes: the result and the
    gradient (along random directions) against numpy."""
    run_program(c)


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


@pytest.mark.parametrize("op", ["allgather_matmul", "allgather_matmul bidirectional", "matmul_reduce_scatter",
                                "matmul_reduce_scatter bidirectional"])
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


@pytest.mark.parametrize("op, where", [
    ("allgather_matmul", "x rows over data, y columns over seq"),
    ("allgather_matmul bidirectional", "y columns over data"),
    ("matmul_reduce_scatter", "x rows over data"),
    ("matmul_reduce_scatter", "y columns over data"),
    ("matmul_reduce_scatter bidirectional", "x rows over data"),
])
def test_partially_manual_with_explicit_and_auto_axes_left_automatic(op, where):
    """shard_map manual over "model" on a mesh whose other axes are one Explicit
    ("data") and one Auto ("seq"), the blocks sharded over "data": there
    jax.eval_shape types its result with no sharding (None), and the blocks
    failed with "AttributeError: 'NoneType' object has no attribute 'spec'"
    (a generated case: an MLP under vmap and grad). Result and gradients
    against numpy."""
    op, bidirectional = op.split()[0], op.endswith("bidirectional")
    kinds = (AxisType.Explicit, AxisType.Explicit, AxisType.Auto)
    mesh = jax.make_mesh((2, 2, 2), ("data", "model", "seq"), axis_types=kinds)
    p, rows, k, n = 2, 8, 6, 4  # rows and n: the global blocks of one ring rank
    x_spec = P(("model", "data"), None) if "x rows" in where else P("model", None)
    y_spec = P(None, "data") if where == "y columns over data" else P(None, "seq") if "seq" in where else P()
    rng = np.random.default_rng(zlib.crc32(f"{op}{where}{bidirectional}".encode()))
    x, y = (rng.standard_normal(s).astype(np.float32) for s in ((p * rows, k), (k, n)))
    w = rng.standard_normal((p * p * rows if op == "allgather_matmul" else rows, n)).astype(np.float32)
    kw = {"bidirectional": True} if bidirectional else {}
    f = jax.shard_map(lambda x, y: getattr(dmj, op)(x, y, axis_name="model", **kw), mesh=mesh,
                      in_specs=(P("model"), P()), out_specs=P("model"), axis_names={"model"})
    with jax.set_mesh(mesh):
        args = [jax.device_put(v, NamedSharding(mesh, s)) for v, s in ((x, x_spec), (y, y_spec))]
        z, (gx, gy) = jax.jit(lambda x, y: (f(x, y), jax.grad(lambda x, y: jnp.sum(f(x, y) * w), (0, 1))(x, y)))(*args)
    blocks = np.split(x, p)  # rank r's block of x
    if op == "allgather_matmul":  # every rank: all_gather(x) @ y
        want, w_sum = np.tile(x @ y, (p, 1)), sum(np.split(w, p))
        want_gx, want_gy = w_sum @ y.T, x.T @ w_sum
    else:  # the sum over ranks of x_r @ y, rank r keeping row block r
        want = sum(b @ y for b in blocks)
        want_gx, want_gy = np.tile(w @ y.T, (p, 1)), sum(b.T @ w for b in blocks)
    for what, got, expected in (("result", z, want), ("dx", gx, want_gx), ("dy", gy, want_gy)):
        np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-5, err_msg=what)


@pytest.mark.parametrize("op", ["allgather_matmul", "allgather_matmul bidirectional", "matmul_reduce_scatter",
                                "matmul_reduce_scatter bidirectional"])
def test_vmap_with_spmd_axis_name_over_the_shard_map(op):
    """jax.vmap(shard_map(block), spmd_axis_name="data") on an Auto mesh: the
    batch is split over "data", and the batched blocks vary over it too. The
    rings' loop carries (zeros, and blocks after a ppermute) were typed by the
    unbatched trace, varying over "model" alone, and the batched loop refused
    them: "Scan carry input and output got mismatched varying manual axes"
    (allgather_matmul, and both backward passes), where the formulation runs.
    Result (y batched or not) and gradients (y batched: with y unbatched JAX
    refuses the gradient of any custom_vjp function there, its summed
    cotangent typed varying over "data") against numpy."""
    op, bidirectional = op.split()[0], op.endswith("bidirectional")
    mesh = make_mesh((2, 4), "auto")
    p, b, m, k, n = 4, 2, 3, 5, 2
    kw = {"bidirectional": True} if bidirectional else {}
    f = jax.shard_map(lambda x, y: getattr(dmj, op)(x, y, axis_name="model", **kw), mesh=mesh,
                      in_specs=(P("model"), P()), out_specs=P("model"))
    rows = p * m if op == "allgather_matmul" else p * p * m  # x's rows, split over the ring
    rng = np.random.default_rng(zlib.crc32(op.encode()))
    x, y = rng.standard_normal((b, rows, k)).astype(np.float32), rng.standard_normal((b, k, n)).astype(np.float32)
    w = rng.standard_normal((b, p * rows if op == "allgather_matmul" else rows // p, n)).astype(np.float32)
    g = jax.vmap(f, in_axes=(0, 0), spmd_axis_name="data")
    z, (gx, gy) = jax.jit(lambda x, y: (g(x, y), jax.grad(lambda x, y: jnp.sum(g(x, y) * w), (0, 1))(x, y)))(x, y)
    z_shared = jax.jit(jax.vmap(f, in_axes=(0, None), spmd_axis_name="data"))(x, y[0])  # one y for the batch
    for i in range(b):
        blocks = np.split(x[i], p)  # rank r's block of x
        if op == "allgather_matmul":  # every rank: all_gather(x) @ y
            w_sum = sum(np.split(w[i], p))
            want = {"result": np.tile(x[i] @ y[i], (p, 1)), "shared y": np.tile(x[i] @ y[0], (p, 1)),
                    "dx": w_sum @ y[i].T, "dy": x[i].T @ w_sum}
        else:  # the sum over ranks of x_r @ y, rank r keeping row block r
            want = {"result": sum(blk @ y[i] for blk in blocks), "shared y": sum(blk @ y[0] for blk in blocks),
                    "dx": np.tile(w[i] @ y[i].T, (p, 1)), "dy": sum(blk.T @ w[i] for blk in blocks)}
        for what, got in (("result", z), ("shared y", z_shared), ("dx", gx), ("dy", gy)):
            np.testing.assert_allclose(np.asarray(got[i]), want[what], rtol=1e-5, atol=1e-5, err_msg=f"{what} {i}")


@pytest.mark.parametrize("kinds", ["explicit", "explicit data, auto model"])
@pytest.mark.parametrize("rows", [2, 6, 12])  # x's local rows: M / P = 1, 3, 6 rows of the result over |data| = 2
def test_reduce_scatter_rows_split_over_an_explicit_automatic_axis_that_does_not_divide_the_result(kinds, rows):
    """matmul_reduce_scatter in shard_map(axis_names={"model"}), x's rows
    sharded over the Explicit axis "data" left automatic: the result was typed
    as x @ y is, its rows over "data", which M // P rows need not fill evenly
    (here 1 or 3 rows over 2), and JAX refused its own type: "ValueError:
    Sharding spec ('data',) implies that array axis 0 is partitioned 2 times,
    but does not evenly divide the dimension size 3". Such a result's rows are
    typed unsplit. Result and gradients against numpy."""
    kind = (AxisType.Explicit, AxisType.Explicit if kinds == "explicit" else AxisType.Auto)
    mesh = jax.make_mesh((2, 2), ("data", "model"), axis_types=kind)
    p, k, n = 2, 3, 4
    f = jax.shard_map(lambda x, y: dmj.matmul_reduce_scatter(x, y, axis_name="model"), mesh=mesh,
                      in_specs=(P("model"), P()), out_specs=P("model"), axis_names={"model"})
    rng = np.random.default_rng(rows)
    x, y = rng.standard_normal((p * rows, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    w = rng.standard_normal((rows, n)).astype(np.float32)
    with jax.set_mesh(mesh):
        xa = jax.device_put(x, NamedSharding(mesh, P(("model", "data"))))
        z, (gx, gy) = jax.jit(lambda x, y: (f(x, y), jax.grad(lambda x, y: jnp.sum(f(x, y) * w), (0, 1))(x, y)))(xa, y)
    blocks = np.split(x, p)  # rank r's block of x; the result: the sum, rank r keeping row block r
    want, want_gx, want_gy = sum(b @ y for b in blocks), np.tile(w @ y.T, (p, 1)), sum(b.T @ w for b in blocks)
    for what, got, expected in (("result", z, want), ("dx", gx, want_gx), ("dy", gy, want_gy)):
        np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-5, err_msg=what)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("wide", ["x", "y"])
def test_a_gradient_is_not_narrowed_to_preferred_element_type(op, wide):
    """One operand float32, the other bfloat16, preferred_element_type=bfloat16
    (jnp.dot takes them): the float32 operand's gradient was made and summed in
    bfloat16, off by ~3e-3 of its scale, where jnp.dot's own transpose makes it
    in float32. Both gradients against numpy (on the rounded inputs): the
    float32 one to float32's accuracy."""
    p, m, k, n = 4, 4, 64, 8
    mesh = make_mesh((p,), "auto")
    dtypes = {"x": jnp.float32, "y": jnp.bfloat16} if wide == "x" else {"x": jnp.bfloat16, "y": jnp.float32}
    rows = p * m if op == "allgather_matmul" else p * p * m  # x's rows, split over the ring
    rng = np.random.default_rng(zlib.crc32(f"{op}{wide}".encode()))
    x, y = (np.asarray(rng.standard_normal(s).astype(dtypes[a])) for a, s in (("x", (rows, k)), ("y", (k, n))))
    f = jax.jit(jax.shard_map(
        lambda x, y: getattr(dmj, op)(x, y, axis_name="model", preferred_element_type=jnp.bfloat16),
        mesh=mesh, in_specs=(P("model"), P()), out_specs=P("model")))
    z, pullback = jax.vjp(f, x, y)
    w = np.asarray(rng.standard_normal(z.shape).astype(jnp.bfloat16))
    gx, gy = pullback(w)
    X, Y, W = (v.astype(np.float64) for v in (x, y, w))
    if op == "allgather_matmul":  # every rank: all_gather(x) @ y
        w_sum = sum(np.split(W, p))
        want = {"x": w_sum @ Y.T, "y": X.T @ w_sum}
        bound = {"x": sum(np.split(abs(W), p)) @ abs(Y).T, "y": abs(X).T @ sum(np.split(abs(W), p))}
    else:  # the sum over ranks of x_r @ y, rank r keeping row block r
        want = {"x": np.tile(W @ Y.T, (p, 1)), "y": sum(b.T @ W for b in np.split(X, p))}
        bound = {"x": np.tile(abs(W) @ abs(Y).T, (p, 1)), "y": sum(abs(b).T @ abs(W) for b in np.split(X, p))}
    for a, got in (("x", gx), ("y", gy)):
        assert got.dtype == dtypes[a], (a, got.dtype)
        err = np.abs(np.asarray(got).astype(np.float64) - want[a]).max() / bound[a].max()
        tol = 1e-6 if a == wide else 2e-2  # float32's accuracy / bfloat16's
        assert err <= tol, f"d{a} ({got.dtype}): error {err:.3g} of its scale > {tol}"


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_local_gradient_sum_is_rounded_once(op, dtype):
    """dy sums P products on each rank (nothing of it travels): it was made and
    summed in bfloat16 (float16), P roundings, where jnp.dot's transpose makes
    it as one GEMM accumulated in float32 and rounded once (found comparing the
    blocks' gradients with the formulation's on 8 ranks: 1.3-1.4x its error).
    y is split over the ring, so that no sum over ranks follows: dy within one
    rounding of numpy's, elementwise, as the formulation's is."""
    p, m, k, n = 8, 16, 8, 4
    mesh = make_mesh((p,), "auto")
    rows = p * m if op == "allgather_matmul" else p * p * m
    rng = np.random.default_rng(zlib.crc32(f"{op}{dtype}".encode()))
    x, y = (rng.standard_normal(s).astype(jnp.dtype(dtype)) for s in ((rows, k), (k, p * n)))
    out = P(None, "model") if op == "allgather_matmul" else P("model")
    ours, ref = references(op, "model", None, None)
    for body in (ref, ours):  # the formulation meets the bound too
        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("model"), P(None, "model")), out_specs=out))
        z, pullback = jax.vjp(f, x, y)
        w = np.asarray(np.random.default_rng(1).standard_normal(z.shape).astype(jnp.dtype(dtype)))
        gy = np.asarray(pullback(w)[1]).astype(np.float64)
        X, W = x.astype(np.float64), w.astype(np.float64)
        if op == "allgather_matmul":  # rank r: all_gather(x) @ y_r; dy_r = all_gather(x).T @ dz_r
            want, bound = X.T @ W, abs(X).T @ abs(W)
        else:  # rank r: row block r of sum_q x_q @ y_q; dy_r = x_r.T @ all_gather(dz)
            want = np.concatenate([b.T @ W for b in np.split(X, p)], axis=1)
            bound = np.concatenate([abs(b).T @ abs(W) for b in np.split(X, p)], axis=1)
        unit = {"bfloat16": 2.0**-8, "float16": 2.0**-11}[dtype]  # one rounding, relative
        excess = np.abs(gy - want) - unit * np.abs(want) - 1e-5 * bound  # (float32 sums: 1e-5 of the terms)
        assert excess.max() <= 0, f"{body.__name__}: {np.sum(excess > 0)} of {excess.size} entries of dy off by " \
                                  "more than one rounding"


def test_reverse_mode_works_and_forward_mode_is_refused():
    """What docs/jax.md and the module docstring promise: grad, vjp, jacrev and
    grad of grad (checked against numpy); jvp, linearize and jacfwd refused by
    JAX, as for any custom_vjp function, and jax.linear_transpose too."""
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
    # reverse over reverse: d/dy sum(v * d/dx sum(w * f(x, y))) = d/dy sum(v * (w @ y.T)) = v.T @ w
    w, v = rng.standard_normal((16, 4)).astype(np.float32), rng.standard_normal((16, 3)).astype(np.float32)
    gyy = jax.grad(lambda y: jnp.sum(v * jax.grad(lambda x: jnp.sum(w * f(x, y)))(x)))(y)
    np.testing.assert_allclose(gyy, v.T @ w, rtol=1e-5, atol=1e-5)
    with pytest.raises(NotImplementedError, match="custom_vjp"):  # JAX transposes no custom_vjp function
        jax.linear_transpose(lambda x: f(x, y), x)(w)


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


@pytest.mark.parametrize("op", OPS)
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


@pytest.mark.parametrize("op", OPS)
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


@pytest.mark.parametrize("op", OPS)
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


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("axis", ["model", ("model", "data")])
def test_bidirectional_sends_both_ways(op, axis):
    """One way, the forward ring sends one way (AllGather+GEMM left,
    GEMM+ReduceScatter right); so does the default, None, on CPU, where the
    cost model says two rings never pay. Both ways, every ring has its twin
    sending the other half of each block the other way, forward and backward
    (the backward's rings are the transposes: AllGather's dx a ReduceScatter,
    and ReduceScatter's dx and dy one AllGather), and no whole collective runs."""
    two_way_rings(op, axis, {False: False, None: False, True: True})


def two_way_rings(op: str, axis, want: dict) -> None:
    """For each ``bidirectional`` of ``want``: whether each ring of the forward
    and backward passes has its twin the other way (``want``'s value)."""
    mesh = make_mesh((2, 4), "auto")
    ring = axis if isinstance(axis, tuple) else (axis,)
    p = math.prod(mesh.shape[a] for a in ring)
    (xshape, xspec), (yshape, yspec), zspec = layout(op, "split", mesh, axis, 4)  # 4 rows: halves of 2 and 2
    for flag, bidirectional in want.items():
        f = jax.shard_map(lambda x, y, flag=flag: getattr(dmj, op)(x, y, axis_name=axis, bidirectional=flag),
                          mesh=mesh, in_specs=(xspec, yspec), out_specs=zspec)
        for what, fn in (("forward", f), ("backward", jax.grad(lambda x, y: f(x, y).sum(), argnums=(0, 1)))):
            eqns = list(equations(jax.make_jaxpr(fn)(jnp.ones(xshape), jnp.ones(yshape))))
            sent: dict[int, list] = {-1: [], 1: []}  # direction: the shapes sent that way
            for e in eqns:
                if e.primitive.name == "ppermute" and axes_of(e) == set(ring):
                    (src, dst), *_ = e.params["perm"]
                    sent[1 if (dst - src) % p == 1 else -1].append(e.invars[0].aval.shape)
                elif e.primitive.name.startswith(COLLECTIVES):
                    assert not axes_of(e) & set(ring), (what, e)
            rows = {shape[0] for shapes in sent.values() for shape in shapes}
            assert rows == ({2} if bidirectional else {4}), (flag, what, sent)  # halves, or whole blocks
            if bidirectional:
                assert sent[-1] and sorted(sent[-1]) == sorted(sent[1]), (flag, what, sent)
            elif what == "forward":
                assert len(sent[-1 if op == "allgather_matmul" else 1]) > 0, (flag, sent)
                assert not sent[1 if op == "allgather_matmul" else -1], (flag, sent)


@pytest.mark.parametrize("op", OPS)
def test_bidirectional_none_asks_the_cost_model(op, tmp_path, monkeypatch):
    """bidirectional=None: two rings where the platform's model (here a
    calibration file that calls the CPU's links duplex) says the blocks are
    large enough to pay for a second message per step, one ring where they
    are not (a latency of 1 s); True and False as given."""
    path = tmp_path / "model.json"
    monkeypatch.setenv(_cost.MODEL_ENV, str(path))
    for alpha, pays in ((1e-12, True), (1.0, False)):
        _cost.save_models({"cpu": _cost.MachineModel(alpha, 1 / 4e9, 1 / 20e9, duplex=True)})
        assert _cost.bidirectional_pays(_cost.model_for("cpu", 4), 64, 4) is pays
        two_way_rings(op, "model", {None: pays, False: False, True: True})


# --------------------------------------------------------------------------- #
# errors
# --------------------------------------------------------------------------- #
def trace(op: str, xshape, yshape, axis="model", **kw):
    mesh = make_mesh((2, 4), "auto")
    def body(x, y):
        return getattr(dmj, op)(x, y, axis_name=axis, **kw)

    f = jax.shard_map(body, mesh=mesh, in_specs=P(), out_specs=P(), check_vma=False)
    return jax.make_jaxpr(f)(jnp.ones(xshape), jnp.ones(yshape))


@pytest.mark.parametrize("op", OPS)
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


@pytest.mark.parametrize("op", OPS)
def test_a_vmap_axis_or_an_automatic_axis_is_refused_naming_axis_name(op):
    """A ring runs over axes a shard_map makes manual. jax.vmap's axis_name,
    outside a shard_map or inside one (alone or in a tuple with a mesh axis),
    came out as JAX's "pvary should be called under jax.shard_map" or a bare
    AssertionError; a mesh axis that shard_map(axis_names=) leaves automatic
    was said to be no axis of the shard_map. Each is a ValueError naming
    axis_name, the axis and what to do."""
    y = jnp.ones((3, 2))

    def call(t, axis):
        return getattr(dmj, op)(t, y, axis_name=axis)

    vmapped = r"axis_name={} is not an axis of an enclosing jax.shard_map \(bound by another transformation"
    with pytest.raises(ValueError, match=vmapped.format("'b'") + r".*jax.vmap"):
        jax.vmap(lambda t: call(t, "b"), axis_name="b")(jnp.ones((2, 8, 3)))
    mesh = make_mesh((2, 4), "auto")
    for axis in ("b", ("model", "b")):
        f = jax.shard_map(lambda x, axis=axis: jax.vmap(lambda t: call(t, axis), axis_name="b")(x), mesh=mesh,
                          in_specs=P(), out_specs=P(), check_vma=False)
        with pytest.raises(ValueError, match=vmapped.format(re.escape(repr(axis))) + r".*manual axes here"):
            jax.make_jaxpr(f)(jnp.ones((2, 8, 3)))
    for axis in ("data", ("model", "data")):
        f = jax.shard_map(lambda x, axis=axis: call(x, axis), mesh=mesh, in_specs=P(), out_specs=P(),
                          axis_names={"model"}, check_vma=False)
        with pytest.raises(ValueError, match=re.escape(f"axis_name={axis!r} names mesh axis 'data', which the "
                                                       "enclosing jax.shard_map leaves automatic") +
                           r".*add 'data' to shard_map's axis_names"):
            jax.make_jaxpr(f)(jnp.ones((8, 3)))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("kind", ["explicit", "auto"])
def test_a_call_outside_any_shard_map_under_set_mesh_says_there_is_none(op, kind):
    """Under jax.set_mesh but outside any shard_map (eagerly or under jit),
    the mesh's axes are automatic because no shard_map encloses the call: it
    was said to be "the enclosing jax.shard_map leaves automatic (its manual
    axes: ())". The error says there is no shard_map and how to add one."""
    mesh = make_mesh((2, 4), kind)
    x, y = jnp.ones((8, 3)), jnp.ones((3, 2))
    said = (re.escape(f"{op}: called outside any jax.shard_map (under jax.set_mesh, on a mesh of axes "
                      "('data', 'model')); ") + r".*wrap the call in a function run by jax.shard_map\(f, mesh=mesh, "
            r"in_specs=\.\.\., out_specs=\.\.\.\) whose manual axes include 'model'")
    with jax.set_mesh(mesh):
        for call in (lambda: getattr(dmj, op)(x, y, axis_name="model"),
                     lambda: jax.jit(lambda a, b: getattr(dmj, op)(a, b, axis_name=("model",)))(x, y)):
            with pytest.raises(ValueError, match=said) as caught:
                call()
            assert "enclosing" not in str(caught.value)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize(
    "x, kw, error, words",
    [  # found by tests/test_bad_inputs.py: JAX's own errors (naming no argument) or an internal one came out
        (None, {}, ValueError, ["x must be an array of numbers", "got NoneType"]),
        ({}, {}, TypeError, ["x must be an array of numbers", "got dict"]),
        (np.ones((8, 3), object), {}, TypeError, ["x must be an array of numbers", "ndarray of dtype object"]),
        ([[1.0], [1.0, 2.0]], {}, ValueError, ["x must be an array of numbers", "got list"]),
        (np.ones((8, 3)), {"precision": "fast"}, ValueError, ["precision='fast' is none that jnp.dot takes"]),
        (np.ones((8, 3)), {"precision": np.array([1, 2])}, ValueError, ["precision=array([1, 2]) is none"]),
        (np.ones((8, 3)), {"axis_name": {"model"}}, TypeError, ["axis_name must be a mesh axis name", "{'model'}"]),
    ],
)
def test_bad_operands_and_options_name_the_argument(op, x, kw, error, words):
    kw = {"axis_name": "model", **kw}
    mesh = make_mesh((2, 4), "auto")
    f = jax.shard_map(lambda: getattr(dmj, op)(x, np.ones((3, 2)), **kw), mesh=mesh, in_specs=(), out_specs=P(),
                      check_vma=False)
    with pytest.raises(error) as e:
        jax.make_jaxpr(f)()
    for word in words:
        assert word in str(e.value), (word, str(e.value))


def test_options_are_keyword_only():
    with pytest.raises(TypeError):
        dmj.allgather_matmul(jnp.ones((4, 3)), jnp.ones((3, 2)), "model")  # type: ignore[misc]
    for op in OPS:
        for flag in ("no", "false", 0):  # bool("no") is True: a string would turn the two-way ring on
            with pytest.raises(TypeError, match=rf"{op}: bidirectional must be True, False or None .*, got"):
                getattr(dmj, op)(jnp.ones((4, 3)), jnp.ones((3, 2)), axis_name="model", bidirectional=flag)


# --------------------------------------------------------------------------- #
# documentation
# --------------------------------------------------------------------------- #
def test_jax_md_shard_map_section_runs():
    """docs/jax.md "Inside your own shard_map": the MLP and its gradients, as written."""
    page = (ROOT / "docs" / "jax.md").read_text()
    section = page.split("## Inside your own shard_map", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    exec(compile(code, "docs/jax.md", "exec"), {})
