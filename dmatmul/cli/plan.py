"""``dmatmul plan``: what the planner would do on a named machine, without running anything.

:func:`project` is pure (sizes, a layout and a cost model in, the planner's
choice and the runners-up out): it asks :mod:`dmatmul._plan` exactly what a
product asks it (``choose_distributions`` where the layout is free, then
``choose``), on the model of a machine of :mod:`dmatmul._machines`, and
imports neither JAX nor any backend. :func:`format_projection` prints it;
:func:`cmd_plan` is the command.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from .. import _cost, _layouts, _machines, _memory, _plan, _roles
from .._distribution import BlockNonCyclic, Distribution, ProcessGrid, Replicated, Slab
from .._spec import DTYPE_INFO, DTYPES
from .common import at_least

__all__ = ["Projection", "Candidate", "project", "format_projection", "parse_layout", "add_parser", "cmd_plan"]

_LETTERS = {"X": Slab.X, "Y": Slab.Y, "R": Replicated()}
_NAMES = {"X": "Slab.X", "Y": "Slab.Y", "R": "Replicated()", "G": "BlockNonCyclic(grid)"}


def parse_layout(text: str) -> str:
    """``"X,Y,X"`` or ``"XYX"`` -> ``"XYX"``: a letter per operand (a, b, result)
    from X (Slab.X), Y (Slab.Y), R (Replicated()), G (a 2-D grid); ValueError
    naming what was given and what is expected.

    >>> parse_layout("x, y, x"), parse_layout("GGG")
    ('XYX', 'GGG')
    """
    key = text.replace(",", "").replace(" ", "").upper()
    if len(key) != 3 or any(c not in "XYRG" for c in key):
        raise ValueError(f"--layout {text!r}: expected three letters for a, b and the result from X (Slab.X), "
                         "Y (Slab.Y), R (Replicated()), G (BlockNonCyclic on the squarest 2-D grid), e.g. X,Y,X")
    return key


def _grid(p: int) -> tuple[int, int]:
    rows = max(r for r in range(1, int(p**0.5) + 1) if p % r == 0)
    return rows, p // rows


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One plan with the layout (a, b, result) it runs on, as letters (``"XYX"``, ``"GGG"``)."""

    plan: _plan.Plan
    layout: str
    grid: tuple[int, int] | None = None
    #: placing a and b on the layout, where the planner chose it (:func:`dmatmul._layouts.weigh`); 0 as given
    placement: float = 0.0

    @property
    def cost(self) -> float:
        """What the planner ranks it by: its time, plus placing a and b where the layout is free."""
        return self.plan.time + self.placement


@dataclasses.dataclass(frozen=True)
class Projection:
    """The planner's choice for one product on one machine, and the best plan of each other algorithm."""

    m: int
    n: int
    k: int
    p: int
    dtype: str
    model: _cost.MachineModel
    chosen: Candidate
    runners_up: tuple[Candidate, ...]
    #: how many plans the choice was made among
    considered: int
    bound: float
    regime: str
    given_layout: bool
    #: the bytes a rank may hold (the machine's memory times DMATMUL_MEMORY_FRACTION), None: not limited
    memory: float | None = None

    @property
    def gemm_time(self) -> float:
        """The chosen plan's local GEMMs, on the roofline."""
        sized = _sized(self, self.chosen)
        return sum(c * self.model.gemm(f, b) for c, f, b in _plan.gemm_calls(sized, self.chosen.plan.kernel))


def _sized(pr: Projection, cand: Candidate) -> _plan.Problem1D:
    info = DTYPE_INFO[pr.dtype]
    return _plan.Problem1D(pr.m, pr.n, pr.k, pr.p, info.itemsize, info.acc_itemsize, grid=cand.grid, memory=pr.memory)


def _dists(layout: str, p: int) -> tuple[Distribution, Distribution, Distribution]:
    grid = BlockNonCyclic(ProcessGrid(_grid(p)))
    a, b, d = (grid if c == "G" else _LETTERS[c] for c in layout)
    return a, b, d


