"""One dmatmul product as one nvmath-python call, described as plain data.

Nothing here imports nvmath-python, CuPy or MPI: :func:`translate` turns a
:class:`Problem` (global sizes, transposes, dmatmul distributions, the memory
order of each local block, epilog, requested algorithm) into a
:class:`Translation`, a frozen value that says exactly what the execution
layer hands to ``nvmath.distributed.linalg.advanced.Matmul``:

* per operand a :class:`Handover`: which nvmath slot it fills (A, B or C),
  whether it is handed over as it is or as the transposed view of a C-order
  block, the ``is_transpose`` qualifier, the nvmath distribution as data
  (:class:`NvDistribution`: grid shape and layout, block sizes,
  first_process), the nvmath-side global shape and whether (and why) a copy
  is made;
* per logical dimension M, K, N a :class:`DimPlan`: the block size nvmath
  uses and the zero padding that makes an uneven Slab expressible;
* the cuBLASMp path the rules predict (``path``) and the contract name
  (``algorithm``), what is fused into cuBLASMp's epilogue and what dmatmul
  applies afterwards, whether the result is allgathered by dmatmul.

The rules (nvmath-python 1.0 and cuBLASMp < 0.10)
-------------------------------------------------
*Fortran order.* cuBLASMp takes column-major local blocks. A C-order block of
``X`` is the Fortran-order block of ``X.T``, whose distribution is the
transposed one (``Slab.X <-> Slab.Y``; a grid ``(r, c)`` in row-major order
becomes ``(c, r)`` in column-major order, block sizes and first_process
swap). So a C-order ``a`` or ``b`` is handed over as ``a.T`` (a view) with its
``is_transpose`` qualifier flipped. ``c`` cannot be flagged transposed, so
the product is computed in one of two *frames*:

* ``D = op(A) op(B)`` (not swapped): nvmath A/B/C are a/b/c; the result comes
  back in Fortran order; a C-order ``c`` must be copied.
* ``D.T = op(B).T op(A).T`` (swapped): nvmath A is ``b``, nvmath B is ``a``,
  nvmath C is ``c.T``; a C-order ``c`` is a free view and the result comes
  back as ``D.T`` in Fortran order, i.e. ``D`` in C order.

*Copies* (the decision table, see :func:`_orient`): a local block is handed
over without a copy when it is F-contiguous (as it is) or C-contiguous (as
its transposed view). A copy happens when (1) the dimension is padded (uneven
Slab), (2) a Replicated operand is cut to a split that is not a contiguous
range of its memory order, (3) the block is neither C- nor F-contiguous, (4)
``c`` is in the wrong order for the frame the fast path needs, or (5)
GEMM+AllReduce needs the TN layout and the memory order gives the other
qualifier. Among the frames a path allows, the one with fewer copied elements
wins; ties go to the frame that can fuse a bias, then to the swapped frame
(its result is C-order).

*Fast paths* (1-D, non-cyclic, uniform, first_process (0, 0)), in nvmath's
frame: AllGather+GEMM when D is split on M, op(A) on M and op(B) on N;
GEMM+ReduceScatter when D is split on N and op(A), op(B) on K; GEMM+AllReduce
with ``epilog=ALLREDUCE`` (TN only); SUMMA on one shared 2-D grid; a local GEMM
on one rank. Because the swapped frame exchanges M and N, dmatmul reaches the
mirrored triples too: ``(a: M, b: N, d: N)`` is AllGather+GEMM and
``(a: K, b: K, d: M)`` GEMM+ReduceScatter. Replicated ``a``/``b`` are cut to
whatever split the path needs (free); a Replicated result comes from the
AllReduce epilog, or is computed split and allgathered by dmatmul.

*Uneven splits.* nvmath turns every distribution into a BlockCyclic one; a
Slab of 10 rows on 4 ranks (3, 3, 2, 2) has no block size that numroc deals
the same way (block 3 gives 3, 3, 3, 1). dmatmul pads every such dimension
to ``P * ceil(S / P)`` with zeros at the end of each rank's part, so the
padded matrix is uniform (3, 3, 3, 3), and strips the padding from the
result: zero rows/columns of K add nothing, those of M and N are dropped.

>>> from dmatmul import Slab
>>> t = translate(Problem(m=10, n=8, k=6, nranks=4, transpose_a=False, transpose_b=False,
...                       distributions=(Slab.X, Slab.Y, Slab.X), orders=("C", "C", None)))
>>> t.algorithm, t.path, t.swapped, t.qualifiers
('allgather', 'AG+GEMM', False, (True, True, False))
>>> t.dim("M").padded, t.dim("M").block
(12, 3)
>>> t.handover("a").distribution
NvDistribution(grid_shape=(1, 4), grid_layout='ROW_MAJOR', block_sizes=(6, 3), first_process=(0, 0))
>>> t.handover("a").copy
'padding M 10->12 (uneven split over 4 ranks)'
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from ... import _cost, _plan
from ..._distribution import (
    BlockCyclic,
    BlockNonCyclic,
    Distribution,
    ProcessGrid,
    Replicated,
    Slab,
    slab_extent,
)
from ..._epilogue import activation, has_bias
from ..._errors import DistributionError
from ._precision import compute_type

__all__ = [
    "Order",
    "Problem",
    "DimPlan",
    "NvDistribution",
    "Handover",
    "Translation",
    "NvKernel",
    "NV_KERNELS",
    "translate",
    "order_of",
    "combine_orders",
    "needs",
]

Order = Literal["C", "F", "CF", "X"]
Role = _plan.Role
Path = Literal["AG+GEMM", "GEMM+RS", "GEMM+AR", "SUMMA", "local GEMM", "general"]

_ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "complex64": 8, "complex128": 16}
_EPILOG_NAMES = {"relu": "RELU", "gelu": "GELU", "bias": "BIAS", "relu_bias": "RELU_BIAS", "gelu_bias": "GELU_BIAS"}


# --------------------------------------------------------------------------- #
# memory order of local blocks
# --------------------------------------------------------------------------- #
def order_of(x: Any) -> Order:
    """The memory order of a 2-D array (numpy, cupy, or anything with ``flags``).

    "CF" for a block that is both (a vector, or empty), "X" for neither.
    Arrays without ``flags`` (jax) count as C-order.

    >>> order_of(np.zeros((2, 3))), order_of(np.zeros((2, 3), order="F")), order_of(np.zeros((1, 3)))
    ('C', 'F', 'CF')
    >>> order_of(np.zeros((4, 4))[:, :2])
    'X'
    """
    flags = getattr(x, "flags", None)
    if flags is None:
        return "C"
    c, f = bool(flags.c_contiguous), bool(flags.f_contiguous)
    return "CF" if c and f else "C" if c else "F" if f else "X"


def combine_orders(orders: Sequence[Order | None]) -> Order | None:
    """The order every rank's block has (what the whole job can rely on).

    >>> combine_orders(["C", "CF", "C"]), combine_orders(["C", "F"]), combine_orders([None, None])
    ('C', 'X', None)
    """
    present = [o for o in orders if o is not None]
    if not present:
        return None
    c = all(o in ("C", "CF") for o in present)
    f = all(o in ("F", "CF") for o in present)
    return "CF" if c and f else "C" if c else "F" if f else "X"


# --------------------------------------------------------------------------- #
# the inputs
# --------------------------------------------------------------------------- #
@dataclasses.dataclass(frozen=True)
class Problem:
    """What the translation needs: a :class:`dmatmul._matmul.Spec` plus the
    number of ranks and the memory orders of the local blocks.

    ``orders`` is ``(order of a, order of b, order of c or None)``, agreed on
    by all ranks (:func:`combine_orders`). ``distributions`` describe the
    *stored* ``a`` and ``b`` (as in the front end).
    """

    m: int
    n: int
    k: int
    nranks: int
    transpose_a: bool
    transpose_b: bool
    distributions: tuple[Distribution, Distribution, Distribution]
    orders: tuple[Order, Order, Order | None]
    use_c: bool = False
    epilog: str | None = None
    algorithm: str = "auto"
    dtype: str = "float32"
    alpha: complex = 1.0
    beta: complex = 0.0
    precision: str | None = None

    @classmethod
    def from_spec(cls, spec: Any, nranks: int, orders: tuple[Order, Order, Order | None]) -> Problem:
        dists = spec.distributions
        if dists is None:
            dists = (Replicated(), Replicated(), Replicated())
        return cls(
            m=spec.m, n=spec.n, k=spec.k, nranks=nranks, transpose_a=spec.transpose_a,
            transpose_b=spec.transpose_b, distributions=tuple(dists), orders=orders, use_c=spec.use_c,
            epilog=spec.epilog, algorithm=spec.algorithm, dtype=spec.dtype, alpha=spec.alpha, beta=spec.beta,
            precision=getattr(spec, "precision", None),
        )

    @property
    def transposes(self) -> tuple[bool, bool]:
        return (self.transpose_a, self.transpose_b)

    def size(self, dim: str) -> int:
        return {"M": self.m, "K": self.k, "N": self.n}[dim]

    def stored(self, operand: str) -> tuple[str, str]:
        """Logical dimensions of the stored operand's (rows, cols)."""
        t = {"a": self.transpose_a, "b": self.transpose_b, "c": False, "d": False}[operand]
        return _plan.stored_dims("d" if operand == "c" else operand, t)  # type: ignore[arg-type]

    def global_shape(self, operand: str) -> tuple[int, int]:
        r, c = self.stored(operand)
        return (self.size(r), self.size(c))

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE.get(self.dtype, 4)

    @property
    def acc_itemsize(self) -> int:
        return 4 if self.dtype in ("float16", "bfloat16") else self.itemsize


