"""What a plan says of itself: :meth:`ExplainedProduct.explain`."""

from __future__ import annotations

import dataclasses


from ... import _cost, _moves, _plan, _roles
from ...algorithms import ALGORITHMS, summa25d
from ..._distribution import Replicated
from . import _layered
from ._execute import ExecutingProduct


class ExplainedProduct(ExecutingProduct):
    """A product that explains its plan."""

    # -- reporting ------------------------------------------------------------------
    def explain(self) -> list[str]:
        plan, pr, geom = self.plan, self.problem, self.geom
        names = {"M": "M", "K": "K", "N": "N", "R": "nothing (replicated)", "G": "rows and columns (2-D grid)"}
        roles = {op: self._role_name(op) for op in "abd"}
        mesh = " x ".join(f"{n}={s}" for n, s in geom.mesh.shape.items())
        lines = [
            f"devices:    {self.nranks} x {self.devices[0].platform}, mesh ({mesh})"
            + (f" of {geom.grid!r}" if geom.grid is not None else ""),
            "distributions" + (" (chosen by the cost model):" if self.chosen_by_model else ":"),
        ]
        for op, name, d in zip("abd", ("a", "b", "result"), self.distributions):
            if op == "d" and self.replicated_result is not None:
                lines.append(f"  {name:7s} {d!r:16s} returned replicated on every device: no jax.Array sharding "
                             f"expresses it ({self.replicated_result})")
            elif op in self.taken_replicated:
                lines.append(f"  {name:7s} {d!r:16s} taken as Replicated(): no jax.Array sharding expresses it "
                             f"({self.taken_replicated[op]}), so every device holds it whole")
            elif op in self.foreign:
                verb = "from" if op == "d" else "to"
                lines.append(f"  {name:7s} {d!r:16s} on another grid: re-laid {verb} Slab.X (all-to-all)")
            else:
                lines.append(f"  {name:7s} {d!r:16s} splits {names[roles[op]]}")
        kern = plan.kernel
        on_grid = ALGORITHMS[kern.algorithm].grid
        if on_grid and kern.schedule == "one_shot":
            rows, cols = geom.mesh.shape["r"], geom.mesh.shape["c"]
            what = (f"one-shot SUMMA on the {rows}x{cols} grid: op(A)'s row panel all-gathered along grid rows "
                    "and op(B)'s column panel along grid columns, in 2 collectives, then one GEMM")
        elif on_grid:
            sched = self.local.summa
            assert sched is not None
            rows, cols = geom.mesh.shape["r"], geom.mesh.shape["c"]
            route = self._summa_route()
            ring, gathered = route.ring, route.gathered
            moving, along, steps, other, down = (
                ("op(A)", "grid rows", cols, "op(B)", "grid columns") if ring == "a"
                else ("op(B)", "grid columns", rows, "op(A)", "grid rows")
            )
            what = (
                f"SUMMA on the {rows}x{cols} grid ({len(sched.owner_col)} K panels of width {sched.width}): "
                f"{moving} blocks ride a ppermute ring along {along} ({steps} steps), "
                + (f"{other} all-gathered once along {down}" if gathered
                   else f"{other}'s matching panel broadcast along {down} at each step"
                   + ("" if self.local.overlap else ", each transfer after the step's GEMM (CPU: one block less)"))
            )
        else:
            one_shot = kern.schedule == "one_shot" and self.nranks > 1
            both = " both ways (half of each block each way: two rings)" if kern.schedule == "bidirectional" else ""
            what = {
                "local": "local GEMM, no communication",
                "allgather": f"one-shot AllGather+GEMM: {kern.moving} all-gathered in one collective, then one GEMM"
                if one_shot else f"ring AllGather+GEMM{both}: {kern.moving} travels {self.nranks - 1} ppermute steps",
                "reduce_scatter": "one-shot GEMM+ReduceScatter: one GEMM of the whole partial product, then one "
                "psum_scatter" if one_shot else
                f"ring GEMM+ReduceScatter{both}: partial sums travel {self.nranks - 1} ppermute steps",
                "allreduce": "GEMM + psum (AllReduce, one collective)",
            }.get(kern.algorithm) or f"{kern.algorithm}: {ALGORITHMS[kern.algorithm].summary}"
            what += f"; roles a:{kern.a} b:{kern.b} result:{kern.d}"
        lines.append(f"kernel:     {what}")
        # one process: global operands, nothing moves, but a jax.Array result on another grid is re-laid onto it
        foreign = [mv for mv in self._foreign_moves()
                   if self.spec.spmd or (mv.operand == "d" and self.spec.family == "jax")]
        for mv in (*plan.moves, *foreign):
            lines.append(f"moves:      {mv.describe()}")
        padded = sorted(
            {f"{m.size}->{m.padded_size}" for pl in self.given.values() for m in pl.maps if m.padded_size != m.size}
        )
        if padded:
            lines.append(f"padding:    {', '.join(padded)} (uneven splits, zeros inside the kernel only)")
        lb = _cost.lower_bound_words(pr.m, pr.n, pr.k, pr.p) * pr.itemsize
        nbytes = plan.nbytes + sum(m.nbytes for m in foreign)
        counted = dataclasses.replace(plan, moves=(*plan.moves, *foreign))
        replicated = [op for op, d in zip("ab", self.planned) if isinstance(d, Replicated)]
        ratio = _plan.versus_bound(nbytes, lb, replicated)
        lines += [
            f"modelled:   {_moves._fmt_bytes(nbytes)} received per rank in {counted.describe_messages()}, "
            f"{plan.flops / 1e9:.3g} GFLOP per rank",
            f"lower bound: {_moves._fmt_bytes(lb)} per rank (memory-independent); {ratio}",
            *self._memory_bound(nbytes, replicated),
            f"predicted:  {plan.time * 1e3:.3g} ms ({self.model.source} {self.devices[0].platform} model)",
        ]
        return lines

    def _memory_bound(self, nbytes: float, replicated: list[str]) -> list[str]:
        """2.5-D SUMMA: the bound it is measured against, the larger of the
        memory-dependent one (for the memory the plan holds per rank) and the
        memory-independent one, each with its formula and source."""
        if self.plan.algorithm != _layered.NAME:
            return []
        pr, one_shot = self.problem, self.plan.kernel.schedule == "one_shot"
        words = ALGORITHMS[_layered.NAME].held_words(pr, one_shot)  # type: ignore[attr-defined]
        dependent = summa25d.memory_dependent_bound(pr.m, pr.n, pr.k, pr.p, words) * pr.itemsize
        independent = _cost.lower_bound_words(pr.m, pr.n, pr.k, pr.p) * pr.itemsize
        binds = "memory-dependent" if dependent > independent else "memory-independent"
        vacuous = (" (0 here: a rank holds enough that the memory does not bind, as on few ranks)"
                   if dependent <= 0 else "")
        return [
            f"bound:      {_moves._fmt_bytes(max(dependent, independent))} per rank = max(memory-dependent "
            f"{_moves._fmt_bytes(dependent)}, memory-independent {_moves._fmt_bytes(independent)}): the {binds} "
            f"one binds; summa25d's bytes: {_plan.versus_bound(nbytes, max(dependent, independent), replicated)}",
            f"            memory-dependent: {summa25d.BOUND_FORMULA}, M = "
            f"{_moves._fmt_bytes(words * pr.itemsize)} held per rank{vacuous} ({summa25d.BOUND_SOURCE})",
            f"            memory-independent: {summa25d.INDEPENDENT_FORMULA} ({summa25d.INDEPENDENT_SOURCE})",
        ]

    def _role_name(self, op: str) -> _plan.Role:
        t = {"a": self.spec.transpose_a, "b": self.spec.transpose_b, "d": False}[op]
        return _roles.role_of(self.planned["abd".index(op)], op, t, self.nranks) or "G"  # type: ignore[arg-type]
