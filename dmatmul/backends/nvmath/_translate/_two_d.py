"""The 2-D translation: operands on a ProcessGrid (BlockCyclic, or
BlockNonCyclic that is not a 1-D split). Each distribution is handed to
nvmath as its BlockCyclic data (block sizes must agree per dimension, as
cuBLASMp requires); a Replicated operand is cut to the reference grid. SUMMA
runs when a, b and the result share one 2-D grid in nvmath's frame (not a
1-D one, (P, 1) or (1, P): nvmath steers cuBLASMp away from SUMMA there),
else cuBLASMp's general path; a Replicated result is computed on the grid and
allgathered by dmatmul. Costed as SUMMA on the result's grid (plus the
re-layouts of the general path and the allgather).
"""

from __future__ import annotations

import dataclasses

from .... import _moves
from ...._dimmap import DimMap
from ...._distribution import BlockCyclic, BlockNonCyclic, Distribution, Replicated, Slab, numroc
from ._epilog import finish
from ._one_d import model_plan, shared_grid
from ._orient import AxisOp, Frame, build_frame, copy_weights
from ._types import GRID, DimPlan, NvDistribution, Path, Problem, Role, Translation

__all__ = ["LayoutRefused", "two_d"]


class LayoutRefused(NotImplementedError):
    """A 2-D layout cuBLASMp cannot take as given: its limits, not the
    contract's. ``why`` says which limit, in one clause (for ``explain()`` of
    the product re-laid around it, :mod:`dmatmul._relay`)."""

    def __init__(self, message: str, why: str) -> None:
        super().__init__(message)
        self.why = why


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
            what = f"{name}'s {dist!r} splits {stored[axis]}={shape[axis]} unevenly over {parts} parts next to a 2-D grid"
            raise LayoutRefused(
                f"distribution of {name}: {dist!r} splits {stored[axis]}={shape[axis]} unevenly over {parts} parts "
                "next to a 2-D grid; the nvmath backend pads uneven splits only when every distribution is 1-D "
                f"(Slab, Replicated): use BlockCyclic with an explicit block size, or a size divisible by {parts}",
                f"{what}, which has no block-cyclic form (cuBLASMp takes a grid's operands only block-cyclic, "
                "one block size per dimension; dmatmul pads uneven splits only when every layout is 1-D)",
            )
        blocks.append(shape[axis] // parts)
    return NvDistribution(grid, layout, (blocks[0], blocks[1]), fp)  # type: ignore[arg-type]


def _agreed_blocks(p: Problem, nv: dict[str, NvDistribution | None],
                   names: dict[str, str]) -> dict[str, int | None]:
    """The one block size per dimension (M, K, N) that every operand takes, as
    cuBLASMp needs (None where no operand but a Replicated one has the dimension).

    Along a grid axis of one process every block size places the data alike
    (all of it on that process, in order), so such an axis takes the block
    size the other operands fix for that dimension (as nvmath itself infers
    block sizes). Only sizes fixed by axes of several processes must agree.

    >>> from dmatmul import BlockNonCyclic, ProcessGrid
    >>> p = Problem.of(8, 12, 16, 4, False, False, (BlockNonCyclic(ProcessGrid((4, 1))),
    ...             BlockNonCyclic(ProcessGrid((1, 4))), BlockNonCyclic(ProcessGrid((4, 1)))), ("C", "C", None))
    >>> nv = {op: _as_block_cyclic(p, op, op, d) for op, d in zip("abc", p.distributions)}
    >>> _agreed_blocks(p, nv, {"a": "a", "b": "b", "c": "result"})  # b's N blocks of 3 win over the result's one block of 12
    {'M': 2, 'K': 16, 'N': 3}
    """
    fixed: dict[str, dict[str, int]] = {x: {} for x in "MKN"}
    free: dict[str, dict[str, int]] = {x: {} for x in "MKN"}
    for op, nvd in nv.items():
        if nvd is None:
            continue
        for axis, dim in enumerate(p.stored(op)):
            (free if nvd.grid_shape[axis] == 1 else fixed)[dim][names[op]] = nvd.block_sizes[axis]
    out: dict[str, int | None] = {}
    for dim in "MKN":
        values = set(fixed[dim].values())
        if len(values) > 1:
            clash = ", ".join(f"{k} has {v}" for k, v in fixed[dim].items())
            raise LayoutRefused(
                f"block sizes of {dim} differ: {clash}; cuBLASMp needs one block size per dimension in every "
                f"operand: give the distributions the same block size along {dim} (BlockCyclic with explicit "
                "block sizes)",
                f"the block sizes of {dim} differ ({clash}), and cuBLASMp needs one block size per dimension in "
                "every operand",
            )
        out[dim] = values.pop() if values else max(free[dim].values(), default=None)
    return out


def _refuse_empty_blocks(p: Problem, nv: dict[str, NvDistribution | None], names: dict[str, str],
                         dims: dict[str, DimPlan]) -> None:
    """cuBLASMp needs every process to hold a part of every operand (nvmath:
    "extents must be strictly positive"); say which operand leaves which
    process row or column empty, and what to change.

    >>> from dmatmul import BlockCyclic, ProcessGrid
    >>> bc = BlockCyclic(ProcessGrid((2, 2)), (4, 4))
    >>> two_d(Problem.of(4, 8, 8, 4, False, False, (bc, bc, bc), ("C", "C", None)), (None, None, None))
    Traceback (most recent call last):
    ...
    dmatmul.backends.nvmath._translate._two_d.LayoutRefused: distribution of a: BlockCyclic(ProcessGrid((2, 2), layout='row'), (4, 4)) leaves process row 1 of its 2x2 grid without any of M=4 (blocks of 4): cuBLASMp needs a part of every operand on every process; use blocks of at most 2 along M
    """
    for op in ("a", "b", "c"):
        nvd = nv[op]
        assert nvd is not None
        for axis, dim in enumerate(p.stored(op)):
            nprocs, size, block = nvd.grid_shape[axis], dims[dim].padded_size, nvd.block_sizes[axis]
            empty = [i for i in range(nprocs) if numroc(size, block, i, nvd.first_process[axis], nprocs) == 0]
            if empty:
                dist = p.distributions["abc".index(op)]
                gap = (f"{dist!r} leaves process {('row', 'column')[axis]} {empty[0]} of its "
                       f"{nvd.grid_shape[0]}x{nvd.grid_shape[1]} grid without any of {dim}={size} (blocks of {block})")
                raise LayoutRefused(
                    f"distribution of {names[op]}: {gap}: cuBLASMp needs a part of every operand on every process; "
                    f"use blocks of at most {-(-size // nprocs)} along {dim}",
                    f"{names[op]}'s {gap}, and cuBLASMp needs a part of every operand on every process",
                )


def _grid_path(p: Problem, nvd_user: NvDistribution, frame: Frame) -> tuple[bool, Path, list[str]]:
    """Whether ``frame``'s operands share one 2-D grid, the cuBLASMp path they
    take (SUMMA where nvmath lets it), and why not where it does not."""
    result = nvd_user.transposed() if frame.swapped else nvd_user
    shape = (p.n, p.m) if frame.swapped else (p.m, p.n)
    grids = {(h.distribution.grid_shape, h.distribution.grid_layout)  # type: ignore[union-attr]
             for h in frame.handovers if h.slot in ("A", "B")} | {(result.grid_shape, result.grid_layout)}
    if len(grids) != 1:
        return False, "general", ["the operands do not share one 2-D grid: cuBLASMp's general path runs"]
    nprow, npcol = result.grid_shape
    if result.is_1d:  # nvmath's use_alt_cache: any 1-D distribution on the shared grid
        rows, cols = nvd_user.grid_shape
        return True, "general", [
            f"one shared {rows}x{cols} grid, a 1-D one, on which nvmath steers cuBLASMp away from SUMMA: "
            "expect its general path"
        ]
    if result.block_sizes[0] == shape[0] // nprow or result.block_sizes[1] == shape[1] // npcol:
        return True, "general", [
            "one shared 2-D grid, but the result's block size equals M/nprow or N/npcol, for which nvmath "
            "steers cuBLASMp away from SUMMA: expect its general path"
        ]
    return True, "SUMMA", []


def _cut_replicated(
    p: Problem, nv: dict[str, NvDistribution | None], dists: dict[str, Distribution], dims: dict[str, DimPlan],
    ref: NvDistribution,
) -> tuple[dict[str, Distribution], dict[str, tuple[AxisOp, AxisOp]]]:
    """Each operand's target distribution and its hand-over per axis: a
    Replicated one cut to the reference grid (in ``nv`` too), kept, sliced or
    gathered along each axis; the others as they are."""
    targets: dict[str, Distribution] = {}
    ops: dict[str, tuple[AxisOp, AxisOp]] = {}
    for op in ("a", "b", "c"):
        stored = p.stored(op)
        if nv[op] is None:  # Replicated: cut to the reference grid
            nv[op] = NvDistribution(ref.grid_shape, ref.grid_layout, (dims[stored[0]].nv_block, dims[stored[1]].nv_block))
            axis_ops = []
            for axis in range(2):
                parts = ref.grid_shape[axis]
                one_block = dims[stored[axis]].nv_block * parts >= p.size(stored[axis])
                axis_ops.append("keep" if parts == 1 else "slice" if one_block else "gather")
            ops[op] = (axis_ops[0], axis_ops[1])  # type: ignore[assignment]
            targets[op] = nv[op].as_dmatmul()  # type: ignore[union-attr]
        else:
            ops[op] = ("keep", "keep")
            targets[op] = dists[op]
    return targets, ops


def two_d(p: Problem, roles: tuple[Role | None, ...]) -> Translation:
    """SUMMA when a, b and the result share one 2-D grid in a frame, else the general path.

    >>> from dmatmul import BlockCyclic, ProcessGrid
    >>> bc = BlockCyclic(ProcessGrid((2, 2)), (4, 4))
    >>> t = two_d(Problem.of(16, 16, 16, 4, False, False, (bc, bc, bc), ("C", "C", None)), (None, None, None))
    >>> t.algorithm, t.path, t.swapped, t.result.grid_layout  # C-order blocks: the swapped frame, grid transposed
    ('summa', 'SUMMA', True, 'COL_MAJOR')
    """
    names = {"a": "a", "b": "b", "c": "result"}
    dists = {"a": p.distributions[0], "b": p.distributions[1], "c": p.distributions[2]}
    if p.algorithm not in ("auto", GRID.algorithm):
        raise ValueError(
            f"algorithm={p.algorithm!r} needs 1-D distributions (Slab.X, Slab.Y, Replicated(), or "
            f"BlockNonCyclic on a (P, 1)/(1, P) grid); given {p.given()}: use algorithm='summa' or 'auto'"
        )
    nv: dict[str, NvDistribution | None] = {
        op: None if isinstance(dists[op], Replicated) else _as_block_cyclic(p, op, names[op], dists[op])
        for op in ("a", "b", "c")
    }
    blocks = _agreed_blocks(p, nv, names)
    for op, nvd in nv.items():  # a grid axis of one process takes its dimension's agreed block size
        if nvd is not None:
            rows, cols = (blocks[dim] for dim in p.stored(op))
            assert rows is not None and cols is not None  # this operand has both dimensions
            nv[op] = dataclasses.replace(nvd, block_sizes=(rows, cols))
    ref = next(nv[op] for op in ("c", "a", "b") if nv[op] is not None)
    assert ref is not None
    dims: dict[str, DimPlan] = {}
    for dim in "MKN":
        block = blocks[dim]
        if block is not None:
            dims[dim] = DimPlan.of(dim, DimMap.whole(p.size(dim)), block)
        else:
            dims[dim] = DimPlan.of(dim, DimMap.whole(p.size(dim)), max(1, -(-p.size(dim) // max(ref.grid_shape))))
    targets, ops = _cut_replicated(p, nv, dists, dims, ref)
    _refuse_empty_blocks(p, nv, names, dims)
    gather = isinstance(dists["c"], Replicated)
    weights = copy_weights(p, {op: True for op in ("a", "b", "c")})
    nvd_user = nv["c"]
    assert nvd_user is not None

    # the frame keeping one shared grid (SUMMA) wins over fewer copies; then fewer copies, then C-order result
    options = []
    for swap in (False, True):
        frame = build_frame(p, swap, targets=targets, nv_user=nv, ops=ops, dims=dims, need_tn=False,
                             pass_c=p.use_c, engine="cublasmp", weights=weights, prefer=swap)
        shared, path, notes = _grid_path(p, nvd_user, frame)
        options.append(((0 if path == "SUMMA" else 1, 0 if shared else 1, frame.weight, 0 if swap else 1),
                        frame, path, notes, shared))
    _, frame, path, notes, shared = min(options, key=lambda o: o[0])
    # a Slab is no ProcessGrid (nvmath would see it as a (P, 1) or (1, P) one): SUMMA names the grid
    if p.algorithm == GRID.algorithm and (not any(o[4] for o in options) or shared_grid(p) is None):
        raise ValueError(
            f"algorithm='summa' needs a, b and the result on one shared 2-D ProcessGrid (Replicated() also "
            f"fits); given {p.given()}; or use algorithm='auto'"
        )
    result = nvd_user.transposed() if frame.swapped else nvd_user
    shape = (p.n, p.m) if frame.swapped else (p.m, p.n)
    if any(nvd.first_process != (0, 0) for nvd in nv.values() if nvd is not None):
        notes.append("first_process != (0, 0): nvmath 0.7 and 0.8 refused it on a 2-D grid; 0.9 and 1.0 accept it")
    computed = dists["c"] if not gather else nvd_user.as_dmatmul()
    # modelled as SUMMA on the result's grid; on the general path each operand on another grid is
    # first re-laid by cuBLASMp (an all-to-all's worth of bytes)
    sizes = p.sizes()
    home = (nvd_user.grid_shape, nvd_user.grid_layout)
    elsewhere = [op for op in ("a", "b") if (nv[op].grid_shape, nv[op].grid_layout) != home]  # type: ignore[union-attr]
    moves = tuple(_moves.move(sizes, op, "G", "G") for op in elsewhere if path != "SUMMA")
    cost = model_plan(p, GRID, "G" if gather else None, grid=nvd_user.grid_shape, moves=moves)
    return finish(
        p, algorithm=GRID.algorithm, path=path, engine="cublasmp", frame=frame, roles=tuple(roles),  # type: ignore[arg-type]
        kernel=None, dims=dims, result=result, result_shape=shape, computed=computed, gather=gather,
        notes=tuple(notes), cost=cost,
    )
