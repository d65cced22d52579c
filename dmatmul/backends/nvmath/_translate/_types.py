"""The values a translation is made of: the inputs (:class:`Problem`), how
one logical dimension looks on the nvmath side (:class:`DimPlan`: block size
and zero padding), an nvmath ``BlockCyclic`` distribution as data
(:class:`NvDistribution`), how one user operand becomes one nvmath operand
(:class:`Handover`), the whole call (:class:`Translation`, costed as a
:class:`dmatmul._plan.Plan`), and which of the planner's kernels cuBLASMp runs
(:data:`KERNELS`; each one's cuBLASMp path and frames in :data:`PATHS`).
Plain frozen data, no rules: the rules that fill them live in the sibling
modules; :func:`describe` tells a translation in words (the ``explain()``
lines of an nvmath plan).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from .... import _cost, _layouts, _moves, _plan, _roles
from ...._dimmap import DimMap
from ...._distribution import BlockCyclic, Distribution, ProcessGrid, Replicated
from ...._epilogue import Epilog, has_bias
from ...._problem import Spec, Via

__all__ = [
    "Order", "Role", "Path", "MODEL", "PATHS", "KERNELS", "GRID", "LOCAL", "Problem", "DimPlan", "NvDistribution", "Handover",
    "Translation", "describe",
]

Order = Literal["C", "F", "CF", "X"]
Role = _plan.Role
Path = Literal["AG+GEMM", "GEMM+RS", "GEMM+AR", "SUMMA", "local GEMM", "general"]

#: the machine model nvmath's translations are costed with
MODEL = _cost.model_for("gpu")


def _kernel(algorithm: str, a: Role, b: Role, d: Role) -> _plan.Kernel:
    """The planner's kernel on these roles (cuBLASMp runs none the planner does not know)."""
    return next(k for k in _plan.KERNELS if (k.algorithm, k.a, k.b, k.d) == (algorithm, a, b, d))


#: The planner's kernels cuBLASMp runs on several ranks (the local ones through
#: cuBLASLt), with the cuBLASMp path and the frames in which nvmath sees the
#: triple as that path (False: ``D = op(A) op(B)``, True: ``D.T = op(B).T
#: op(A).T``). AllGather+GEMM in nvmath's frame is (op(A): M, op(B): N, D: M);
#: in the swapped frame that is dmatmul's (a: M, b: N, d: N), with ``a``
#: travelling. Likewise for ReduceScatter. Order breaks cost ties.
PATHS: dict[_plan.Kernel, tuple[Path, tuple[bool, ...]]] = {
    _kernel("local", "M", "R", "M"): ("local GEMM", (False,)),
    _kernel("local", "R", "N", "N"): ("local GEMM", (False,)),
    _kernel("local", "R", "R", "R"): ("local GEMM", (False,)),
    _kernel("allgather", "M", "N", "M"): ("AG+GEMM", (False,)),
    _kernel("allgather", "M", "N", "N"): ("AG+GEMM", (True,)),
    _kernel("reduce_scatter", "K", "K", "N"): ("GEMM+RS", (False,)),
    _kernel("reduce_scatter", "K", "K", "M"): ("GEMM+RS", (True,)),
    _kernel("allreduce", "K", "K", "R"): ("GEMM+AR", (False, True)),
}
KERNELS: tuple[_plan.Kernel, ...] = tuple(PATHS)
#: The grid kernel cuBLASMp runs on one 2-D process grid shared by a, b and
#: the result (its SUMMA); the translation of 2-D layouts (``_two_d``) runs it.
GRID: _plan.Kernel = _kernel("summa", "G", "G", "G")
#: The kernel of one rank, or of replicated operands: a local GEMM.
LOCAL: _plan.Kernel = _kernel("local", "R", "R", "R")