def _letters(dists: tuple[Distribution, ...]) -> str:
    """The letters of a triple ``choose_distributions`` returns with nothing fixed (1-D, or a 2-D grid's).

    >>> _letters((BlockNonCyclic(ProcessGrid((2, 4))), Slab.Y, Replicated()))
    'GYR'
    """
    return "".join("R" if isinstance(d, Replicated) else "X" if d == Slab.X else "Y" if d == Slab.Y else "G"
                   for d in dists)


def _plans_on(problem: _plan.Problem1D, layout: str, model: _cost.MachineModel) -> list[Candidate]:
    """Every plan for operands laid out as ``layout`` (what ``dm.matmul`` would weigh)."""
    dists = _dists(layout, problem.p)
    grid = _grid(problem.p) if "G" in layout else None
    sized = dataclasses.replace(problem, grid=grid)
    roles = _roles.roles_of(dists, (False, False), problem.p)
    ops = frozenset(op for op, c in zip(_plan.OPERANDS, layout) if c == "G")
    return [Candidate(pl, layout, grid) for pl in _plan.plans(sized, roles, model, native=ops, grid_ops=ops)]


def project(m: int, n: int, k: int, p: int, dtype: str, model: _cost.MachineModel, layout: str | None = None,
            memory: float | None = None) -> Projection:
    """What the planner does for ``m x k @ k x n`` in ``dtype`` on ``p`` ranks
    under ``model``: on ``layout`` as given (letters, :func:`parse_layout`),
    or, free, on the layout ``choose_distributions`` picks (as a one-process
    product with ``distribution=None``); and the cheapest plan of every other
    algorithm (free: on any layout the free choice weighs, :func:`dmatmul._layouts.weigh`,
    ranked as it ranks them: the plan's time plus placing a and b there). ``memory``:
    the bytes a rank may hold, where an algorithm's memory is a choice (2.5-D
    SUMMA's layers) or refuses it; None: not limited."""
    info = DTYPE_INFO[dtype]
    problem = _plan.Problem1D(m, n, k, p, info.itemsize, info.acc_itemsize, memory=memory)
    if layout is not None or p == 1:
        candidates = _plans_on(problem, layout or "RRR", model)
        chosen = candidates[0]
    else:
        # every layout the free choice weighs, each plan ranked with placing a and b there (its layout's)
        weighed = _layouts.weigh(problem, model, transposes=(False, False))
        triple = _layouts.choose_distributions(problem, model, transposes=(False, False))
        candidates = [Candidate(pl, _letters(w.dists), w.problem.grid, w.placement) for w in weighed for pl in w.plans]
        chosen = next(Candidate(w.plans[0], _letters(w.dists), w.problem.grid, w.placement)
                      for w in weighed if w.dists == triple)
    best: dict[str, Candidate] = {}
    for c in sorted(candidates, key=lambda c: c.cost):
        best.setdefault(c.plan.algorithm, c)
    runners = tuple(c for name, c in best.items() if name != chosen.plan.algorithm)
    lb = _cost.lower_bounds(m, n, k, p, info.itemsize)
    return Projection(m, n, k, p, dtype, model, chosen, runners, len(candidates), lb["memory_independent"],
                      str(lb["regime"]), layout is not None, memory)


def _kernel(plan: _plan.Plan) -> str:
    kern = plan.kernel
    what = kern.schedule.replace("_", "-")
    if kern.moving:
        what += f", {kern.moving if kern.moving != 'd' else 'the result'} travels"
    return f"{kern.algorithm} ({what})"