# --------------------------------------------------------------------------- #
# per-dimension padding and block sizes
# --------------------------------------------------------------------------- #
@dataclasses.dataclass(frozen=True)
class DimPlan:
    """How one logical dimension (M, K or N) looks on the nvmath side.

    ``block`` is the block size every operand uses for this dimension (cuBLASMp
    requires it equal across operands); ``padded`` the nvmath-side extent.
    With ``parts > 1`` the dimension is a Slab-like split into ``parts``
    contiguous parts, each zero-padded at its end to ``block`` items; position
    ``j*block + i`` holds item ``i`` of part ``j``.

    >>> d = DimPlan.slab("M", 10, 4)
    >>> d.block, d.padded, d.positions().tolist()
    (3, 12, [0, 1, 2, 3, 4, 5, 6, 7, 9, 10])
    >>> d.real_of_padded().tolist()
    [0, 1, 2, 3, 4, 5, 6, 7, -1, 8, 9, -1]
    """

    name: str
    size: int
    block: int
    padded: int
    parts: int = 1

    @classmethod
    def whole(cls, name: str, size: int) -> DimPlan:
        """Not split by any operand: one block of the whole extent."""
        return cls(name, size, max(size, 1), size, 1)

    @classmethod
    def slab(cls, name: str, size: int, parts: int) -> DimPlan:
        """Split in ``parts`` contiguous parts (Slab, BlockNonCyclic), padded to equal blocks."""
        block = max(1, -(-size // parts))
        return cls(name, size, block, block * parts, parts)

    @classmethod
    def cyclic(cls, name: str, size: int, block: int) -> DimPlan:
        """Dealt block-cyclically: numroc handles any extent, nothing is padded."""
        return cls(name, size, block, size, 1)

    @property
    def padding(self) -> bool:
        return self.padded != self.size

    def positions(self) -> np.ndarray:
        """Padded position of each real index."""
        if not self.padding:
            return np.arange(self.size)
        out = []
        for j in range(self.parts):
            start, length = slab_extent(self.size, self.parts, j)
            out.append(j * self.block + np.arange(length))
        return np.concatenate(out)

    def real_of_padded(self) -> np.ndarray:
        """Real index at each padded position, -1 at padding."""
        out = np.full(self.padded, -1, dtype=np.int64)
        out[self.positions()] = np.arange(self.size)
        return out

    def describe(self) -> str:
        sizes = [slab_extent(self.size, self.parts, j)[1] for j in range(self.parts)]
        return (
            f"{self.name} {self.size}->{self.padded}: split as {sizes} over {self.parts} ranks; nvmath's "
            f"BlockCyclic needs equal blocks of {self.block}, so each part is zero-padded to {self.block} "
            "and the padding is stripped from the result"
        )


# --------------------------------------------------------------------------- #
# nvmath distributions as data
# --------------------------------------------------------------------------- #
@dataclasses.dataclass(frozen=True)
class NvDistribution:
    """``BlockCyclic(ProcessGrid(shape=grid_shape, layout=...), block_sizes,
    first_process=...)`` of nvmath, as data (nvmath's own classes need an
    initialized runtime even for shape arithmetic).

    Every distribution nvmath's matmul accepts is converted to this form
    inside nvmath; dmatmul builds it directly with the block sizes chosen per
    dimension (:class:`DimPlan`).

    >>> d = NvDistribution((2, 3), "ROW_MAJOR", (4, 5), (1, 0))
    >>> d.transposed()
    NvDistribution(grid_shape=(3, 2), grid_layout='COL_MAJOR', block_sizes=(5, 4), first_process=(0, 1))
    >>> d.as_dmatmul()
    BlockCyclic(ProcessGrid((2, 3), layout='row'), (4, 5), first_process=(1, 0))
    """

    grid_shape: tuple[int, int]
    grid_layout: Literal["ROW_MAJOR", "COL_MAJOR"]
    block_sizes: tuple[int, int]
    first_process: tuple[int, int] = (0, 0)

    def __post_init__(self) -> None:
        if 1 in self.grid_shape:  # the layout does not matter on a 1-D grid: keep one value
            object.__setattr__(self, "grid_layout", "ROW_MAJOR")

    @property
    def nranks(self) -> int:
        return self.grid_shape[0] * self.grid_shape[1]

    @property
    def is_1d(self) -> bool:
        return 1 in self.grid_shape

    def transposed(self) -> NvDistribution:
        """The distribution of ``X.T`` when this is that of ``X``."""
        flip = {"ROW_MAJOR": "COL_MAJOR", "COL_MAJOR": "ROW_MAJOR"}[self.grid_layout]
        return NvDistribution(
            (self.grid_shape[1], self.grid_shape[0]),
            flip,  # type: ignore[arg-type]
            (self.block_sizes[1], self.block_sizes[0]),
            (self.first_process[1], self.first_process[0]),
        )

    def as_dmatmul(self) -> BlockCyclic:
        """The same layout as a dmatmul :class:`~dmatmul.BlockCyclic` (numroc per dimension)."""
        layout = "row" if self.grid_layout == "ROW_MAJOR" else "col"
        return BlockCyclic(ProcessGrid(self.grid_shape, layout=layout), self.block_sizes, self.first_process)

    def describe(self) -> str:
        fp = "" if self.first_process == (0, 0) else f", first_process={self.first_process}"
        return (
            f"BlockCyclic(ProcessGrid(shape={self.grid_shape}, layout={self.grid_layout}), "
            f"block_sizes={self.block_sizes}{fp})"
        )


@dataclasses.dataclass(frozen=True)
class Handover:
    """How one user operand becomes one nvmath operand.

    ``target`` is what the rank hands over, as a dmatmul distribution of the
    *real* stored matrix (the user's own distribution, or the split a
    Replicated operand is cut to). ``distribution``/``global_shape`` are the
    nvmath side: the orientation nvmath sees (transposed when ``transposed``)
    and the padded extents. ``distribution`` is None for the cuBLASLt engine
    (a local GEMM per rank, nothing distributed).
    """

    operand: str
    slot: str
    transposed: bool
    is_transpose: bool
    source: Distribution
    target: Distribution
    distribution: NvDistribution | None
    global_shape: tuple[int, int]
    dims: tuple[str, str]
    copy: str | None = None

    @property
    def nv_dims(self) -> tuple[str, str]:
        """Logical dimensions of the rows/cols nvmath sees."""
        return (self.dims[1], self.dims[0]) if self.transposed else self.dims

    def target_padded(self) -> NvDistribution | None:
        """The nvmath distribution in the user's orientation (over the padded extents)."""
        if self.distribution is None:
            return None
        return self.distribution.transposed() if self.transposed else self.distribution

    def describe(self) -> str:
        how = "its transposed view (C-order block = Fortran-order block of the transpose)" if self.transposed else "as it is"
        copy = f"copied: {self.copy}" if self.copy else "no copy"
        dist = "" if self.distribution is None else f", {self.distribution.describe()} over {self.global_shape}"
        return f"{self.operand} -> nvmath {self.slot}: {how}, {copy}, is_transpose={self.is_transpose}{dist}"


@dataclasses.dataclass(frozen=True)
class Cost:
    """Modelled communication and compute per rank (alpha-beta-gamma)."""

    nbytes: float
    messages: float
    flops: float
    time: float


@dataclasses.dataclass(frozen=True)
class Translation:
    """The nvmath call for one product, and what dmatmul does around it."""

    problem: Problem
    algorithm: str
    path: Path
    engine: Literal["cublasmp", "cublaslt"]
    swapped: bool
    roles: tuple[Role | None, Role | None, Role | None]
    kernel: tuple[Role, Role, Role] | None
    dims: tuple[DimPlan, DimPlan, DimPlan]
    handovers: tuple[Handover, ...]
    result: NvDistribution | None
    result_shape: tuple[int, int]
    computed: Distribution
    qualifiers: tuple[bool, bool, bool]
    fused_epilog: str | None
    post_epilog: str | None
    post_beta_c: bool
    gather: bool
    options: tuple[tuple[str, Any], ...] = (("inplace", False),)
    notes: tuple[str, ...] = ()
    cost: Cost | None = None

    # -- lookups ------------------------------------------------------------
    def dim(self, name: str) -> DimPlan:
        return {d.name: d for d in self.dims}[name]

    def handover(self, operand: str) -> Handover:
        """The handover of user operand "a", "b" or "c"."""
        for h in self.handovers:
            if h.operand == operand:
                return h
        raise KeyError(f"{operand} is not handed to nvmath in this plan")

    def slot(self, slot: str) -> Handover | None:
        """The handover that fills nvmath slot "A", "B" or "C" (None: no C)."""
        for h in self.handovers:
            if h.slot == slot:
                return h
        return None

    @property
    def passes_c(self) -> bool:
        return self.slot("C") is not None

    @property
    def copies(self) -> tuple[str, ...]:
        """The operands copied before the call."""
        return tuple(h.operand for h in self.handovers if h.copy)

    @property
    def padded(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.dims if d.padding)

    def result_padded_user(self) -> NvDistribution | None:
        """The nvmath result distribution in the user's orientation (D, not D.T)."""
        if self.result is None:
            return None
        return self.result.transposed() if self.swapped else self.result

    def unfused(self) -> Translation:
        """The same call with the epilog applied by dmatmul instead of cuBLASMp
        (used when the installed nvmath refuses a fused epilog)."""
        if self.fused_epilog in (None, "ALLREDUCE"):
            return self
        return dataclasses.replace(
            self,
            fused_epilog=None,
            post_epilog=self.problem.epilog,
            notes=self.notes + (f"nvmath refused the fused {self.fused_epilog} epilog: dmatmul applies it",),
        )

    # -- reporting ----------------------------------------------------------
    def describe(self) -> list[str]:
        """explain() lines (without the header the front end writes)."""
        p = self.problem
        names = {"M": "M", "K": "K", "N": "N", "R": "nothing (replicated)", None: "a 2-D grid"}
        lines = []
        if self.engine == "cublaslt":
            lines.append(
                f"engine:     cuBLASLt via nvmath.linalg.advanced on each of {p.nranks} ranks (no communication)"
            )
        else:
            lines.append(
                f"engine:     cuBLASMp via nvmath.distributed.linalg.advanced.Matmul on {p.nranks} rank(s), one GPU each"
            )
        what = {
            "AG+GEMM": "AllGather+GEMM (cuBLASMp fast path: 1-D, non-cyclic, uniform, first_process (0, 0))",
            "GEMM+RS": "GEMM+ReduceScatter (cuBLASMp fast path: 1-D, non-cyclic, uniform, first_process (0, 0))",
            "GEMM+AR": "GEMM+AllReduce (cuBLASMp fast path through epilog=ALLREDUCE, TN layout)",
            "SUMMA": "SUMMA (a, b and the result on one shared 2-D block-cyclic grid)",
            "local GEMM": "local GEMM (no communication)",
            "general": f"cuBLASMp general path (no fast path fits; closest contract algorithm: {self.algorithm})",
        }[self.path]
        lines.append(f"path:       {what}")
        lines.append("distributions:")
        for (op, name), role, d in zip((("a", "a"), ("b", "b"), ("d", "result")), self.roles, p.distributions):
            lines.append(f"  {name:7s} {d!r:16s} splits {names[role]}")
        if self.kernel is not None and self.kernel != self.roles:
            ka, kb, kd = self.kernel
            lines.append(f"handed as:  roles a:{ka} b:{kb} result:{kd} (Replicated operands are cut locally, no communication)")
        frame = "D.T = op(B).T @ op(A).T (nvmath A is b, B is a; result D.T in Fortran order = D in C order)" if self.swapped \
            else "D = op(A) @ op(B) (result in Fortran order)"
        lines.append(f"frame:      {frame}")
        for h in self.handovers:
            lines.append(f"  {h.describe()}")
        if self.result is not None:
            lines.append(f"  result: {self.result.describe()} over {self.result_shape}")
        q = self.qualifiers
        lines.append(f"qualifiers: is_transpose A={q[0]}, B={q[1]}, C={q[2]}")
        for d in self.dims:
            if d.padding:
                lines.append(f"padding:    {d.describe()}")
        if self.passes_c:
            lines.append("c:          passed with MatmulOptions(inplace=False): the user's c is never written")
        if self.fused_epilog:
            lines.append(f"epilog:     fused into cuBLASMp: MatmulEpilog.{self.fused_epilog}")
        if self.post_beta_c or self.post_epilog:
            post = ", ".join(x for x in ("beta * c" if self.post_beta_c else "", self.post_epilog or "") if x)
            lines.append(f"epilogue:   applied by dmatmul on the local result block: {post}")
        if self.gather:
            lines.append(
                f"result:     computed as {self.computed!r}, then allgathered by dmatmul over MPI (host-staged)"
            )
        for note in self.notes:
            lines.append(f"note:       {note}")
        if self.cost is not None:
            lb = _cost.lower_bound_words(p.m, p.n, p.k, p.nranks) * p.itemsize
            ratio = f"{self.cost.nbytes / lb:.2f}x the bound" if lb > 0 else "bound is 0"
            lines.append(
                f"modelled:   {_plan._fmt_bytes(self.cost.nbytes)} received per rank in {self.cost.messages:.0f} "
                f"messages, {self.cost.flops / 1e9:.3g} GFLOP per rank ({ratio}: "
                f"lower bound {_plan._fmt_bytes(lb)} per rank)"
            )
        lines.append("log:        CUBLASMP_LOG_LEVEL=5 makes cuBLASMp log the path it runs")
        return lines


# --------------------------------------------------------------------------- #
# the kernels cuBLASMp runs, by dmatmul roles
# --------------------------------------------------------------------------- #
@dataclasses.dataclass(frozen=True)
class NvKernel:
    """A cuBLASMp (or cuBLASLt) path on fixed operand roles.

    ``frames``: the frames in which nvmath sees this triple as its fast path
    (False: ``D = op(A) op(B)``, True: ``D.T = op(B).T op(A).T``).
    """

    algorithm: str
    path: Path
    a: Role
    b: Role
    d: Role
    frames: tuple[bool, ...]
    moving: str | None = None

    @property
    def roles(self) -> tuple[Role, Role, Role]:
        return (self.a, self.b, self.d)

    def contract_kernel(self) -> _plan.Kernel:
        return _plan.Kernel(self.algorithm, self.a, self.b, self.d, moving=self.moving)  # type: ignore[arg-type]


#: The 1-D paths on several ranks. AllGather+GEMM in nvmath's frame is
#: (op(A): M, op(B): N, D: M); in the swapped frame that is dmatmul's
#: (a: M, b: N, d: N), with ``a`` travelling. Likewise for ReduceScatter.
NV_KERNELS: tuple[NvKernel, ...] = (
    NvKernel("local", "local GEMM", "M", "R", "M", (False,)),
    NvKernel("local", "local GEMM", "R", "N", "N", (False,)),
    NvKernel("local", "local GEMM", "R", "R", "R", (False,)),
    NvKernel("allgather", "AG+GEMM", "M", "N", "M", (False,), moving="b"),
    NvKernel("allgather", "AG+GEMM", "M", "N", "N", (True,), moving="a"),
    NvKernel("reduce_scatter", "GEMM+RS", "K", "K", "N", (False,)),
    NvKernel("reduce_scatter", "GEMM+RS", "K", "K", "M", (True,)),
    NvKernel("allreduce", "GEMM+AR", "K", "K", "R", (False, True)),
)


def needs(algorithm: str, transposes: tuple[bool, bool]) -> list[str]:
    """The distribution triples (a, b, result) a named algorithm accepts on
    several ranks with the nvmath backend.

    >>> needs("allgather", (False, False))
    ['(a=Slab.X, b=Slab.Y, result=Slab.X)', '(a=Slab.X, b=Slab.Y, result=Slab.Y)']
    """
    ta, tb = transposes
    return [
        f"(a={_plan.dist_for_role('a', k.a, ta)}, b={_plan.dist_for_role('b', k.b, tb)}, "
        f"result={_plan.dist_for_role('d', k.d, False)})"
        for k in NV_KERNELS
        if k.algorithm == algorithm
    ]


def _given(p: Problem) -> str:
    a, b, d = p.distributions
    return f"(a={a!r}, b={b!r}, result={d!r})"


def _needs_message(p: Problem) -> str:
    ta, tb = p.transposes
    options = needs(p.algorithm, p.transposes)
    if not options:
        return (
            f"algorithm={p.algorithm!r} does not apply to 1-D distributions on the nvmath backend; given "
            f"{_given(p)}: it needs a, b and the result on one shared 2-D ProcessGrid (BlockCyclic or "
            "BlockNonCyclic); or use algorithm='auto'"
        )
    return (
        f"algorithm={p.algorithm!r} does not fit the distributions {_given(p)} (transpose_a={ta}, "
        f"transpose_b={tb}) on the nvmath backend: cuBLASMp runs it for one of: {', '.join(options)} "
        "(Replicated() also fits wherever a Slab is needed for a or b); or use algorithm='auto'"
    )


# --------------------------------------------------------------------------- #
# orienting one operand: the decision table
# --------------------------------------------------------------------------- #
AxisOp = Literal["keep", "slice", "pad", "gather"]


def _view_order(order: Order, ops: tuple[AxisOp, AxisOp]) -> Order | None:
    """The memory order after taking the handed-over part as a view (None: not
    a view, a copy is needed)."""
    if "pad" in ops or "gather" in ops:
        return None
    if order in ("CF", "X"):
        return order
    sliced = [i for i, op in enumerate(ops) if op == "slice"]
    if not sliced:
        return order
    if sliced == [0]:
        return "C" if order == "C" else "X"  # a range of rows of a C-order block stays C-order
    if sliced == [1]:
        return "F" if order == "F" else "X"
    return "X"


def _orient(
    operand: str,
    order: Order,
    ops: tuple[AxisOp, AxisOp],
    *,
    base: bool,
    need: bool | None,
    force: bool | None,
    why_ops: str | None,
    why_need: str,
    prefer: bool | None = None,
) -> tuple[bool, bool, str | None]:
    """Choose how a block is handed over: ``(transposed, is_transpose, copy reason)``.

    ``base`` is the qualifier when handed as it is (as_is); handing the
    transposed view flips it. ``need`` fixes the qualifier (GEMM+AllReduce's
    TN), ``force`` fixes the orientation (``c``, which cannot be flagged);
    ``prefer`` breaks ties (2-D grids: the orientation that keeps one shared
    grid in nvmath's frame).

    ========================  =====================  ======================
    block (after cutting)      handed over            copy
    ========================  =====================  ======================
    F-contiguous               as it is               none
    C-contiguous               transposed view        none
    both (a vector)            as it is               none
    neither                    as it is (F copy)      "not contiguous"
    padded / gathered          per memory order       padding / gather
    qualifier or frame fixed   as required            when the order differs
    ========================  =====================  ======================
    """
    view = _view_order(order, ops)
    free = {False: view in ("F", "CF"), True: view in ("C", "CF")}
    if force is not None:
        transposed = force
    elif need is not None:
        transposed = base != need  # the orientation whose qualifier is `need`
    elif free[False] and free[True]:
        transposed = bool(prefer)
    elif free[False]:
        transposed = False
    elif free[True]:
        transposed = True
    elif prefer is not None:
        transposed = prefer
    else:
        transposed = order == "C"  # copy into the block's own order, hand the matching view
    copy = None
    if not free[transposed]:
        if view is None:
            copy = why_ops
        elif view == "X":
            copy = f"{operand} is neither C- nor Fortran-contiguous" + (
                "" if order == "X" else " after cutting its part"
            )
        else:
            copy = why_need
    return transposed, base ^ transposed, copy


# --------------------------------------------------------------------------- #
# translation
# --------------------------------------------------------------------------- #
def _check_fit(p: Problem) -> None:
    for name, d in zip(("a", "b", "result"), p.distributions):
        try:
            d.nranks(p.nranks)
        except DistributionError as e:
            raise DistributionError(
                f"distribution of {name}: {d!r} does not fit the {p.nranks} rank(s) of this run: {e}"
                + (
                    "; the nvmath backend runs one rank per process (one GPU each): launch "
                    f"with mpiexec -n {d.grid.size}" if d.grid is not None and p.nranks == 1 else ""
                )
            ) from None


def translate(problem: Problem) -> Translation:
    """The nvmath call for ``problem``; raises ValueError when a named algorithm
    does not fit, NotImplementedError for 2-D layouts nvmath cannot take."""
    _check_fit(problem)
    if problem.nranks == 1:
        return _one_rank(problem)
    p = problem
    roles = tuple(
        _plan.role_of(d, op, t, p.nranks)  # type: ignore[arg-type]
        for d, op, t in zip(p.distributions, ("a", "b", "d"), (p.transpose_a, p.transpose_b, False))
    )
    if None not in roles:
        return _one_d(p, roles)  # type: ignore[arg-type]
    return _two_d(p, roles)


def _problem1d(p: Problem) -> _plan.Problem1D:
    return _plan.Problem1D(p.m, p.n, p.k, p.nranks, p.itemsize, p.acc_itemsize)


_MODEL = _cost.model_for("gpu")
#: dmatmul's own allgather of a replicated result crosses PCIe twice besides the network
_HOST_STAGING = 3.0


def _cost_of(p: Problem, kernel: NvKernel | None, gather_from: Role | None, roles: dict[str, Role]) -> Cost:
    pr = _problem1d(p)
    if kernel is None:  # general path: modelled as the closest communicating contract plan
        plans = _plan.plans(pr, roles, _MODEL)
        plan = next((pl for pl in plans if pl.algorithm != "local"), plans[0])
        return Cost(plan.nbytes, plan.messages, plan.flops, plan.time)
    nbytes, messages, flops = _plan.kernel_cost(pr, kernel.contract_kernel())
    if gather_from is not None:  # dmatmul's allgather is host-staged: device->host, MPI, host->device
        mv = _plan.move(pr, "d", gather_from, "R")
        nbytes, messages = nbytes + _HOST_STAGING * mv.nbytes, messages + mv.messages
    return Cost(nbytes, messages, flops, _MODEL.time(messages=messages, nbytes=nbytes, flops=flops))


def refused_epilog(p: Problem) -> str | None:
    """Why cuBLASMp/cuBLASLt cannot be given ``p``'s epilog fused (None: it can).

    Known from the hardware runs (issue 13), so planned around, never tried:
    a bias epilog on complex types is refused by cuBLASMp with NOT_SUPPORTED
    at *execute* (too late for a plan-time fallback), and cuBLASLt's fused
    GELU is not float64-accurate.

    >>> p = Problem(4, 4, 4, 1, False, False, (Replicated(),) * 3, ("C", "C", None))
    >>> refused_epilog(dataclasses.replace(p, dtype="complex64", epilog="relu_bias"))
    'cuBLASMp refuses a bias epilog on complex64 (NOT_SUPPORTED at execute)'
    >>> refused_epilog(dataclasses.replace(p, dtype="float64", epilog="gelu"))
    "cuBLASLt's fused GELU is not float64-accurate"
    >>> refused_epilog(dataclasses.replace(p, dtype="float32", epilog="gelu_bias")) is None
    True
    """
    ep = p.epilog
    if ep is None:
        return None
    if p.dtype.startswith("complex") and has_bias(ep):
        return f"cuBLASMp refuses a bias epilog on {p.dtype} (NOT_SUPPORTED at execute)"
    if p.dtype == "float64" and activation(ep) == "gelu":
        return "cuBLASLt's fused GELU is not float64-accurate"
    return None


def _epilogs(p: Problem, path: Path, swapped: bool, engine: str) -> tuple[str | None, str | None, bool]:
    """(fused cuBLASMp epilog, epilog dmatmul applies after, beta*c after)."""
    ep = p.epilog
    if path == "GEMM+AR":
        return "ALLREDUCE", ep, p.use_c  # the epilog slot holds ALLREDUCE; C would be summed P times
    if ep is None:
        return None, None, False
    if refused_epilog(p) is not None:
        return None, ep, False  # known refused (or wrong) when fused: dmatmul's epilogue from the start
    if engine == "cublaslt":
        return _EPILOG_NAMES[ep], None, False
    if path in ("AG+GEMM", "GEMM+RS", "local GEMM"):
        if has_bias(ep) and swapped:
            return None, ep, False  # a bias per row of D is per column of D.T: not an epilog of nvmath's product
        return _EPILOG_NAMES[ep], None, False
    return None, ep, False  # general and SUMMA paths: nvmath 1.0 refuses RELU on its naive path


def _nv_1d(p: Problem, operand: str, role: Role, dims: dict[str, DimPlan], grid_size: int) -> NvDistribution:
    """The nvmath distribution (user orientation) of a 1-D role."""
    r, c = p.stored(operand)
    blocks = (dims[r].block, dims[c].block)
    if grid_size == 1:
        return NvDistribution((1, 1), "ROW_MAJOR", blocks)
    if role == "R":  # only GEMM+AllReduce's result: Slab.X of a (P*M, N) matrix, one whole copy per rank
        return NvDistribution((grid_size, 1), "ROW_MAJOR", blocks)
    axis = (r, c).index(role)
    grid = (grid_size, 1) if axis == 0 else (1, grid_size)
    return NvDistribution(grid, "ROW_MAJOR", blocks)


def _role_dist(p: Problem, operand: str, role: Role) -> Distribution:
    if role == "R":
        return Replicated()
    return Slab(p.stored(operand).index(role))


def _axis_ops_1d(p: Problem, operand: str, given: Role, role: Role, dims: dict[str, DimPlan]) -> tuple[AxisOp, AxisOp]:
    ops: list[AxisOp] = []
    for dim in p.stored(operand):
        if dims[dim].padding:
            ops.append("pad")
        elif given == role or dim != role:
            ops.append("keep")
        else:  # a Replicated operand cut to a Slab: a contiguous range
            ops.append("slice")
    return ops[0], ops[1]  # type: ignore[return-value]


def _why_ops(operand: str, ops: tuple[AxisOp, AxisOp], dims_of: tuple[str, str], dims: dict[str, DimPlan],
             target: Distribution) -> str | None:
    if "pad" in ops:
        padded = [d for d, op in zip(dims_of, ops) if op == "pad"]
        return "padding " + ", ".join(
            f"{d} {dims[d].size}->{dims[d].padded} (uneven split over {dims[d].parts} ranks)"
            if dims[d].parts > 1 else f"{d} {dims[d].size}->{dims[d].padded}" for d in padded
        )
    if "gather" in ops:
        return f"cutting the replicated {operand} to {target!r} (not a contiguous range)"
    return None


@dataclasses.dataclass(frozen=True)
class _Frame:
    swapped: bool
    handovers: tuple[Handover, ...]
    weight: float


def _build_frame(
    p: Problem,
    swapped: bool,
    *,
    targets: dict[str, Distribution],
    nv_user: dict[str, NvDistribution | None],
    ops: dict[str, tuple[AxisOp, AxisOp]],
    dims: dict[str, DimPlan],
    need_tn: bool,
    pass_c: bool,
    engine: str,
    weights: dict[str, float],
    prefer: bool | None = None,
) -> _Frame:
    """Handovers of a, b (and c) in one frame."""
    ta, tb = p.transposes
    out = []
    weight = 0.0
    for operand in ("a", "b", "c"):
        if operand == "c" and not pass_c:
            continue
        order = p.orders[{"a": 0, "b": 1, "c": 2}[operand]] or "C"
        source = p.distributions[{"a": 0, "b": 1, "c": 2}[operand]]
        stored = p.stored(operand)
        if engine == "cublaslt":
            view = _view_order(order, ops[operand])
            copy = None if view in ("C", "F", "CF") else (
                _why_ops(operand, ops[operand], stored, dims, targets[operand])
                or f"{operand} is neither C- nor Fortran-contiguous"
            )
            t = {"a": ta, "b": tb, "c": False}[operand]
            out.append(Handover(operand, operand.upper(), False, t, source, targets[operand], None,
                                p.global_shape(operand), stored, copy))
            weight += weights[operand] if copy else 0.0
            continue
        if operand == "a":
            slot, base = ("B", not ta) if swapped else ("A", ta)
        elif operand == "b":
            slot, base = ("A", not tb) if swapped else ("B", tb)
        else:
            slot, base = "C", False
        need = None
        if need_tn and operand != "c":
            need = slot == "A"  # GEMM+AllReduce runs TN: A transposed, B not
        force = swapped if operand == "c" else None
        why_need = (
            f"c must be handed to nvmath in {'C' if swapped else 'Fortran'} order for the "
            f"{'D.T = op(B).T op(A).T' if swapped else 'D = op(A) op(B)'} frame (nvmath cannot flag C transposed)"
            if operand == "c" else
            f"GEMM+AllReduce runs only TN (is_transpose A=True, B=False): {operand} must be copied to the "
            "other memory order"
        )
        transposed, qual, copy = _orient(
            operand, order, ops[operand], base=base, need=need, force=force,
            why_ops=_why_ops(operand, ops[operand], stored, dims, targets[operand]), why_need=why_need,
            prefer=prefer,
        )
        nvu = nv_user[operand]
        assert nvu is not None
        nvd = nvu.transposed() if transposed else nvu
        shape = (dims[stored[0]].padded, dims[stored[1]].padded)
        if transposed:
            shape = (shape[1], shape[0])
        out.append(Handover(operand, slot, transposed, qual if operand != "c" else False, source,
                            targets[operand], nvd, shape, stored, copy))
        weight += weights[operand] if copy else 0.0
    return _Frame(swapped, tuple(out), weight)


def _weights(p: Problem, split: dict[str, bool]) -> dict[str, float]:
    out = {}
    for operand in ("a", "b", "c"):
        r, c = p.global_shape(operand)
        out[operand] = r * c / (p.nranks if split.get(operand, False) else 1)
    return out


def _pick(frames: list[_Frame], p: Problem, path: Path, engine: str) -> _Frame:
    def key(f: _Frame) -> tuple[float, int, int]:
        fused, post, _ = _epilogs(p, path, f.swapped, engine)
        return (f.weight, 0 if post is None or p.epilog is None else 1, 0 if f.swapped else 1)

    return min(frames, key=key)


def _finish(
    p: Problem,
    *,
    algorithm: str,
    path: Path,
    engine: str,
    frame: _Frame,
    roles: tuple[Role | None, Role | None, Role | None],
    kernel: tuple[Role, Role, Role] | None,
    dims: dict[str, DimPlan],
    result: NvDistribution | None,
    result_shape: tuple[int, int],
    computed: Distribution,
    gather: bool,
    notes: tuple[str, ...],
    cost: Cost | None,
) -> Translation:
    fused, post, post_c = _epilogs(p, path, frame.swapped, engine)
    why = refused_epilog(p)
    if why is not None and post is not None:
        notes = notes + (f"epilog {p.epilog!r} not fused: {why}; dmatmul applies it after nvmath's call",)
    by_slot = {h.slot: h for h in frame.handovers}
    qualifiers = (by_slot["A"].is_transpose, by_slot["B"].is_transpose, False)
    return Translation(
        problem=p,
        algorithm=algorithm,
        path=path,
        engine=engine,  # type: ignore[arg-type]
        swapped=frame.swapped,
        roles=roles,
        kernel=kernel,
        dims=(dims["M"], dims["K"], dims["N"]),
        handovers=frame.handovers,
        result=result,
        result_shape=result_shape,
        computed=computed,
        qualifiers=qualifiers,
        fused_epilog=fused,
        post_epilog=post,
        post_beta_c=post_c,
        gather=gather,
        options=_options(p),
        notes=notes,
        cost=cost,
    )


def _options(p: Problem) -> tuple[tuple[str, Any], ...]:
    """nvmath's MatmulOptions: never in place (c is the user's); the compute type ``precision`` asks for."""
    ct = compute_type(p.dtype, p.precision)
    return (("inplace", False),) + ((("compute_type", ct),) if ct is not None else ())


def _result_nv(p: Problem, role: Role, dims: dict[str, DimPlan], swapped: bool) -> tuple[NvDistribution, tuple[int, int]]:
    nvu = _nv_1d(p, "d", role, dims, p.nranks)
    shape = (dims["M"].padded, dims["N"].padded)
    if swapped:
        return nvu.transposed(), (shape[1], shape[0])
    return nvu, shape


def _one_rank(p: Problem) -> Translation:
    """One rank: a local GEMM in cuBLASMp (every distribution holds everything)."""
    dims = {x: DimPlan.whole(x, p.size(x)) for x in "MKN"}
    targets = {"a": p.distributions[0], "b": p.distributions[1], "c": p.distributions[2]}
    nv_user = {op: _nv_1d(p, op, "R", dims, 1) for op in ("a", "b", "c")}
    ops = {op: ("keep", "keep") for op in ("a", "b", "c")}
    weights = _weights(p, {})
    frames = [
        _build_frame(p, s, targets=targets, nv_user=nv_user, ops=ops, dims=dims, need_tn=False,  # type: ignore[arg-type]
                     pass_c=p.use_c, engine="cublasmp", weights=weights)
        for s in (False, True)
    ]
    frame = _pick(frames, p, "local GEMM", "cublasmp")
    result, shape = _result_nv(p, "R", dims, frame.swapped)
    notes: tuple[str, ...] = ()
    if p.algorithm not in ("auto", "local"):
        notes = (f"algorithm={p.algorithm!r} requested: on one rank cuBLASMp runs a local GEMM",)
    flops = 2.0 * p.m * p.n * p.k
    return _finish(
        p, algorithm="local", path="local GEMM", engine="cublasmp", frame=frame, roles=("R", "R", "R"),
        kernel=("R", "R", "R"), dims=dims, result=result, result_shape=shape, computed=Replicated(),
        gather=False, notes=notes, cost=Cost(0.0, 0.0, flops, _MODEL.time(messages=0, nbytes=0, flops=flops)),
    )


def _candidate(
    p: Problem, kernel: NvKernel, given: tuple[Role, Role, Role], gather: bool
) -> Translation:
    """The translation of ``given`` roles run on ``kernel`` (Replicated cut to the kernel's roles)."""
    ka, kb, kd = kernel.roles
    engine = "cublaslt" if kernel.path == "local GEMM" else "cublasmp"
    split = {r for r in kernel.roles if r != "R"}
    if engine == "cublaslt":
        dims = {x: DimPlan.whole(x, p.size(x)) for x in "MKN"}
    else:
        dims = {x: DimPlan.slab(x, p.size(x), p.nranks) if x in split else DimPlan.whole(x, p.size(x)) for x in "MKN"}
    kroles = {"a": ka, "b": kb, "c": kd}
    groles = {"a": given[0], "b": given[1], "c": given[2] if not gather else "R"}
    targets = {op: _role_dist(p, op, kroles[op]) for op in ("a", "b", "c")}
    ar = kernel.path == "GEMM+AR"
    nv_user: dict[str, NvDistribution | None] = {}
    for op in ("a", "b", "c"):
        nv_user[op] = None if engine == "cublaslt" else _nv_1d(p, op, kroles[op], dims, p.nranks)
    ops = {op: _axis_ops_1d(p, op, groles[op], kroles[op], dims) for op in ("a", "b", "c")}
    weights = _weights(p, {op: kroles[op] != "R" for op in ("a", "b", "c")})
    pass_c = p.use_c and not ar
    frames = [
        _build_frame(p, s, targets=targets, nv_user=nv_user, ops=ops, dims=dims, need_tn=ar, pass_c=pass_c,
                     engine=engine, weights=weights)
        for s in kernel.frames
    ]
    frame = _pick(frames, p, kernel.path, engine)
    if engine == "cublaslt":
        result, shape = None, (p.m, p.n)
    elif ar:
        mm, nn = dims["M"].padded, dims["N"].padded
        if frame.swapped:
            mm, nn = nn, mm
        result, shape = NvDistribution((p.nranks, 1), "ROW_MAJOR", (mm, nn)), (p.nranks * mm, nn)
    else:
        result, shape = _result_nv(p, kd, dims, frame.swapped)
    roles_d = {"a": given[0], "b": given[1], "d": given[2]}
    return _finish(
        p, algorithm=kernel.algorithm, path=kernel.path, engine=engine, frame=frame, roles=given,
        kernel=kernel.roles, dims=dims, result=result, result_shape=shape, computed=_role_dist(p, "d", kd),
        gather=gather, notes=(), cost=_cost_of(p, kernel, kd if gather else None, roles_d),
    )


def _one_d(p: Problem, roles: tuple[Role, Role, Role]) -> Translation:
    ga, gb, gd = roles
    order = {name: i for i, name in enumerate(_plan.ALGORITHMS)}
    if p.algorithm == "summa":
        raise ValueError(_needs_message(p))
    best: tuple[tuple[float, float, int], Translation] | None = None
    for kernel in NV_KERNELS:
        if p.algorithm not in ("auto", kernel.algorithm):
            continue
        if not all(g == r or g == "R" for g, r in ((ga, kernel.a), (gb, kernel.b))):
            continue
        if gd == kernel.d:
            gather = False
        elif gd == "R" and p.algorithm == "auto":
            gather = True
        else:
            continue
        t = _candidate(p, kernel, roles, gather)
        assert t.cost is not None
        weight = sum(_weights(p, {})[h.operand] for h in t.handovers if h.copy)
        key = (t.cost.time, weight, order[kernel.algorithm])
        if best is None or key < best[0]:
            best = (key, t)
    if best is not None:
        return best[1]
    if p.algorithm != "auto":
        raise ValueError(_needs_message(p))
    return _general_1d(p, roles)


def _closest(p: Problem, roles: dict[str, Role]) -> str:
    """The contract name closest to a general-path triple: the kernel of the
    cheapest communicating plan dmatmul's cost model finds for these roles
    (a local kernel would need a redistribution first, which cuBLASMp does
    not do as such)."""
    plans = _plan.plans(_problem1d(p), roles, _MODEL)
    return next((pl.algorithm for pl in plans if pl.algorithm != "local"), plans[0].algorithm)


def _general_1d(p: Problem, roles: tuple[Role, Role, Role]) -> Translation:
    """No cuBLASMp fast path fits: hand the layout over as it is (cuBLASMp's
    general path); a Replicated result is computed split and allgathered."""
    ga, gb, gd = roles
    ka = "M" if ga == "R" else ga
    kb = "N" if gb == "R" else gb
    gather = gd == "R"
    kd: Role = ("M" if ka == "M" else "N") if gather else gd
    split = {r for r in (ka, kb, kd) if r != "R"}
    dims = {x: DimPlan.slab(x, p.size(x), p.nranks) if x in split else DimPlan.whole(x, p.size(x)) for x in "MKN"}
    kroles = {"a": ka, "b": kb, "c": kd}
    groles = {"a": ga, "b": gb, "c": "R" if gather else gd}
    targets = {op: _role_dist(p, op, kroles[op]) for op in ("a", "b", "c")}
    nv_user: dict[str, NvDistribution | None] = {op: _nv_1d(p, op, kroles[op], dims, p.nranks) for op in ("a", "b", "c")}
    ops = {op: _axis_ops_1d(p, op, groles[op], kroles[op], dims) for op in ("a", "b", "c")}
    weights = _weights(p, {op: True for op in ("a", "b", "c")})
    frames = [
        _build_frame(p, s, targets=targets, nv_user=nv_user, ops=ops, dims=dims, need_tn=False, pass_c=p.use_c,
                     engine="cublasmp", weights=weights)
        for s in (False, True)
    ]
    frame = _pick(frames, p, "general", "cublasmp")
    result, shape = _result_nv(p, kd, dims, frame.swapped)
    rd = {"a": ga, "b": gb, "d": gd}
    cost = _cost_of(p, None, None, rd)
    algorithm = _closest(p, rd)
    return _finish(
        p, algorithm=algorithm, path="general", engine="cublasmp", frame=frame, roles=roles,
        kernel=(ka, kb, kd), dims=dims, result=result, result_shape=shape, computed=_role_dist(p, "d", kd),
        gather=gather, notes=("no cuBLASMp fast path takes these roles: cuBLASMp's general path runs",),
        cost=cost,
    )


# --------------------------------------------------------------------------- #
# 2-D grids
# --------------------------------------------------------------------------- #
def _as_block_cyclic(p: Problem, operand: str, name: str, dist: Distribution) -> NvDistribution:
    """A non-replicated distribution as nvmath BlockCyclic data (user orientation, real extents)."""
    shape = p.global_shape(operand)
    stored = p.stored(operand)
    if isinstance(dist, BlockCyclic):
        layout = "ROW_MAJOR" if dist.grid.layout == "row" else "COL_MAJOR"
        return NvDistribution(dist.grid.shape, layout, dist.block_sizes, dist.first_process)  # type: ignore[arg-type]
    if isinstance(dist, BlockNonCyclic):
        grid, fp = dist.grid.shape, dist.first_process
        layout = "ROW_MAJOR" if dist.grid.layout == "row" else "COL_MAJOR"
    elif isinstance(dist, Slab):
        grid = (p.nranks, 1) if dist.dim == 0 else (1, p.nranks)
        fp, layout = (0, 0), "ROW_MAJOR"
    else:  # pragma: no cover - Replicated is handled by the caller
        raise TypeError(dist)
    blocks = []
    for axis in range(2):
        parts = grid[axis]
        if shape[axis] % parts != 0:
            raise NotImplementedError(
                f"distribution of {name}: {dist!r} splits {stored[axis]}={shape[axis]} unevenly over {parts} parts "
                "next to a 2-D grid; the nvmath backend pads uneven splits only when every distribution is 1-D "
                f"(Slab, Replicated): use BlockCyclic with an explicit block size, or a size divisible by {parts}"
            )
        blocks.append(shape[axis] // parts)
    return NvDistribution(grid, layout, (blocks[0], blocks[1]), fp)  # type: ignore[arg-type]


def _two_d(p: Problem, roles: tuple[Role | None, ...]) -> Translation:
    names = {"a": "a", "b": "b", "c": "result"}
    dists = {"a": p.distributions[0], "b": p.distributions[1], "c": p.distributions[2]}
    if p.algorithm not in ("auto", "summa"):
        raise ValueError(
            f"algorithm={p.algorithm!r} needs 1-D distributions (Slab.X, Slab.Y, Replicated(), or "
            f"BlockNonCyclic on a (P, 1)/(1, P) grid); given {_given(p)}: use algorithm='summa' or 'auto'"
        )
    nv: dict[str, NvDistribution | None] = {}
    blocks: dict[str, dict[str, int]] = {x: {} for x in "MKN"}
    for op in ("a", "b", "c"):
        d = dists[op]
        if isinstance(d, Replicated):
            nv[op] = None
            continue
        nvd = _as_block_cyclic(p, op, names[op], d)
        nv[op] = nvd
        for axis, dim in enumerate(p.stored(op)):
            blocks[dim][names[op]] = nvd.block_sizes[axis]
    for dim, per in blocks.items():
        if len(set(per.values())) > 1:
            raise NotImplementedError(
                f"block sizes of {dim} differ: " + ", ".join(f"{k} has {v}" for k, v in per.items())
                + "; cuBLASMp needs one block size per dimension in every operand: give the distributions "
                f"the same block size along {dim}"
            )
    ref = next(nv[op] for op in ("c", "a", "b") if nv[op] is not None)
    assert ref is not None
    dims: dict[str, DimPlan] = {}
    for dim in "MKN":
        if blocks[dim]:
            dims[dim] = DimPlan.cyclic(dim, p.size(dim), next(iter(blocks[dim].values())))
        else:
            dims[dim] = DimPlan.cyclic(dim, p.size(dim), max(1, -(-p.size(dim) // max(ref.grid_shape))))
    targets: dict[str, Distribution] = {}
    ops: dict[str, tuple[AxisOp, AxisOp]] = {}
    for op in ("a", "b", "c"):
        stored = p.stored(op)
        if nv[op] is None:  # Replicated: cut to the reference grid
            nv[op] = NvDistribution(ref.grid_shape, ref.grid_layout, (dims[stored[0]].block, dims[stored[1]].block))
            axis_ops = []
            for axis in range(2):
                parts = ref.grid_shape[axis]
                one_block = dims[stored[axis]].block * parts >= p.size(stored[axis])
                axis_ops.append("keep" if parts == 1 else "slice" if one_block else "gather")
            ops[op] = (axis_ops[0], axis_ops[1])  # type: ignore[assignment]
            targets[op] = nv[op].as_dmatmul()  # type: ignore[union-attr]
        else:
            ops[op] = ("keep", "keep")
            targets[op] = dists[op]
    gather = isinstance(dists["c"], Replicated)
    weights = _weights(p, {op: True for op in ("a", "b", "c")})
    nvd_user = nv["c"]
    assert nvd_user is not None

    def grid_path(frame: _Frame) -> tuple[bool, Path, list[str]]:
        result = nvd_user.transposed() if frame.swapped else nvd_user
        shape = (p.n, p.m) if frame.swapped else (p.m, p.n)
        grids = {(h.distribution.grid_shape, h.distribution.grid_layout)  # type: ignore[union-attr]
                 for h in frame.handovers if h.slot in ("A", "B")} | {(result.grid_shape, result.grid_layout)}
        shared = len(grids) == 1 and not result.is_1d
        if not shared:
            return False, "general", ["the operands do not share one 2-D grid: cuBLASMp's general path runs"]
        nprow, npcol = result.grid_shape
        if result.block_sizes[0] == shape[0] // nprow or result.block_sizes[1] == shape[1] // npcol:
            return True, "general", [
                "one shared 2-D grid, but the result's block size equals M/nprow or N/npcol, for which nvmath "
                "steers cuBLASMp away from SUMMA: expect its general path"
            ]
        return True, "SUMMA", []

    # the frame keeping one shared grid (SUMMA) wins over fewer copies; then fewer copies, then C-order result
    options = []
    for swap in (False, True):
        frame = _build_frame(p, swap, targets=targets, nv_user=nv, ops=ops, dims=dims, need_tn=False,
                             pass_c=p.use_c, engine="cublasmp", weights=weights, prefer=swap)
        shared, path, notes = grid_path(frame)
        options.append(((0 if path == "SUMMA" else 1, 0 if shared else 1, frame.weight, 0 if swap else 1),
                        frame, path, notes, shared))
    _, frame, path, notes, shared = min(options, key=lambda o: o[0])
    if p.algorithm == "summa" and not any(o[4] for o in options):
        raise ValueError(
            f"algorithm='summa' needs a, b and the result on one shared 2-D ProcessGrid (Replicated() also "
            f"fits); given {_given(p)}; or use algorithm='auto'"
        )
    result = nvd_user.transposed() if frame.swapped else nvd_user
    shape = (p.n, p.m) if frame.swapped else (p.m, p.n)
    if any(nvd.first_process != (0, 0) for nvd in nv.values() if nvd is not None):
        notes.append("first_process != (0, 0): nvmath 1.0 may accept it only on cuBLASMp's general/local paths")
    computed = dists["c"] if not gather else nvd_user.as_dmatmul()
    return _finish(
        p, algorithm="summa", path=path, engine="cublasmp", frame=frame, roles=tuple(roles),  # type: ignore[arg-type]
        kernel=None, dims=dims, result=result, result_shape=shape, computed=computed, gather=gather,
        notes=tuple(notes), cost=None,
    )