@dataclasses.dataclass(frozen=True)
class Problem:
    """What the translation needs: the product (the front end's
    :class:`dmatmul._problem.Spec`) placed on ``nranks`` ranks.

    ``distributions`` describe the *stored* ``a`` and ``b`` (as in the front
    end): the call's, or the planner's choice where it gave none
    (``chosen``). ``orders`` is ``(order of a, order of b, order of c or
    None)``, agreed on by all ranks (:func:`combine_orders`).
    """

    spec: Spec
    nranks: int
    distributions: tuple[Distribution, Distribution, Distribution]
    orders: tuple[Order, Order, Order | None]
    chosen: bool = False
    #: MXFP8 that cuBLASMp could take (block scales held, a GPU of compute capability 10.0+): frames giving
    #: its TN layout are preferred (:func:`._epilog.pick`)
    mxfp8: bool = False

    @classmethod
    def from_spec(cls, spec: Spec, nranks: int, orders: tuple[Order, Order, Order | None]) -> Problem:
        """The problem of a front-end Spec on ``nranks`` ranks; without
        distributions (one process) the planner chooses them among what
        cuBLASMp runs (on one rank: everything Replicated)."""
        if spec.distributions is not None:
            return cls(spec, nranks, spec.distributions, orders)
        dists = _layouts.choose_distributions(spec.sizes(nranks), MODEL, transposes=(spec.transpose_a, spec.transpose_b),
                                           kernels=KERNELS, algorithm=spec.algorithm)
        return cls(spec, nranks, tuple(dists), orders, chosen=True)  # type: ignore[arg-type]

    @classmethod
    def of(cls, m: int, n: int, k: int, nranks: int, transpose_a: bool, transpose_b: bool,
           distributions: tuple[Distribution, Distribution, Distribution], orders: tuple[Order, Order, Order | None],
           *, use_c: bool = False, dtype: str = "float32", bias_columns: bool = False, **options: Any) -> Problem:
        """The problem of an M x N x K product with :func:`dmatmul.matmul`'s
        keywords (for tools and tests); ``use_c``: c is read (beta 1 unless given)."""
        if use_c:
            options.setdefault("beta", 1.0)
        bias = (1, n) if bias_columns else ((m,) if has_bias(options.get("epilog")) else None)
        spec = Spec.of((k, m) if transpose_a else (m, k), (n, k) if transpose_b else (k, n), dtype, c=use_c,
                       bias_shape=bias, transpose_a=transpose_a, transpose_b=transpose_b, **options)
        return cls(spec, nranks, distributions, orders)

    def with_options(self, **changes: Any) -> Problem:
        """This problem with some of the call's keywords changed."""
        return dataclasses.replace(self, spec=dataclasses.replace(
            self.spec, options=dataclasses.replace(self.spec.options, **changes)))

    m = Via[int]("spec")
    n = Via[int]("spec")
    k = Via[int]("spec")
    transpose_a = Via[bool]("spec")
    transpose_b = Via[bool]("spec")
    dtype = Via[str]("spec")
    alpha = Via[complex]("spec")
    beta = Via[complex]("spec")
    use_c = Via[bool]("spec")
    epilog = Via[Epilog | None]("spec")
    bias_columns = Via[bool]("spec")
    algorithm = Via[str]("spec")
    precision = Via[str | None]("spec")

    @property
    def transposes(self) -> tuple[bool, bool]:
        return (self.transpose_a, self.transpose_b)

    def size(self, dim: str) -> int:
        return {"M": self.m, "K": self.k, "N": self.n}[dim]

    def transposed(self, operand: str) -> bool:
        """Whether ``operand`` ("a", "b", "c" or "d") is stored transposed."""
        return {"a": self.transpose_a, "b": self.transpose_b, "c": False, "d": False}[operand]

    def stored(self, operand: str) -> tuple[str, str]:
        """Logical dimensions of the stored operand's (rows, cols)."""
        return _roles.stored_dims("d" if operand == "c" else operand, self.transposed(operand))  # type: ignore[arg-type]

    def role_dist(self, operand: str, role: Role) -> Distribution:
        """The planner's 1-D distribution of the stored ``operand`` in ``role``."""
        return _roles.role_dist("d" if operand == "c" else operand, role, self.transposed(operand))  # type: ignore[arg-type]

    def global_shape(self, operand: str) -> tuple[int, int]:
        r, c = self.stored(operand)
        return (self.size(r), self.size(c))

    @property
    def itemsize(self) -> int:
        return self.spec.dtype_info.itemsize

    def sizes(self) -> _plan.Problem1D:
        """The sizes the planner costs."""
        return self.spec.sizes(self.nranks)

    def given(self) -> str:
        """The given distributions, as an error message names them."""
        a, b, d = self.distributions
        return f"(a={a!r}, b={b!r}, result={d!r})"


@dataclasses.dataclass(frozen=True)
class DimPlan(DimMap):
    """How one logical dimension (M, K or N) looks on the nvmath side: the
    shared padded split (:class:`dmatmul._dimmap.DimMap`; an uneven Slab over
    ``nparts`` ranks is zero-padded to ``padded_size``, the extent nvmath
    sees) plus what only nvmath needs.

    It derives from the shared map rather than being it because nvmath's
    block size is a second value: ``nv_block``, the block every operand's
    ``BlockCyclic`` uses for this dimension (cuBLASMp requires it equal across
    operands). For a Slab split it is the map's ``block``; but nvmath deals a
    block-cyclic layout itself, so such a dimension is handed over
    unpermuted -- its map is the identity (``DimMap.whole``), while
    ``nv_block`` is the layout's own block (the JAX backend instead permutes
    it into a block layout: ``DimMap.of_parts``). An empty unsplit dimension
    still gets a block of 1. ``name`` labels the dimension in messages.

    >>> d = DimPlan.of("M", DimMap.slab(10, 4))
    >>> d.nv_block, d.padded_size, d.positions.tolist()
    (3, 12, [0, 1, 2, 3, 4, 5, 6, 7, 9, 10])
    >>> d.sources.tolist()
    [0, 1, 2, 3, 4, 5, 6, 7, -1, 8, 9, -1]
    >>> DimPlan.of("K", DimMap.whole(10), nv_block=4).padding  # block-cyclic: nvmath deals it, nothing padded
    False
    """

    name: str = ""
    nv_block: int = 1

    @classmethod
    def of(cls, name: str, dim: DimMap, nv_block: int | None = None) -> DimPlan:
        """Dimension ``name`` split as ``dim``; nvmath's block is the map's (at least 1) unless given."""
        return cls(dim.size, dim.parts, dim.block, name, max(1, dim.block) if nv_block is None else nv_block)

    @property
    def padding(self) -> bool:
        """Whether the split is padded (an uneven Slab)."""
        return self.padded_size != self.size

    def describe(self) -> str:
        sizes = [len(part) for part in self.parts]
        return (
            f"{self.name} {self.size}->{self.padded_size}: split as {sizes} over {self.nparts} ranks; nvmath's "
            f"BlockCyclic needs equal blocks of {self.nv_block}, so each part is zero-padded to {self.nv_block} "
            "and the padding is stripped from the result"
        )


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
        layout: Literal["row", "col"] = "row" if self.grid_layout == "ROW_MAJOR" else "col"
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
    cost: _plan.Plan | None = None  # the modelled call (2-D grids: SUMMA on the result's grid)

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
        """explain() lines (without the header the front end writes): :func:`describe`."""
        return describe(self)


