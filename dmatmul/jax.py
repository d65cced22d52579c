"""Collective matmul building blocks for code that already runs inside ``jax.shard_map``.

===============================================  =================================================================
call (inside ``shard_map``)                      equals
===============================================  =================================================================
``allgather_matmul(x, y, axis_name=ax)``         ``lax.all_gather(x, ax, axis=0, tiled=True) @ y``
``matmul_reduce_scatter(x, y, axis_name=ax)``    ``lax.psum_scatter(x @ y, ax, scatter_dimension=0, tiled=True)``
===============================================  =================================================================

Both run as rings of ``lax.ppermute`` whose transfers overlap the local GEMMs
(the ring kernels of dmatmul's JAX backend) instead of one blocking collective
followed by one GEMM, and both are differentiable: the backward pass is a ring
too (the transpose of AllGather+GEMM is GEMM+ReduceScatter and vice versa).
That is reverse mode (``grad``, ``vjp``, ``jacrev``, and ``grad`` of
``grad``); as for any ``jax.custom_vjp`` function, JAX refuses forward mode
(``jvp``, ``linearize``, ``jacfwd``) and ``jax.linear_transpose``.

``axis_name`` is one mesh axis or a tuple of them, in any order (the ranks are
numbered as ``lax.axis_index`` numbers them, so a tuple's first axis is the
major one, as for ``all_gather``); the other mesh axes stay independent. Any
mesh works (``jax.make_mesh``'s Explicit axes or Auto ones), under ``jit`` or
not, with ``check_vma`` on (the default) or off, and in a ``shard_map`` manual
over the ring's axes only (``axis_names=``), where the other axes may still
shard the blocks. ``precision`` and
``preferred_element_type`` mean what they mean to ``jnp.dot``: ``None``
precision follows ``jax.default_matmul_precision``; mixed input dtypes are
allowed as ``jnp.dot`` allows them. ``bidirectional=True`` sends half of each
block each way around the ring (two rings at once, for links that carry both
directions at full speed), in the backward pass too; the default, ``None``,
does so where the platform's cost model says it pays (:mod:`dmatmul._cost`:
large blocks on GPU and TPU, never on CPU).

A tensor-parallel MLP on a ``data x model`` mesh, rings over ``model`` only
(each ``data`` row of the mesh runs its own rings). The activations' rows are
split over all 8 devices (sequence parallel); ``w1``'s columns and ``w2``'s
rows over ``model``:

>>> import jax, jax.numpy as jnp, numpy as np
>>> from jax.sharding import NamedSharding, PartitionSpec as P
>>> import dmatmul.jax as dmj
>>> mesh = jax.make_mesh((2, 4), ("data", "model"))
>>> def mlp(x, w1, w2):  # local blocks: x (4, 16), w1 (16, 8), w2 (8, 16)
...     h = dmj.allgather_matmul(x, w1, axis_name="model")  # (16, 8): its data row's tokens
...     return dmj.matmul_reduce_scatter(jax.nn.relu(h), w2, axis_name="model")  # (4, 16)
>>> specs = (P(("data", "model")), P(None, "model"), P("model", None))
>>> f = jax.jit(jax.shard_map(mlp, mesh=mesh, in_specs=specs, out_specs=P(("data", "model"))))
>>> rng = np.random.default_rng(0)
>>> x, w1, w2 = (rng.standard_normal(s, dtype=np.float32) for s in ((32, 16), (16, 32), (32, 16)))
>>> args = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip((x, w1, w2), specs)]
>>> out = f(*args)
>>> out.shape, bool(np.allclose(out, np.maximum(x @ w1, 0) @ w2, rtol=1e-4, atol=1e-4))
((32, 16), True)
>>> with jax.set_mesh(mesh):  # (Explicit axes: code outside shard_map sees the mesh)
...     g = jax.grad(lambda *a: f(*a).sum(), argnums=(0, 1, 2))(*args)  # backward: rings too
>>> [t.shape for t in g]
[(32, 16), (16, 32), (32, 16)]
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Hashable, Set
from typing import Any

try:
    import jax
except ModuleNotFoundError as e:  # jax absent, or blocked (sys.modules["jax"] = None)
    if e.name != "jax":
        raise
    raise ModuleNotFoundError("dmatmul.jax needs JAX: pip install 'dmatmul[jax]'", name="jax") from e
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import _cost
from .backends.jax._kernels import (
    contract, ring_allgathers, ring_parts, ring_pieces, ring_reduce_scatters, traced_platform, varying_zeros,
)

__all__ = ["allgather_matmul", "matmul_reduce_scatter"]


@dataclasses.dataclass(frozen=True)
class _Ring:
    """What a ring needs besides its operands (static, hashable)."""

    axis: Any  # the axis name or tuple as given (its order numbers the ranks)
    p: int  # ranks on the ring
    vma: tuple[Hashable, ...]  # mesh axes the operands vary over (empty when check_vma is off)
    precision: Any
    dtype: Any  # the product's dtype (preferred_element_type, or what jnp.dot would return)
    bidirectional: bool = False  # half of each block each way (parts)

    def mm(self, a: jax.Array, b: jax.Array, ka: int, kb: int) -> jax.Array:
        return contract(a, b, ka, kb, self.precision, self.dtype)

    def zeros(self, shape: tuple[int, ...]) -> jax.Array:
        return varying_zeros(shape, self.dtype, self.vma)

    def for_cotangent(self, operand: jax.Array) -> _Ring:
        """This ring, its products made and summed in the wider of the product's
        dtype and ``operand``'s: the gradient of an operand wider than
        ``preferred_element_type`` is not narrowed to it (``jnp.dot``'s own
        transpose makes it in the operand's dtype). A real product of complex
        operands has a real gradient, as ``jnp.dot``'s (its transpose keeps the
        real part, as the forward product does), made in the real counterpart."""
        dtype = jnp.promote_types(self.dtype, operand.dtype)
        if jnp.issubdtype(dtype, jnp.complexfloating) and not jnp.issubdtype(self.dtype, jnp.complexfloating):
            dtype = jnp.finfo(dtype).dtype
        return self if dtype == jnp.dtype(self.dtype) else dataclasses.replace(self, dtype=dtype)

    def summing(self) -> _Ring:
        """This ring, its products made in at least float32: for a sum that
        stays on this rank (nothing of it travels), rounded to the gradient's
        dtype once, at the end, as one GEMM's accumulator is (``jnp.dot``'s
        transpose makes it as one GEMM); summed in bfloat16 it took P roundings."""
        if jnp.issubdtype(self.dtype, jnp.floating) and jnp.dtype(self.dtype).itemsize < 4:
            return dataclasses.replace(self, dtype=jnp.dtype(jnp.float32))
        return self

    def parts(self, m: int) -> tuple[tuple[int, int, int], ...]:
        """How a block of ``m`` rows travels (:func:`~dmatmul.backends.jax._kernels.ring_parts`):
        ``(start, stop, shift)`` per part; both ways where ``bidirectional``."""
        return ring_parts(m, self.bidirectional)

    def pieces(self, a: jax.Array, axis: int) -> tuple[tuple[jax.Array, int, int], ...]:
        """What travels of block ``a`` (split along ``axis``, :meth:`parts`):
        ``(piece, shift, offset)``."""
        return ring_pieces(a, axis, self.bidirectional)


def allgather_matmul(
    x: jax.Array,
    y: jax.Array,
    *,
    axis_name: Any,
    precision: Any = None,
    preferred_element_type: Any = None,
    bidirectional: bool | None = None,
) -> jax.Array:
    """``lax.all_gather(x, axis_name, axis=0, tiled=True) @ y`` as a ring, inside ``shard_map``.

    Args:
      x: this rank's row block, ``(m, k)``; the result stacks the ``P`` ranks'
        blocks in ``lax.axis_index(axis_name)`` order.
      y: this rank's ``(k, n)`` right operand (replicated, or a column block).
      axis_name: the mesh axis, or tuple of mesh axes, of the ring (``P`` ranks).
      precision: as ``jnp.dot`` (``None``: ``jax.default_matmul_precision``).
      preferred_element_type: as ``jnp.dot`` (the result's dtype).
      bidirectional: send the first half of each block's rows left and the
        rest right, two rings at once (for links that carry both directions at
        full speed; the same result). The backward rings do the same. None
        (the default): where the platform's cost model says two rings pay for
        blocks of ``x``'s size (full-duplex links, blocks whose bytes outweigh
        a second message per step: GPU and TPU; never on CPU). Under
        ``jax.distributed``, the default model's constants: every process
        must choose alike, whatever calibration file it finds.

    Returns:
      ``(P * m, n)``: the gathered rows times ``y``. Rank ``r`` starts with its
      own block and passes blocks to rank ``r - 1``; each step's transfer
      overlaps that step's GEMM. The gradient is a ring as well: ``dx`` is
      ``matmul_reduce_scatter(dz, y.T)`` and ``dy = all_gather(x).T @ dz``
      reuses the ring of ``x``'s blocks.

    Raises:
      ValueError: an operand is not 2-D, the inner dimensions differ, or
        ``axis_name`` is not a manual axis of the enclosing ``shard_map`` (a
        ``jax.vmap`` axis, or a mesh axis its ``axis_names`` leave automatic).
      TypeError: ``preferred_element_type`` is not a dtype, or one that
        ``jnp.dot`` refuses for these operands; ``bidirectional`` is not
        True, False or None.
    """
    name = "allgather_matmul"
    ring, x, y = _prepare(name, x, y, axis_name, precision, preferred_element_type, bidirectional)
    ring = _directions(ring, bidirectional, x.shape[0] * x.shape[1] * x.dtype.itemsize)  # x's blocks travel
    return _allgather_matmul_jit(x, y, ring)


def matmul_reduce_scatter(
    x: jax.Array,
    y: jax.Array,
    *,
    axis_name: Any,
    precision: Any = None,
    preferred_element_type: Any = None,
    bidirectional: bool | None = None,
) -> jax.Array:
    """``lax.psum_scatter(x @ y, axis_name, scatter_dimension=0, tiled=True)`` as a ring, inside ``shard_map``.

    Args:
      x: this rank's ``(M, k)`` left operand; ``M`` must be a multiple of the
        number of ranks ``P`` on ``axis_name``.
      y: this rank's ``(k, n)`` right operand. ``x @ y`` is this rank's partial
        sum (typically ``k`` is this rank's slice of the contraction).
      axis_name: the mesh axis, or tuple of mesh axes, of the ring.
      precision: as ``jnp.dot`` (``None``: ``jax.default_matmul_precision``).
      preferred_element_type: as ``jnp.dot``; the partial sums travel and are
        added in this dtype.
      bidirectional: sum the first half of each result block's rows rightwards
        and the rest leftwards, two rings at once (for links that carry both
        directions at full speed; the same result). The backward ring gathers
        ``dz``'s halves the other way round each. None (the default): where
        the platform's cost model says two rings pay for a result block's
        partial sums (as for ``allgather_matmul``).

    Returns:
      ``(M // P, n)``: row block ``lax.axis_index(axis_name)`` of the sum over
      the ranks of ``x @ y``. Rank ``r`` passes partial sums to ``r + 1``, each
      step's transfer overlapping the GEMM of the next block. The gradient
      gathers ``dz`` around one ring (two, ``bidirectional``): ``dx = all_gather(dz) @ y.T`` and
      ``dy = x.T @ all_gather(dz)``.

    Raises:
      ValueError: an operand is not 2-D, the inner dimensions differ, ``M`` is
        not a multiple of ``P``, or ``axis_name`` is not a manual axis of the
        enclosing ``shard_map`` (a ``jax.vmap`` axis, or a mesh axis its
        ``axis_names`` leave automatic).
      TypeError: ``preferred_element_type`` is not a dtype, or one that
        ``jnp.dot`` refuses for these operands; ``bidirectional`` is not
        True, False or None.
    """
    name = "matmul_reduce_scatter"
    ring, x, y = _prepare(name, x, y, axis_name, precision, preferred_element_type, bidirectional)
    if x.shape[0] % ring.p:
        rows = x.shape[0]
        raise ValueError(
            f"{name}: x @ y has {rows} rows (x has shape {tuple(x.shape)}), which {ring.p} ranks on "
            f"axis_name={ring.axis!r} cannot split evenly; pad x's rows to a multiple of {ring.p} "
            f"(jnp.pad(x, ((0, {-rows % ring.p}), (0, 0)))) and drop the padding rows of the result"
        )
    # the partial sums of a result block travel
    ring = _directions(ring, bidirectional, x.shape[0] // ring.p * y.shape[1] * jnp.dtype(ring.dtype).itemsize)
    return _matmul_reduce_scatter_jit(x, y, ring)


def _on_auto_axes(fn: Any, args: tuple[jax.Array, ...], out_specs: Any) -> Any:
    """``fn(*args)``; where the blocks are sharded over Explicit mesh axes that
    the enclosing ``shard_map`` left automatic (``axis_names=`` a subset), it
    runs with those axes Auto (``jax.sharding.auto_axes``: the rings index and
    update their blocks along the manual rows, which Explicit typing refuses)
    and its results are typed as ``out_specs()`` says along them. Forward and
    backward passes are wrapped apart (a closure over Explicit-sharded
    residuals would not transpose)."""
    mesh = jax.sharding.get_abstract_mesh()
    explicit = set(getattr(mesh, "explicit_axes", ()))
    used = {a for v in args for part in _spec(v) for a in _axes_of(part)}
    axes = tuple(a for a in mesh.axis_names if a in explicit & used)
    if not axes:
        return fn(*args)
    return jax.sharding.auto_axes(fn, axes=axes, out_sharding=out_specs())(*args)


def _product_spec(x: jax.Array, y: jax.Array, ring: _Ring, rows: int | None = None) -> Any:
    """How ``x @ y`` is typed along the automatic axes (as ``jnp.dot`` types it;
    its error where that is ambiguous): the rings' results are typed so, on
    ``rows`` rows where given (a reduce-scatter's ``M // P``). Where the rows
    do not split evenly over the axes that split x's rows (1 row over a
    2-device axis), the trailing axes that do not divide them are dropped:
    those rows are typed unsplit along them. (The traced type:
    ``jax.eval_shape`` gives no sharding, None, where the mesh has Auto axes
    besides Explicit ones.)"""
    spec = jax.make_jaxpr(lambda u, v: ring.mm(u, v, 1, 0))(x, y).out_avals[0].sharding.spec
    if rows is None or not spec or spec[0] is None:
        return spec
    sizes = dict(jax.sharding.get_abstract_mesh().shape)
    axes = list(_axes_of(spec[0]))
    while axes and rows % int(np.prod([sizes[a] for a in axes])):
        axes.pop()
    part = tuple(axes) if len(axes) > 1 else axes[0] if axes else None
    return jax.sharding.PartitionSpec(part, *spec[1:])


def _spec(x: jax.Array) -> Any:
    """``x``'s PartitionSpec along the mesh's automatic axes (as typed)."""
    sharding = getattr(jax.typeof(x), "sharding", None)
    return getattr(sharding, "spec", None) or jax.sharding.PartitionSpec()


def _axes_of(part: Any) -> tuple:
    return () if part is None else tuple(part) if isinstance(part, tuple) else (part,)


# --------------------------------------------------------------------------- #
# checks and vma alignment
# --------------------------------------------------------------------------- #
def _prepare(
    name: str, x: Any, y: Any, axis_name: Any, precision: Any, preferred: Any, bidirectional: Any
) -> tuple[_Ring, Any, Any]:
    if bidirectional is not None and not isinstance(bidirectional, (bool, np.bool_)):
        raise TypeError(
            f"{name}: bidirectional must be True, False or None (the cost model decides), got {bidirectional!r}"
        )
    x, y = _operand(name, "x", x), _operand(name, "y", y)
    for arg, v, fix in (("x", x, "(rows, k)"), ("y", y, "(k, columns)")):
        if v.ndim != 2:
            raise ValueError(
                f"{name}: {arg} must be 2-D {fix}, got shape {tuple(v.shape)}; reshape it "
                f"(e.g. {arg}.reshape(-1, {arg}.shape[-1]) folds leading batch dimensions into the rows)"
                if arg == "x" and v.ndim > 2
                else f"{name}: {arg} must be 2-D {fix}, got shape {tuple(v.shape)}; pass a matrix"
            )
    if x.shape[1] != y.shape[0]:
        raise ValueError(
            f"{name}: x has shape {tuple(x.shape)} and y has shape {tuple(y.shape)}, but x's columns "
            f"({x.shape[1]}) must equal y's rows ({y.shape[0]}); these are the local blocks this rank holds"
        )
    axis = tuple(axis_name) if isinstance(axis_name, list) else axis_name
    precision = tuple(precision) if isinstance(precision, list) else precision  # static: hashable
    if precision is None:  # read now, as jnp.dot reads it: the backward pass may run outside this context
        precision = getattr(jax.config, "jax_default_matmul_precision")  # noqa: B009 - untyped in the stubs
    if isinstance(axis, tuple) and not axis:
        raise ValueError(f"{name}: axis_name=() names no mesh axis; pass a mesh axis name or a tuple of them")
    names = axis if isinstance(axis, tuple) else (axis,)
    # JAX would read an int as a position; a name is hashable (a dict, a set or an array is none)
    if any(isinstance(n, (int, np.integer)) or n is None or not isinstance(n, Hashable) for n in names):
        raise TypeError(
            f"{name}: axis_name must be a mesh axis name (e.g. 'model') or a tuple of them, got {axis_name!r}"
        )
    if len(set(names)) != len(names):
        raise ValueError(f"{name}: axis_name={axis!r} names a mesh axis twice; name each axis of the ring once")
    try:
        p = int(lax.axis_size(axis))
    except NameError as e:
        raise ValueError(_not_a_ring(name, axis, names, str(e))) from e
    manual = tuple(getattr(jax.sharding.get_abstract_mesh(), "manual_axes", ()))
    if any(n not in manual for n in names):  # bound, but not by shard_map (jax.vmap's axis_name)
        raise ValueError(_not_a_ring(name, axis, names, "bound by another transformation, such as jax.vmap"))
    refused = _refused_by_dot(x, y, precision=precision)
    if refused is not None:  # (else JAX's own error would come from inside the ring, naming no argument)
        raise ValueError(
            f"{name}: precision={precision!r} is none that jnp.dot takes ({refused}); pass None, 'default', "
            "'high', 'highest', a jax.lax.Precision or a pair of them"
        ) from refused
    # the product's dtype, as jnp.dot chooses it
    dtype = jnp.result_type(x, y) if preferred is None else _preferred(name, x, y, preferred)
    # As jnp.dot does, type both operands as varying over the union of their
    # axes and the ring's (a no-op with check_vma off); the transposes of these
    # casts sum the gradients of operands that were invariant.
    vma = _vma(x) | _vma(y) | set(names)
    order = _mesh_order(vma)
    x = _vary(x, order)
    y = _vary(y, order)
    ring = _Ring(axis=axis, p=p, vma=tuple(a for a in order if a in _vma(x)), precision=precision, dtype=dtype)
    return ring, x, y


def _directions(ring: _Ring, bidirectional: bool | None, nbytes: int) -> _Ring:
    """``ring`` sending half of each block each way where ``bidirectional``
    says so; None: where the cost model of the platform being traced says two
    opposite rings of blocks of ``nbytes`` pay (:func:`dmatmul._cost.bidirectional_pays`:
    never on CPU). Under ``jax.distributed`` every process traces its own
    rings, which must be the same: the default model decides there, not the
    calibration file each process reads (one that differs, or that one process
    cannot read, would send one ring's blocks into another's: a collective
    mismatch, or a process raising while the others wait)."""
    if bidirectional is None:
        model = _cost.model_for(traced_platform(), ring.p, calibrated=jax.process_count() == 1)
        bidirectional = _cost.bidirectional_pays(model, nbytes, ring.p)
    return dataclasses.replace(ring, bidirectional=bool(bidirectional))


def _not_a_ring(name: str, axis: Any, names: tuple, why: str) -> str:
    """Why ``axis`` cannot number a ring here: a mesh axis of a mesh set with
    no ``shard_map`` around the call, one the enclosing ``shard_map`` leaves
    automatic (``axis_names=``), or no ``shard_map`` axis."""
    mesh = jax.sharding.get_abstract_mesh()
    manual = tuple(getattr(mesh, "manual_axes", ()))
    auto = [n for n in names if n in tuple(mesh.axis_names) and n not in manual]
    if auto and not manual:  # a mesh set (jax.set_mesh, jit's) but no shard_map: none has made an axis manual
        return (
            f"{name}: called outside any jax.shard_map (under jax.set_mesh, on a mesh of axes "
            f"{tuple(mesh.axis_names)}); {name} runs inside one: wrap the call in a function run by "
            f"jax.shard_map(f, mesh=mesh, in_specs=..., out_specs=...) whose manual axes include {auto[0]!r} "
            f"(axis_name={axis!r})"
        )
    if auto:
        return (
            f"{name}: axis_name={axis!r} names mesh axis {auto[0]!r}, which the enclosing jax.shard_map leaves "
            f"automatic (its manual axes: {manual}); a ring runs over manual axes: add {auto[0]!r} to "
            "shard_map's axis_names"
        )
    here = f" (its manual axes here: {manual})" if manual else ""
    return (
        f"{name}: axis_name={axis!r} is not an axis of an enclosing jax.shard_map ({why}); call {name} "
        f"inside a function run by jax.shard_map whose mesh has that axis{here}"
    )


def _operand(name: str, arg: str, v: Any) -> jax.Array:
    """``jnp.asarray(v)``; what JAX cannot take as an array, refused naming ``arg``."""
    try:
        return jnp.asarray(v)
    except (TypeError, ValueError) as e:
        dtype = f" of dtype {v.dtype}" if isinstance(getattr(v, "dtype", None), np.dtype) else ""
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise type(e)(
            f"{name}: {arg} must be an array of numbers (a jax.Array, or what jnp.asarray takes), got "
            f"{type(v).__name__}{dtype} ({why})"
        ) from e


def _refused_by_dot(x: jax.Array, y: jax.Array, **options: Any) -> Exception | None:
    """What ``lax.dot_general`` of x's and y's dtypes raises for ``options``
    (precision, preferred_element_type), as jnp.dot would; None where it takes them."""
    dims = (((1,), (0,)), ((), ()))
    try:
        jax.eval_shape(
            functools.partial(lax.dot_general, dimension_numbers=dims, **options),
            jax.ShapeDtypeStruct((1, 1), x.dtype),
            jax.ShapeDtypeStruct((1, 1), y.dtype),
        )
    except (TypeError, ValueError) as e:
        return e
    return None


def _preferred(name: str, x: jax.Array, y: jax.Array, preferred: Any) -> np.dtype:
    """``preferred_element_type`` as a dtype, where jnp.dot takes it for these
    operands (it refuses, e.g., one narrower than a complex operand's); else a
    TypeError naming the argument, the operands' dtypes and the fix."""
    refused: Exception | None
    try:
        dtype = np.dtype(jax.dtypes.canonicalize_dtype(preferred))
    except TypeError as e:
        refused = e
    else:
        refused = _refused_by_dot(x, y, preferred_element_type=dtype)
    if refused is not None:
        product, why = jnp.result_type(x, y), str(refused).rstrip(".")
        raise TypeError(
            f"{name}: preferred_element_type={preferred!r} cannot be the dtype of the product of x ({x.dtype}) "
            f"and y ({y.dtype}); jnp.dot refuses it too ({why}). Pass preferred_element_type=None (the product "
            f"is then {product}) or a dtype at least as wide as {product}"
        ) from refused
    return dtype


def _cotangent(g: jax.Array, x: jax.Array) -> jax.Array:
    """The gradient ``g`` typed as its operand ``x``: of a real operand (multiplied by
    a complex one), the real part, as JAX's own transpose of a dot takes it."""
    if jnp.iscomplexobj(g) and not jnp.issubdtype(x.dtype, jnp.complexfloating):
        g = jnp.real(g)
    return g.astype(x.dtype)


def _vma(x: jax.Array) -> frozenset:
    aval = jax.typeof(x)
    mat = getattr(aval, "mat", None)  # JAX 0.10
    return frozenset(mat.varying if mat is not None else getattr(aval, "vma", ()))


def _mesh_order(names: Set[Any]) -> tuple:
    mesh_names = tuple(jax.sharding.get_abstract_mesh().axis_names)
    return tuple(n for n in mesh_names if n in names) + tuple(n for n in names if n not in mesh_names)


def _vary(x: jax.Array, order: tuple) -> jax.Array:
    missing = tuple(n for n in order if n not in _vma(x))
    return lax.pcast(x, missing, to="varying") if missing else x


# --------------------------------------------------------------------------- #
# the rings (forward and backward)
# --------------------------------------------------------------------------- #
def _gather_rows(a: jax.Array, b: jax.Array, ka: int, kb: int, ring: _Ring) -> jax.Array:
    """all_gather(a) . b with a's free axis gathered into the result's rows."""
    m = a.shape[1 - ka]
    pieces = ring.pieces(a, 1 - ka)

    def step(acc: jax.Array, i: int, blk: jax.Array, j: jax.Array) -> jax.Array:
        return lax.dynamic_update_slice_in_dim(acc, ring.mm(blk, b, ka, kb), j * m + pieces[i][2], axis=0)

    zeros = ring.zeros((ring.p * m, b.shape[1 - kb]))
    return ring_allgathers(tuple((pc, shift) for pc, shift, _ in pieces), zeros, step, ring.p, ring.axis,
                           python_loop=True)


def _scatter_rows(a: jax.Array, b: jax.Array, ka: int, kb: int, ring: _Ring) -> jax.Array:
    """psum_scatter(a . b) over the result's rows (a's free axis)."""
    m = a.shape[1 - ka] // ring.p
    parts = ring.parts(m)

    def partial(start: int, stop: int) -> Any:
        def rows(j: jax.Array) -> jax.Array:  # rows start:stop of block j
            return ring.mm(lax.dynamic_slice_in_dim(a, j * m + start, stop - start, axis=1 - ka), b, ka, kb)

        return rows

    sums = ring_reduce_scatters(tuple((partial(start, stop), -shift) for start, stop, shift in parts), ring.p,
                                ring.axis)
    return sums[0] if len(sums) == 1 else lax.concatenate(sums, 0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _allgather_matmul(x: jax.Array, y: jax.Array, ring: _Ring) -> jax.Array:
    return _on_auto_axes(lambda u, v: _gather_rows(u, v, 1, 0, ring), (x, y), lambda: _product_spec(x, y, ring))


def _allgather_matmul_fwd(x: jax.Array, y: jax.Array, ring: _Ring) -> tuple[jax.Array, Any]:
    return _allgather_matmul(x, y, ring), (x, y)


def _allgather_matmul_bwd(ring: _Ring, res: Any, dz: jax.Array) -> tuple[jax.Array, jax.Array]:
    x, y = res
    return _on_auto_axes(lambda *a: _allgather_matmul_grads(ring, *a), (x, y, dz), lambda: (_spec(x), _spec(y)))


def _allgather_matmul_grads(ring: _Ring, x: jax.Array, y: jax.Array, dz: jax.Array) -> tuple[jax.Array, jax.Array]:
    m = x.shape[0]
    rx, ry = ring.for_cotangent(x), ring.for_cotangent(y).summing()
    dx = _scatter_rows(dz, y, 1, 1, rx)  # psum_scatter(dz @ y.T)

    pieces = ring.pieces(x, 0)

    def step(acc: jax.Array, i: int, blk: jax.Array, j: jax.Array) -> jax.Array:  # x_j.T @ dz_j
        rows = lax.dynamic_slice_in_dim(dz, j * m + pieces[i][2], blk.shape[0], axis=0)
        return acc + ry.mm(blk, rows, 0, 0)

    dy = ring_allgathers(tuple((pc, shift) for pc, shift, _ in pieces), ry.zeros(y.shape), step, ring.p, ring.axis,
                         python_loop=True)
    return _cotangent(dx, x), _cotangent(dy, y)


_allgather_matmul.defvjp(_allgather_matmul_fwd, _allgather_matmul_bwd)
# jitted: one dispatch per call where shard_map runs eagerly (op by op); inlined under an outer jit
_allgather_matmul_jit = jax.jit(_allgather_matmul, static_argnums=2)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _matmul_reduce_scatter(x: jax.Array, y: jax.Array, ring: _Ring) -> jax.Array:
    return _on_auto_axes(lambda u, v: _scatter_rows(u, v, 1, 0, ring), (x, y),
                         lambda: _product_spec(x, y, ring, rows=x.shape[0] // ring.p))


def _matmul_reduce_scatter_fwd(x: jax.Array, y: jax.Array, ring: _Ring) -> tuple[jax.Array, Any]:
    return _matmul_reduce_scatter(x, y, ring), (x, y)


def _matmul_reduce_scatter_bwd(ring: _Ring, res: Any, dz: jax.Array) -> tuple[jax.Array, jax.Array]:
    x, y = res
    return _on_auto_axes(lambda *a: _matmul_reduce_scatter_grads(ring, *a), (x, y, dz), lambda: (_spec(x), _spec(y)))


def _matmul_reduce_scatter_grads(
    ring: _Ring, x: jax.Array, y: jax.Array, dz: jax.Array
) -> tuple[jax.Array, jax.Array]:
    m = dz.shape[0]
    rx, ry = ring.for_cotangent(x), ring.for_cotangent(y).summing()
    pieces = ring.pieces(dz, 0)  # the transpose of the forward's rings: each part gathered the other way

    def step(acc: tuple[jax.Array, jax.Array], i: int, blk: jax.Array, j: jax.Array) -> tuple[jax.Array, jax.Array]:
        dx, dy = acc  # one ring of dz's blocks feeds both: dx_j = dz_j @ y.T, dy += x_j.T @ dz_j
        at = j * m + pieces[i][2]
        dx = lax.dynamic_update_slice_in_dim(dx, rx.mm(blk, y, 1, 1), at, axis=0)
        return dx, dy + ry.mm(lax.dynamic_slice_in_dim(x, at, blk.shape[0], axis=0), blk, 0, 0)

    dx, dy = ring_allgathers(tuple((pc, shift) for pc, shift, _ in pieces), (rx.zeros(x.shape), ry.zeros(y.shape)),
                             step, ring.p, ring.axis, python_loop=True)
    return _cotangent(dx, x), _cotangent(dy, y)


_matmul_reduce_scatter.defvjp(_matmul_reduce_scatter_fwd, _matmul_reduce_scatter_bwd)
_matmul_reduce_scatter_jit = jax.jit(_matmul_reduce_scatter, static_argnums=2)
