"""The 1-D translations: Slab, Replicated and 1-D BlockNonCyclic operands.
One rank runs a local GEMM in cuBLASMp; on several ranks every cuBLASMp fast
path whose roles the given operands fit (a Replicated operand is cut to the
role for free) is translated and costed, and the cheapest wins -- a
Replicated result being computed split and allgathered by dmatmul when no
AllReduce gives it. When no fast path fits, the layout goes to cuBLASMp's
general path as it is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Container, Sequence

from .... import _moves, _plan
from ...._dimmap import DimMap
from ...._distribution import ProcessGrid, Replicated
from ._epilog import finish, pick
from ._orient import AxisOp, build_frame, copy_weights
from ._types import GRID, KERNELS, LOCAL, MODEL, PATHS, DimPlan, NvDistribution, Problem, Role, Translation

__all__ = ["one_rank", "one_d", "model_plan", "shared_grid"]

#: one rank: one local GEMM
#: dmatmul's own allgather of a replicated result crosses PCIe twice besides the network
_HOST_STAGING = 3.0


def _needs_message(p: Problem) -> str:
    return _plan.needs_message(p.algorithm, p.given(), p.transposes, KERNELS, backend="nvmath")


def model_plan(
    p: Problem, kernel: _plan.Kernel, gather_from: Role | None, *, grid: tuple[int, int] | None = None,
    moves: tuple[_moves.Move, ...] = (),
) -> _plan.Plan:
    """The planner's Plan of ``kernel`` (on ``grid``: SUMMA's process grid), after
    ``moves``, and of dmatmul's allgather of a replicated result computed in role
    ``gather_from``."""
    sizes = dataclasses.replace(p.sizes(), grid=grid)
    nbytes, messages, flops = _plan.kernel_cost(sizes, kernel)
    if gather_from is not None:  # host-staged: device->host, one MPI allgather of the blocks, host->device
        # (not _moves.move, which prices a gather as the JAX backend compiles it: from columns or a grid an
        # exchange first; MPI gathers any blocks in one call)
        gathered = (sizes.p - 1) / sizes.p * sizes.elements("d") * sizes.itemsize
        moves += (_moves.Move("d", gather_from, "R", "all-gather (host-staged)", _HOST_STAGING * gathered, 0.0, 1.0),)
    return _plan.costed_plan(sizes, kernel, moves, nbytes, messages, _plan.kernel_collectives(kernel, sizes.p), flops,
                             MODEL)


def _dims(p: Problem, split: Container[str]) -> dict[str, DimPlan]:
    """M, K and N: those in ``split`` cut in ``p.nranks`` (padded) parts, the others whole."""
    return {x: DimPlan.of(x, DimMap.slab(p.size(x), p.nranks if x in split else 1)) for x in "MKN"}


def _nv_1d(p: Problem, operand: str, role: Role, dims: dict[str, DimPlan], grid_size: int) -> NvDistribution:
    """The nvmath distribution (user orientation) of a 1-D role."""
    r, c = p.stored(operand)
    blocks = (dims[r].nv_block, dims[c].nv_block)
    if grid_size == 1:
        return NvDistribution((1, 1), "ROW_MAJOR", blocks)
    if role == "R":  # only GEMM+AllReduce's result: Slab.X of a (P*M, N) matrix, one whole copy per rank
        return NvDistribution((grid_size, 1), "ROW_MAJOR", blocks)
    axis = (r, c).index(role)
    grid = (grid_size, 1) if axis == 0 else (1, grid_size)
    return NvDistribution(grid, "ROW_MAJOR", blocks)


def _axis_ops_1d(p: Problem, operand: str, given: Role, role: Role, dims: dict[str, DimPlan]) -> tuple[AxisOp, AxisOp]:
    ops: list[AxisOp] = []
    for dim in p.stored(operand):
        if dims[dim].padding:
            ops.append("pad")
        elif given == role or dim != role:
            ops.append("keep")
        else:  # a Replicated operand cut to a Slab: a contiguous range
            ops.append("slice")
    return ops[0], ops[1]


def _result_nv(p: Problem, role: Role, dims: dict[str, DimPlan], swapped: bool) -> tuple[NvDistribution, tuple[int, int]]:
    nvu = _nv_1d(p, "d", role, dims, p.nranks)
    shape = (dims["M"].padded_size, dims["N"].padded_size)
    if swapped:
        return nvu.transposed(), (shape[1], shape[0])
    return nvu, shape


def one_rank(p: Problem) -> Translation:
    """One rank: a local GEMM in cuBLASMp (every distribution holds everything).

    Any named algorithm runs as that GEMM, but SUMMA only when an operand is on
    a (1x1) process grid, as on every backend: it is the grid algorithm.
    """
    if p.algorithm == GRID.algorithm and not any(d.grid is not None and d.grid.ndim == 2 for d in p.distributions):
        raise ValueError(_needs_message(p))
    dims = _dims(p, ())
    targets = {"a": p.distributions[0], "b": p.distributions[1], "c": p.distributions[2]}
    nv_user = {op: _nv_1d(p, op, "R", dims, 1) for op in ("a", "b", "c")}
    ops = {op: ("keep", "keep") for op in ("a", "b", "c")}
    weights = copy_weights(p, {})
    frames = [
        build_frame(p, s, targets=targets, nv_user=nv_user, ops=ops, dims=dims, need_tn=False,  # type: ignore[arg-type]
                     pass_c=p.use_c, engine="cublasmp", weights=weights)
        for s in (False, True)
    ]
    frame = pick(frames, p, "local GEMM", "cublasmp")
    result, shape = _result_nv(p, "R", dims, frame.swapped)
    notes: tuple[str, ...] = ()
    if p.algorithm not in ("auto", LOCAL.algorithm):
        notes = (f"algorithm={p.algorithm!r} requested: on one rank cuBLASMp runs a local GEMM",)
    return finish(
        p, algorithm=LOCAL.algorithm, path="local GEMM", engine="cublasmp", frame=frame, roles=("R", "R", "R"),
        kernel=("R", "R", "R"), dims=dims, result=result, result_shape=shape, computed=Replicated(),
        gather=False, notes=notes, cost=model_plan(p, LOCAL, None),
    )


def _candidate(
    p: Problem, kernel: _plan.Kernel, given: tuple[Role, Role, Role], gather: bool
) -> Translation:
    """The translation of ``given`` roles run on ``kernel`` (Replicated cut to the kernel's roles)."""
    ka, kb, kd = kroles = (kernel.a, kernel.b, kernel.d)
    path, kframes = PATHS[kernel]
    engine = "cublaslt" if path == "local GEMM" else "cublasmp"
    split = {r for r in kroles if r != "R"}
    dims = _dims(p, () if engine == "cublaslt" else split)
    by_op = {"a": ka, "b": kb, "c": kd}
    groles = {"a": given[0], "b": given[1], "c": given[2] if not gather else "R"}
    targets = {op: p.role_dist(op, by_op[op]) for op in ("a", "b", "c")}
    ar = path == "GEMM+AR"
    nv_user: dict[str, NvDistribution | None] = {}
    for op in ("a", "b", "c"):
        nv_user[op] = None if engine == "cublaslt" else _nv_1d(p, op, by_op[op], dims, p.nranks)
    ops = {op: _axis_ops_1d(p, op, groles[op], by_op[op], dims) for op in ("a", "b", "c")}
    weights = copy_weights(p, {op: by_op[op] != "R" for op in ("a", "b", "c")})
    pass_c = p.use_c and not ar
    frames = [
        build_frame(p, s, targets=targets, nv_user=nv_user, ops=ops, dims=dims, need_tn=ar, pass_c=pass_c,
                     engine=engine, weights=weights)
        for s in kframes
    ]
    frame = pick(frames, p, path, engine)
    if engine == "cublaslt":
        result, shape = None, (p.m, p.n)
    elif ar:
        mm, nn = dims["M"].padded_size, dims["N"].padded_size
        if frame.swapped:
            mm, nn = nn, mm
        result, shape = NvDistribution((p.nranks, 1), "ROW_MAJOR", (mm, nn)), (p.nranks * mm, nn)
    else:
        result, shape = _result_nv(p, kd, dims, frame.swapped)
    return finish(
        p, algorithm=kernel.algorithm, path=path, engine=engine, frame=frame, roles=given,
        kernel=kroles, dims=dims, result=result, result_shape=shape, computed=p.role_dist("d", kd),
        gather=gather, notes=(), cost=model_plan(p, kernel, kd if gather else None),
    )


def one_d(p: Problem, roles: tuple[Role, Role, Role]) -> Translation:
    """The cheapest fast path the given ``roles`` (a, b, result) fit, else the general path.

    >>> from dmatmul import Replicated, Slab
    >>> p = Problem.of(16, 8, 12, 4, False, False, (Replicated(), Slab.Y, Slab.X), ("C", "C", None))
    >>> t = one_d(p, ("R", "N", "M"))  # a is cut to its rows: a view, no communication
    >>> t.path, t.kernel, t.handover("a").target, t.handover("a").copy, t.gather
    ('AG+GEMM', ('M', 'N', 'M'), Slab.X, None, False)
    """
    if p.algorithm == GRID.algorithm:
        return _summa_1d(p, roles)
    best = _cheapest(p, roles, KERNELS)
    if best is not None:
        return best
    if p.algorithm != "auto":
        raise ValueError(_needs_message(p))
    return _general_1d(p, roles)


def _cheapest(p: Problem, roles: tuple[Role, Role, Role], kernels: Sequence[_plan.Kernel]) -> Translation | None:
    """The cheapest fast path among ``kernels`` that the given ``roles`` fit as
    they are (a Replicated operand cut to the kernel's role; with
    ``algorithm="auto"``, a Replicated result computed split and allgathered),
    None when none fits."""
    ga, gb, gd = roles
    order = {name: i for i, name in enumerate(_plan.ALGORITHMS)}
    best: tuple[tuple[float, float, int], Translation] | None = None
    for kernel in kernels:
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
        weight = sum(copy_weights(p, {})[h.operand] for h in t.handovers if h.copy)
        key = (t.cost.time, weight, order[kernel.algorithm])
        if best is None or key < best[0]:
            best = (key, t)
    return None if best is None else best[1]


def shared_grid(p: Problem) -> ProcessGrid | None:
    """The one 2-D ProcessGrid that a, b and the result are laid out on (a
    Replicated one fits any), as a named SUMMA needs; None where there is none.

    >>> from dmatmul import BlockNonCyclic, ProcessGrid, Replicated, Slab
    >>> d = BlockNonCyclic(ProcessGrid((4, 1)))
    >>> shared_grid(Problem.of(8, 8, 8, 4, False, False, (d, Replicated(), d), ("C", "C", None)))
    ProcessGrid((4, 1), layout='row')
    >>> shared_grid(Problem.of(8, 8, 8, 4, False, False, (d, Slab.X, d), ("C", "C", None))) is None
    True
    """
    grids = {d.grid for d in p.distributions if not isinstance(d, Replicated)}
    grid = grids.pop() if len(grids) == 1 else None
    return grid if grid is not None and grid.ndim == 2 else None


def _summa_1d(p: Problem, roles: tuple[Role, Role, Role]) -> Translation:
    """``algorithm="summa"`` on a ``(P, 1)`` or ``(1, P)`` grid whose layouts are
    1-D splits (BlockNonCyclic, first_process (0, 0); Replicated also fits):
    cuBLASMp takes any 2-D block-cyclic grid, 1-D ones included, so the
    operands are handed over on their grid as they are (uneven splits padded),
    as ``algorithm="auto"`` hands them where a cuBLASMp path takes them as
    they are; on a 1-D grid nvmath steers cuBLASMp away from its SUMMA
    implementation, to a 1-D fast path where the layouts are one, else to its
    general path. Named and costed as SUMMA on that grid.

    >>> from dmatmul import BlockNonCyclic, ProcessGrid
    >>> d = BlockNonCyclic(ProcessGrid((4, 1)))
    >>> t = one_d(Problem.of(10, 8, 6, 4, False, False, (d, d, d), ("C", "C", None), algorithm="summa"), ("M", "K", "M"))
    >>> t.algorithm, t.path, t.handover("a").target, t.cost.kernel.algorithm, t.cost.moves
    ('summa', 'general', Slab.X, 'summa', ())
    """
    grid = shared_grid(p)
    if grid is None:
        raise ValueError(_needs_message(p))
    auto = p.with_options(algorithm="auto")
    # only cuBLASMp's distributed paths: a local cuBLASLt GEMM per rank is no SUMMA
    t = _cheapest(auto, roles, tuple(k for k in KERNELS if k.algorithm != LOCAL.algorithm)) or _general_1d(auto, roles)
    rows, cols = grid.shape
    note = (
        f"algorithm='summa' on the {rows}x{cols} grid, which is 1-D: its layouts are handed to cuBLASMp as they "
        f"are, and nvmath steers cuBLASMp away from SUMMA on a 1-D grid: expect its {t.path} path"
    )
    notes = tuple(n for n in t.notes if not n.startswith("no cuBLASMp fast path")) + (note,)
    cost = model_plan(p, GRID, "G" if t.gather else None, grid=(rows, cols))
    return dataclasses.replace(t, problem=p, algorithm=GRID.algorithm, notes=notes, cost=cost)


def _general_1d(p: Problem, roles: tuple[Role, Role, Role]) -> Translation:
    """No cuBLASMp fast path fits: hand the layout over as it is (cuBLASMp's
    general path); a Replicated result is computed split and allgathered."""
    ga, gb, gd = roles
    ka = "M" if ga == "R" else ga
    kb = "N" if gb == "R" else gb
    gather = gd == "R"
    kd: Role = ("M" if ka == "M" else "N") if gather else gd
    split = {r for r in (ka, kb, kd) if r != "R"}
    dims = _dims(p, split)
    by_op: dict[str, Role] = {"a": ka, "b": kb, "c": kd}
    groles = {"a": ga, "b": gb, "c": "R" if gather else gd}
    targets = {op: p.role_dist(op, by_op[op]) for op in ("a", "b", "c")}
    nv_user: dict[str, NvDistribution | None] = {op: _nv_1d(p, op, by_op[op], dims, p.nranks) for op in ("a", "b", "c")}
    ops = {op: _axis_ops_1d(p, op, groles[op], by_op[op], dims) for op in ("a", "b", "c")}
    weights = copy_weights(p, {op: True for op in ("a", "b", "c")})
    frames = [
        build_frame(p, s, targets=targets, nv_user=nv_user, ops=ops, dims=dims, need_tn=False, pass_c=p.use_c,
                     engine="cublasmp", weights=weights)
        for s in (False, True)
    ]
    frame = pick(frames, p, "general", "cublasmp")
    result, shape = _result_nv(p, kd, dims, frame.swapped)
    # named and modelled as the closest contract algorithm: the cheapest communicating plan the planner
    # finds for these roles (a local kernel would need a redistribution first, which cuBLASMp does not do as such)
    plans = _plan.plans(p.sizes(), {"a": ga, "b": gb, "d": gd}, MODEL)
    closest = next((pl for pl in plans if pl.algorithm != LOCAL.algorithm), plans[0])
    return finish(
        p, algorithm=closest.algorithm, path="general", engine="cublasmp", frame=frame, roles=roles,
        kernel=(ka, kb, kd), dims=dims, result=result, result_shape=shape, computed=p.role_dist("d", kd),
        gather=gather, notes=("no cuBLASMp fast path takes these roles: cuBLASMp's general path runs",),
        cost=closest,
    )