def _layout_names(c: Candidate, short: bool = False) -> str:
    """``Slab.X, Slab.Y, Slab.X``; a grid's ``BlockNonCyclic(2x4 grid)``; ``short``: ``X, R, G(2x4)``."""
    grid = "" if c.grid is None else f"{c.grid[0]}x{c.grid[1]}"
    if short:
        return ", ".join(f"G({grid})" if x == "G" else x for x in c.layout)
    return ", ".join(_NAMES[x].replace("grid", f"{grid} grid") for x in c.layout)


def _bound(nbytes: float, pr: Projection, layout: str) -> str:
    replicated = [op for op, x in zip(("a", "b", "result"), layout) if x == "R"]
    return _plan.versus_bound(nbytes, pr.bound, replicated)


def _ms(t: float) -> str:
    return f"{t * 1e3:.3f} ms" if t >= 1e-3 else f"{t * 1e6:.1f} us"


def format_projection(pr: Projection, machine: _machines.Profile, nodes: int = 1) -> str:
    """The projection as ``dmatmul plan`` prints it."""
    plan, mib = pr.chosen.plan, 2.0**20
    where = f"{pr.p} simulated devices" if machine.simulated else (
        f"{pr.p} GPUs: {nodes} node{'s' if nodes > 1 else ''} of {machine.gpus_per_node}")
    peak = machine.peak_for(pr.dtype)
    rate = plan.flops / plan.time if plan.time > 0 else float("inf")
    gemm = pr.gemm_time
    comm = max(plan.time - gemm, 0.0)
    how = "chosen by the planner (distribution=None)" if not pr.given_layout else "as given"
    lines = [
        f"dmatmul plan: {pr.m} x {pr.k} @ {pr.k} x {pr.n}, {pr.dtype}, on {machine.name} ({where})",
        *([] if machine.simulated else [f"machine: {machine.summary}"]),
        f"model: {pr.model.describe()}",
        f"layout (a, b, result): {_layout_names(pr.chosen)}, {how}",
        f"algorithm: {_kernel(plan)}" + "".join(f"; then {mv.describe()}" for mv in plan.moves),
        f"why: the cheapest of {pr.considered} plans; its GEMMs take {_ms(gemm)}, its communication "
        f"{_ms(plan.time - gemm) if comm else 'nothing beyond them'} "
        f"({plan.describe_messages()}, {plan.nbytes / mib:.2f} MiB received per rank"
        + (", overlapped with the GEMMs" if pr.model.overlap and plan.kernel.schedule != "one_shot"
           and plan.kernel_bytes else "") + ")",
        f"predicted: {_ms(plan.time)}, {rate / 1e12:.3g} TFLOP/s per rank = {rate / peak:.0%} of peak "
        f"({peak / 1e12:.4g} TFLOP/s {pr.dtype}{', efficiency ' + format(machine.efficiency, '.2f') if not machine.simulated else ''})",
        f"bytes per rank: {plan.nbytes / mib:.2f} MiB; lower bound {pr.bound / mib:.2f} MiB ({pr.regime} regime): "
        f"{_bound(plan.nbytes, pr, pr.chosen.layout)}",
    ]
    if machine.memory:
        info = DTYPE_INFO[pr.dtype]
        extra = _plan.ALGORITHMS[plan.algorithm].extra_bytes(_sized(pr, pr.chosen), plan.kernel) if pr.p > 1 else 0.0
        held = (pr.m * pr.k + pr.k * pr.n + pr.m * pr.n) * info.itemsize / pr.p + extra
        budget = "" if pr.memory is None else f" (a plan may count on {pr.memory / 2**30:.2f} GiB)"
        lines.append(f"memory per GPU: {held / 2**30:.2f} GiB of {machine.memory / 1e9:.0f} GB{budget}")
    if pr.runners_up:
        free = not pr.given_layout
        lines.append("runners-up: each algorithm's cheapest plan" + ("" if not free else (
            " on any layout, ranked as the planner ranks layouts: its time plus placing a and b there "
            "(x chosen: that sum over the chosen plan's)")))
        head = (f"  {'algorithm':34s} {'a, b, result':22s} {'time':>10s}" + (f" {'placing':>10s}" if free else "")
                + f" {'x chosen':>8s} {'MiB/rank':>9s}  vs the bound")
        lines.append(head)
        for c in pr.runners_up:
            lines.append(f"  {_kernel(c.plan):34s} {_layout_names(c, short=True):22s} {_ms(c.plan.time):>10s}"
                         + (f" {_ms(c.placement):>10s}" if free else "")
                         + f" {c.cost / pr.chosen.cost:8.2f} {c.plan.nbytes / mib:9.2f}  "
                         f"{_bound(c.plan.nbytes, pr, c.layout)}")
        lines.append("  (X: Slab.X, Y: Slab.Y, R: Replicated(), G: BlockNonCyclic on the grid)")
    return "\n".join(lines) + "\n"