def describe(t: Translation) -> list[str]:
    """explain() lines (without the header the front end writes).

    >>> from dmatmul import Replicated, Slab
    >>> from dmatmul.backends.nvmath._translate import Problem, translate
    >>> t = translate(Problem.of(16, 8, 12, 4, False, False, (Replicated(), Slab.Y, Slab.X), ("C", "C", None)))
    >>> print("\\n".join(describe(t)[:2]))
    engine:     cuBLASMp via nvmath.distributed.linalg.advanced.Matmul on 4 rank(s), one GPU each
    path:       AllGather+GEMM (cuBLASMp fast path: 1-D, non-cyclic, uniform, first_process (0, 0))
    """
    p = t.problem
    names = {"M": "M", "K": "K", "N": "N", "R": "nothing (replicated)", None: "a 2-D grid"}
    lines = []
    if t.engine == "cublaslt":
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
        "general": f"cuBLASMp general path (no fast path fits; closest contract algorithm: {t.algorithm})",
    }[t.path]
    lines.append(f"path:       {what}")
    lines.append("distributions (chosen by the planner: none given):" if p.chosen else "distributions:")
    for name, role, dist in zip(("a", "b", "result"), t.roles, p.distributions):
        lines.append(f"  {name:7s} {dist!r:16s} splits {names[role]}")
    if t.kernel is not None and t.kernel != t.roles:
        ka, kb, kd = t.kernel
        lines.append(f"handed as:  roles a:{ka} b:{kb} result:{kd} (Replicated operands are cut locally, no communication)")
    frame = "D.T = op(B).T @ op(A).T (nvmath A is b, B is a; result D.T in Fortran order = D in C order)" if t.swapped \
        else "D = op(A) @ op(B) (result in Fortran order)"
    lines.append(f"frame:      {frame}")
    for h in t.handovers:
        lines.append(f"  {h.describe()}")
    if t.result is not None:
        lines.append(f"  result: {t.result.describe()} over {t.result_shape}")
    q = t.qualifiers
    lines.append(f"qualifiers: is_transpose A={q[0]}, B={q[1]}, C={q[2]}")
    for d in t.dims:
        if d.padding:
            lines.append(f"padding:    {d.describe()}")
    if t.passes_c:
        lines.append("c:          passed with MatmulOptions(inplace=False): the user's c is never written")
    if t.fused_epilog:
        lines.append(f"epilog:     fused into cuBLASMp: MatmulEpilog.{t.fused_epilog}")
    if t.post_beta_c or t.post_epilog:
        post = ", ".join(x for x in ("beta * c" if t.post_beta_c else "", t.post_epilog or "") if x)
        lines.append(f"epilogue:   applied by dmatmul on the local result block: {post}")
    if t.gather:
        lines.append(
            f"result:     computed as {t.computed!r}, then allgathered by dmatmul over MPI (host-staged)"
        )
    for note in t.notes:
        lines.append(f"note:       {note}")
    if t.cost is not None:
        lb = _cost.lower_bound_words(p.m, p.n, p.k, p.nranks) * p.itemsize
        replicated = [op for op, d in zip("ab", p.distributions) if d == Replicated()]
        ratio = _plan.versus_bound(t.cost.nbytes, lb, replicated)
        lines.append(
            f"modelled:   {_moves._fmt_bytes(t.cost.nbytes)} received per rank in {t.cost.describe_messages()}, "
            f"{t.cost.flops / 1e9:.3g} GFLOP per rank ({ratio}: "
            f"lower bound {_moves._fmt_bytes(lb)} per rank)"
        )
    lines.append("log:        CUBLASMP_LOG_LEVEL=5 makes cuBLASMp log the path it runs")
    return lines