def machine_model(name: str, dtype: str, nodes: int) -> tuple[_machines.Profile, _cost.MachineModel, int]:
    """The machine ``name`` (:data:`dmatmul._machines.MACHINES`), its model for
    ``dtype`` on ``nodes`` nodes and its rank count."""
    prof, measured = _machines.profile(name)
    if measured is not None:
        if nodes != 1:
            raise ValueError(f"--nodes {nodes}: machine {name!r} is one host's simulated devices, it has no nodes; "
                             f"use a GPU machine ({', '.join(_machines.PROFILES)})")
        return prof, measured, prof.gpus_per_node
    return prof, prof.model(dtype, nodes), prof.ranks(nodes)


def machine_memory(prof: _machines.Profile, p: int) -> float | None:
    """The bytes each of ``p`` ranks of ``prof`` may hold, as a product on it would
    count (:func:`dmatmul._memory.fraction` of a GPU's memory; ``cpu``/``here``:
    of this host's memory shared by the ``p`` simulated devices); None where
    nothing says."""
    if prof.memory:
        return _memory.fraction() * prof.memory
    total = _memory.host_total()
    return None if total is None else _memory.fraction() * total / p


def cmd_plan(args: argparse.Namespace) -> int:
    try:
        layout = None if args.layout is None else parse_layout(args.layout)
        if args.machine.strip().lower() == "here":
            from .bench.calibration import ensure_calibrated

            ensure_calibrated([8])
        prof, model, p = machine_model(args.machine, args.dtype, args.nodes)
        prof.peak_for(args.dtype)
    except ValueError as e:
        raise SystemExit(f"dmatmul plan: {e}") from None
    memory = machine_memory(prof, p)
    print(format_projection(project(args.m, args.n, args.k, p, args.dtype, model, layout, memory), prof, args.nodes),
          end="")
    return 0


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``dmatmul plan`` on the ``dmatmul`` command line."""
    p = sub.add_parser(
        "plan", help="what the planner would do on a named machine, without running anything",
        description="The algorithm the planner chooses for one product on a named machine and why, the predicted "
        "time and fraction of peak, bytes per rank against the lower bound, and the runners-up; nothing runs.",
    )
    p.add_argument("-m", type=at_least(1), required=True, help="rows of the result")
    p.add_argument("-n", type=at_least(1), required=True, help="columns of the result")
    p.add_argument("-k", type=at_least(1), required=True, help="inner dimension")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="element type (default float32)")
    p.add_argument("--layout", default=None, metavar="X,Y,X",
                   help="a, b and the result: X (Slab.X), Y (Slab.Y), R (Replicated()), G (2-D grid); "
                   "default: the layout the planner picks")
    p.add_argument("--machine", default="h100-nvl8", metavar="NAME",
                   help=f"one of {', '.join(_machines.MACHINES)} (default h100-nvl8; here: this machine, calibrated)")
    p.add_argument("--nodes", type=at_least(1), default=1,
                   help="nodes of 8 GPUs joined by InfiniBand (default 1)")
    p.set_defaults(func=cmd_plan)
    return p
