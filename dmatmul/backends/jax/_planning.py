"""Planning a product on JAX devices: the distributions, the product's grid
and mesh, the algorithm, and the placements each operand is given in and the
kernel takes (:class:`PlannedProduct`, the first layer of :class:`JaxPlan`)."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from ... import _cost, _layouts, _memory, _plan, _roles
from ...algorithms import ALGORITHMS
from ..._distribution import Distribution, ProcessGrid, Replicated, Slab
from ..._problem import Spec
from ..._spec import Operands, check_fit, numpy_dtype
from . import _kernels, _layered, _layout, _mesh
from ._mesh import _tracing, mesh_of, plan_devices, trace_mesh
from ._shardings import _given_distributions, _plain, _sharding_of, _unexpressed


def _x64(dtype: str) -> contextlib.AbstractContextManager[Any]:
    """64-bit dtypes need JAX's x64 mode: enable it for dmatmul's own calls only."""
    # jax.config sets its options as attributes at run time: its class declares none of them
    if dtype in ("float64", "complex128") and not jax.config.jax_enable_x64:  # type: ignore[attr-defined]
        return jax.enable_x64(True)
    return contextlib.nullcontext()




_OPERANDS = ("a", "b", "d", "bias")  # the compiled function's arguments: a, b, C (as "d": D's layout), bias


def _product_grid(dists: tuple[Distribution, ...]) -> ProcessGrid | None:
    """The process grid a product runs on: the one most of its operands use
    (ties: the result's, then a's, then b's); None when none uses a grid.

    >>> from dmatmul import BlockCyclic, BlockNonCyclic
    >>> g, h = ProcessGrid((2, 2)), ProcessGrid((2, 2), layout="col")
    >>> _product_grid((BlockCyclic(h, (2, 2)), Slab.X, BlockNonCyclic(g))) == g
    True
    """
    grids = [d.grid for d in dists if d.grid is not None and d.grid.ndim == 2]
    if not grids:
        return None
    order = [dists[2].grid, dists[0].grid, dists[1].grid]
    return max(grids, key=lambda g: (grids.count(g), -order.index(g)))


def summa_schedule(k_a: _layout.DimMap, k_b: _layout.DimMap) -> _kernels.SummaSchedule:
    """SUMMA's panels from op(A)'s K map (over grid columns) and op(B)'s (over
    grid rows): runs of consecutive k held by one grid column of A and one grid
    row of B at consecutive local positions, cut to their greatest common
    length. A shorter last run (K not a multiple of the block) is read with
    zero padding after it rather than shrinking every panel.

    >>> s = summa_schedule(_layout.DimMap.slab(8, 2), _layout.DimMap.slab(8, 4))
    >>> s.width, s.owner_col, s.owner_row, s.offset_a, s.offset_b
    (2, (0, 0, 1, 1), (0, 1, 2, 3), (0, 2, 0, 2), (0, 0, 0, 0))
    >>> cyc = lambda n, nb, p: _layout.DimMap.of_parts(n, [[g for g in range(n) if g // nb % p == q] for q in range(p)])
    >>> s = summa_schedule(cyc(9, 4, 2), cyc(9, 4, 2))  # blocks of 4, a last block of 1
    >>> s.width, s.offset_a, s.extent_a
    (4, (0, 0, 4), 8)
    """
    size = k_a.size
    owner, pos = np.empty((2, size), np.int64), np.empty((2, size), np.int64)
    for which, m in enumerate((k_a, k_b)):
        for part, ids in enumerate(m.parts):
            owner[which, list(ids)] = part
            pos[which, list(ids)] = np.arange(len(ids))
    cut = np.ones(size, bool)
    cut[1:] = np.any(owner[:, 1:] != owner[:, :-1], axis=0) | np.any(pos[:, 1:] != pos[:, :-1] + 1, axis=0)
    starts = np.nonzero(cut)[0]
    lengths = np.diff(np.append(starts, size))
    # every run but the last (which ends both owners' local K) must be a whole number of panels
    width = int(np.gcd.reduce(lengths[:-1])) if len(lengths) > 1 else int(lengths[0])
    steps = np.concatenate([np.arange(s, s + n, width) for s, n in zip(starts, lengths)])
    return _kernels.SummaSchedule(
        width=width,
        owner_col=tuple(int(x) for x in owner[0, steps]),
        offset_a=tuple(int(x) for x in pos[0, steps]),
        owner_row=tuple(int(x) for x in owner[1, steps]),
        offset_b=tuple(int(x) for x in pos[1, steps]),
        extent_a=int(max(pos[0, steps]) + width),
        extent_b=int(max(pos[1, steps]) + width),
    )


#: SUMMA's placements of a, b and the result, and its schedule of K panels
_SummaLayout = tuple[dict[str, _layout.Placement], _kernels.SummaSchedule]


def sized(spec: Spec, device: Any, p: int) -> tuple[_plan.Problem1D, _cost.MachineModel]:
    """The sizes and the machine model a product of ``spec`` on ``p`` devices
    like ``device`` is planned with."""
    model = _cost.model_for(device.platform, p, kind=getattr(device, "device_kind", None))
    # operands widened to float32 before they move (_kernels.widens) move as 4 bytes an element
    itemsize = 4 if widened(spec, device.platform) else None
    return spec.sizes(p, itemsize=itemsize, pads=True), model


def widened(spec: Spec, platform: str) -> bool:
    """Whether a product of ``spec`` on ``platform`` widens its operands to
    float32 before they move (:func:`_kernels.widens`)."""
    return _kernels.widens(platform, numpy_dtype(spec.dtype), spec.dtype_info.accumulator)


class PlannedProduct:
    """A product laid out and its algorithm chosen (no function compiled yet)."""

    plan: _plan.Plan  # the chosen algorithm and its cost (:meth:`_choose`)
    algorithm: str  # its name

    def __init__(self, spec: Spec, operands: Operands, within: _layout.Geometry | None = None) -> None:
        self.spec = spec
        # one group's product of independent ones on a user's mesh (:mod:`._independent`): its ranks are the
        # group's, along ``within``'s rank axis; the caller takes the operands in and the result out
        self.within = within
        # the user's mesh (jax.Array operands placed on one, or jax.set_mesh): its devices in mesh order are
        # the ranks, and the result goes back onto it
        self.user_mesh = mesh_of(spec, operands) if within is None else None
        # inside a user's trace on a mesh: the trace's devices, in its order, are the ranks, and the result is
        # typed on the user's mesh (:meth:`_traced_function`)
        self.traced = self.user_mesh is not None and _tracing(operands)
        self.devices = _layout.process_devices(spec.nprocs) if spec.spmd else plan_devices(
            spec, mesh_of(spec, operands) if within is not None else self.user_mesh)
        self.nranks = p = len(self.devices) if within is None else within.nranks
        self.problem, self.model = sized(spec, self.devices[0], p)
        #: whether the operands are widened to float32 before they move (:func:`widened`)
        self.widened = widened(spec, self.devices[0].platform)
        if _layered.has_layers(p):  # the memory its layers may take: DMATMUL_MEMORY_FRACTION of the devices'
            self.problem = dataclasses.replace(self.problem, memory=_memory.plan_budget(self.devices))
        grid, laid = self._lay_out(operands)
        kern, summa, shared = self._choose(grid, laid)
        schedule = self._place(kern, summa, shared)
        self.local = self._local_problem(kern, shared, schedule)
        self.epilogue = _kernels.Epilogue(spec)
        if ALGORITHMS[kern.algorithm].grid and p > 1 and summa is not None:
            self.plan = self._summa_cost(self.plan, summa)
        elif kern.algorithm == _layered.NAME:
            self.plan = _layered.recost(self.plan, self.problem, self.kernel, self.local, self.model, self.problem.itemsize)
        self.algorithm = self.plan.algorithm
        self._compiled: dict[str, Any] = {}
        self._needs: tuple[list[_memory.Need], dict[str, _memory.Probe]] | None = None
        self._targets: dict[str, NamedSharding] = {}  # where each jax.Array operand goes (_device_operand)

    def _lay_out(
        self, operands: Operands
    ) -> tuple[ProcessGrid | None, tuple[Distribution, Distribution, Distribution]]:
        """The distributions, the product's grid and mesh, and what each operand is
        taken as (``planned``); the grid, and the triple before operands taken
        replicated are substituted."""
        spec, p = self.spec, self.nranks
        self.distributions, self.chosen_by_model = self._distributions(operands)
        check_fit(self.distributions, p, spmd=self.spec.spmd, available=len(jax.local_devices()))
        grid = _product_grid(self.distributions)  # a 1x1 grid on one rank too: SUMMA is named there as well
        # 2.5-D SUMMA runs on its own mesh of layers: operands on a 2-D grid are re-laid as Slab.X for it
        layered = spec.algorithm == _layered.NAME and p > 1
        grid = None if layered else grid
        # a jax.Array result whose layout no sharding expresses (uneven, cyclic, another grid) comes back
        # replicated: the plan then targets Replicated() itself, so the gather is a planned, explained move
        self.replicated_result = self._replicated_result(grid)
        if self.replicated_result is not None and not layered:  # (the layers' mesh is no grid's)
            grid = _product_grid((*self.distributions[:2], Replicated()))
        # operands on another grid than the product's are re-laid as Slab.X first (and the result
        # from Slab.X after): in one process the global matrices need no move at all. A result returned
        # replicated is not re-laid onto its grid.
        self.foreign = {
            op: d for op, d in zip("abd", self.distributions)
            if d.grid is not None and d.grid.ndim == 2 and (layered or grid is not None and d.grid != grid)
            and not (op == "d" and self.replicated_result is not None)
        }
        # an operand on another grid that splits as a Slab does (a BlockNonCyclic on a (P, 1) or (1, P) grid)
        # is that Slab, whose blocks are the same on any mesh: taken as it, with nothing to re-lay (re-laid as
        # Slab.X it would lose its role, and a named algorithm that fits it would be refused)
        as_slab: dict[str, Distribution] = {}
        for op in _plan.OPERANDS:
            role = _roles.role_of(self.foreign[op], op, spec.transposes[op], p) if op in self.foreign else None
            if role is not None:
                as_slab[op] = _roles.role_dist(op, role, spec.transposes[op])
                del self.foreign[op]
        pa, pb, pd = (Slab.X if op in self.foreign else as_slab.get(op, d) for op, d in zip("abd", self.distributions))
        if self.replicated_result is not None:
            pd = Replicated()
        self.planned = (pa, pb, pd)
        self.geom = self.within or _layout.Geometry.create(self.devices, grid)
        # a jax.Array a or b whose layout no sharding on the mesh expresses (cyclic, uneven) is placed
        # replicated (:meth:`_device_operand`): the plan takes it as what it then is, Replicated(), and slices
        # it into the kernel's layout, rather than re-laying it on the grid to move it back
        self.taken_replicated = self._taken_replicated()
        self.planned = (
            Replicated() if "a" in self.taken_replicated else pa, Replicated() if "b" in self.taken_replicated else pb,
            pd,
        )
        if grid is not None:
            rows, cols = grid.shape  # the product's grid is 2-D
            self.problem = dataclasses.replace(self.problem, grid=(rows, cols), grid_order=grid.layout)
        return grid, (pa, pb, pd)

    def _choose(
        self, grid: ProcessGrid | None, laid: tuple[Distribution, Distribution, Distribution]
    ) -> tuple[_plan.Kernel, _SummaLayout | None, dict[str, _layout.DimMap | None]]:
        """Choose the algorithm (``self.plan``); its kernel, SUMMA's placements
        (on a grid) and the padded map each logical dim shares."""
        spec, p = self.spec, self.nranks
        pa, pb, pd = laid
        roles = self._roles(self.planned)
        shapes = spec.shapes

        # the operands laid out on the product's grid, which SUMMA takes as they are. A named SUMMA takes
        # also those a 1-D role describes for the other kernels (BlockNonCyclic on a (P, 1) or (1, P) grid
        # splits as a Slab does); "auto" costs SUMMA's candidate as moving those, so that for such operands it
        # favours the 1-D kernels, which take that split as it is
        named = spec.algorithm != "auto" and ALGORITHMS[spec.algorithm].grid
        on_grid = self._on_grid(self.planned, grid, roles, named)
        summa = self._summa_placements(on_grid, roles, shapes) if grid is not None else None
        native = frozenset(
            op for op in on_grid if summa is not None and self._given_grid(op, shapes[op]) == summa[0][op]
        )
        # a named algorithm must fit the distributions as given, not the replicated operands or delivery
        fit = (pa, pb, self.distributions[2] if self.replicated_result is not None else pd)
        fit_roles = None if fit == self.planned else self._roles(fit)
        fit_grid = self._on_grid(fit, grid, fit_roles or roles, named)
        given_dists = ", ".join(f"{name}={d!r}" for name, d in zip(("a", "b", "result"), self.distributions))
        self.plan = _plan.choose(
            self.problem, roles, algorithm=spec.algorithm, model=self.model,
            transposes=(spec.transpose_a, spec.transpose_b), native=native, backend="jax", fit_roles=fit_roles,
            grid_ops=on_grid | fit_grid, given=f"({given_dists})",
            kernels=self._runnable(grid),
        )
        if spec.algorithm == "auto" and summa is not None and p > 1:
            # auto weighs SUMMA at the traffic its kernel here has (:meth:`_summa_cost`), as explain() reports it,
            # not at the planner's neutral count: otherwise it takes a SUMMA schedule that its own costs put last
            found = _plan.plans(self.problem, roles, self.model, native, kernels=self._runnable(grid),
                                grid_ops=on_grid | fit_grid, transposes=(spec.transpose_a, spec.transpose_b))
            costed = [self._summa_cost(pl, summa) if ALGORITHMS[pl.algorithm].grid else pl for pl in found]
            order = list(ALGORITHMS)
            self.plan = min(costed, key=lambda pl: (pl.time, len(pl.moves), order.index(pl.algorithm)))
        kern = self.plan.kernel
        if kern.algorithm == _layered.NAME:
            self.geom = _layered.geometry(self.devices, self.problem)
        split = {r for r in (*roles.values(), kern.a, kern.b, kern.d) if r not in ("R", "G")}
        shared = {
            dim: _layout.DimMap.slab(size, p) if dim in split else None
            for dim, size in (("M", spec.m), ("K", spec.k), ("N", spec.n))
        }

        return kern, summa, shared

    def _runnable(self, grid: ProcessGrid | None) -> list[_plan.Kernel] | None:
        """The kernels this product may run (None: every one): on a grid, not the
        layers' mesh (only a named 2.5-D SUMMA leaves it, re-laid as Slab.X); within
        a user's mesh (one group's product), the 1-D ones, whose ranks are one axis."""
        if self.within is not None:
            return [k for k in _plan.KERNELS if not ALGORITHMS[k.algorithm].grid and k.algorithm != _layered.NAME]
        return None if grid is None else _plan.grid_kernels(_plan.KERNELS)

    def _place(
        self, kern: _plan.Kernel, summa: _SummaLayout | None,
        shared: dict[str, _layout.DimMap | None],
    ) -> _kernels.SummaSchedule | None:
        """Where each operand is (``given``, ``unpadded``) and where the kernel
        takes it (``kernel``); SUMMA's schedule, or None."""
        spec = self.spec
        transposes, shapes = spec.transposes, spec.shapes

        def placement(op: str, dist: Distribution) -> _layout.Placement:
            dims = _roles.stored_dims(op, transposes[op])  # type: ignore[arg-type]
            return _layout.placement_of(dist, self.geom, shapes[op], (shared[dims[0]], shared[dims[1]]))

        self.given = {op: placement(op, d) for op, d in zip("abd", self.planned)}
        # the same layouts on the matrices as they are (no padding shared with the other operands): what a
        # jax.Array in or out carries as its sharding, where one expresses it
        self.unpadded = {op: _layout.placement_of(d, self.geom, shapes[op], (None, None))
                         for op, d in zip("abd", self.planned)}
        if ALGORITHMS[kern.algorithm].grid:
            assert summa is not None
            self.kernel, schedule = summa
        elif kern.algorithm == _layered.NAME:
            self.kernel, schedule = _layered.placements(spec, *_layered.layers(self.problem))
        else:
            self.kernel = {
                op: placement(op, _roles.role_dist(op, kern.role(op), transposes[op])) for op in _plan.OPERANDS
            }
            schedule = None
        return schedule

    def _local_problem(
        self, kern: _plan.Kernel, shared: dict[str, _layout.DimMap | None],
        schedule: _kernels.SummaSchedule | None,
    ) -> _kernels.LocalProblem:
        """What the kernel body of each rank needs to know."""
        spec, p = self.spec, self.nranks
        # the bias runs along the result's rows, or its columns (a bias of shape (1, N))
        along = 1 if spec.bias_columns else 0
        d_kernel = self.kernel["d"]
        return _kernels.LocalProblem(
            spec=spec,
            kernel=kern,
            nranks=p,
            axis=self.geom.rank_axis,
            block={dim: (m.block if m is not None else size)
                   for (dim, m), size in zip(shared.items(), (spec.m, spec.k, spec.n))},
            bias_axis=d_kernel.axes[along],
            bias_block=d_kernel.maps[along].block,
            summa=schedule,
            overlap=self.devices[0].platform != "cpu",
        )

    # -- planning -------------------------------------------------------------
    def _replicated_result(self, grid: ProcessGrid | None) -> str | None:
        """Why a ``jax.Array`` result cannot carry its distribution as a sharding
        (one process), or None when it can: JAX shards only in even blocks, in
        order, on one mesh. Such a result comes back replicated on every device."""
        if self.spec.family != "jax" or self.spec.spmd or self.nranks == 1:
            return None
        return self._undeliverable(self.distributions[2], grid)

    def _undeliverable(self, dist: Distribution, grid: ProcessGrid | None) -> str | None:
        """Why no ``jax.Array`` sharding lays a result out as ``dist`` says, or None."""
        mesh = self.user_mesh  # (0, 0): the layout alone; whether it splits evenly is judged below
        if mesh is not None and _sharding_of(_plain(dist, (self.spec.m, self.spec.n)), mesh, (0, 0)) is None:
            if isinstance(mesh, Mesh) and mesh == trace_mesh(tuple(mesh.devices.flat)):
                return (f"inside jit, with no mesh of yours, every product is typed on dmatmul's mesh "
                        f"{dict(mesh.shape)}, and no sharding of it lays it out")
            return f"no sharding of the operands' mesh {dict(mesh.shape)} lays it out"
        return _unexpressed(dist, self._result_geometry(grid, dist), (self.spec.m, self.spec.n))

    def _taken_replicated(self) -> dict[str, str]:
        """The operands a and b taken as ``Replicated()``, each with why: in one
        process, a jax.Array whose planned layout no sharding on the plan's mesh
        expresses, which :meth:`_device_operand` places replicated (each device
        then holds it whole). Numpy operands are placed as their layout says, and
        under mpiexec each rank holds its own block: none there."""
        if self.spec.family != "jax" or self.spec.spmd or self.nranks == 1:
            return {}
        found = {op: _unexpressed(d, self.geom, self.spec.shapes[op]) for op, d in zip("ab", self.planned)}
        return {op: f"on another grid than the product's, and as Slab.X {why}" if op in self.foreign else why
                for op, why in found.items() if why is not None}

    def _result_geometry(self, grid: ProcessGrid | None, dist: Distribution | None = None) -> _layout.Geometry:
        """The geometry whose mesh lays out the result as its distribution (or
        ``dist``) says: the product's, or the result's own grid where it is on
        another one (the result is then computed as Slab.X and re-laid onto that
        grid: :meth:`_to_result_grid`)."""
        if self.within is not None:
            return self.within
        own = (dist or self.distributions[2]).grid
        return _layout.Geometry.create(self.devices, own if own is not None and own.ndim == 2 else grid)

    def _to_result_grid(self, d: jax.Array) -> jax.Array:
        """One process, no user mesh: a result on another grid than the product's,
        computed as Slab.X, re-laid onto its own grid's mesh (the same devices)."""
        if "d" not in self.foreign:
            return d
        dist, shape = self.distributions[2], (self.spec.m, self.spec.n)
        geom = self._result_geometry(None)
        sharding = geom.sharding(_layout.placement_of(dist, geom, shape, (None, None)))
        if _mesh._in_vmap():  # each matrix of the batch re-laid (the result is on these devices already)
            return jax.lax.with_sharding_constraint(d, sharding)
        return jax.device_put(d, sharding)

    def _summa_route(self, summa: _SummaLayout | None = None) -> _kernels.SummaRoute:
        """How this plan's SUMMA ring runs (:func:`_kernels.summa_route`); ``summa``: SUMMA's placements and
        schedule (default: this plan's own)."""
        placed, sched = summa if summa is not None else (self.kernel, self.local.summa)
        assert sched is not None
        ta, tb = self.spec.transpose_a, self.spec.transpose_b
        return _kernels.summa_route(sched, self.geom.mesh.shape["r"], self.geom.mesh.shape["c"],
                                    placed["a"].block[0 if ta else 1], placed["b"].block[1 if tb else 0])

    def _summa_cost(self, plan: _plan.Plan, summa: _SummaLayout) -> _plan.Plan:
        """``plan`` (SUMMA) with the bytes and transfers its kernel here really
        has, from the blocks it moves: the planner's backend-neutral count has
        each panel's byte received once, as a broadcast delivers it, and K
        unpadded. The ring (:meth:`_kernels.SummaRoute.traffic`) broadcasts in
        ppermute rounds that every rank receives; both schedules move op(A)'s
        and op(B)'s local K as the panels read it (padded to whole panels:
        :func:`_kernels.grid._pad_to_extents`), and the one-shot one gathers them
        whole along the grid row and column (``cols - 1`` and ``rows - 1``
        blocks), block-cyclic padding included. ``summa``: SUMMA's placements and schedule."""
        placed, sched = summa
        ta, tb = self.spec.transpose_a, self.spec.transpose_b
        m_loc, n_loc = placed["a"].block[1 if ta else 0], placed["b"].block[0 if tb else 1]
        if plan.kernel.schedule == "one_shot":
            rows, cols = self.geom.mesh.shape["r"], self.geom.mesh.shape["c"]
            k_a = max(placed["a"].block[0 if ta else 1], sched.extent_a)
            k_b = max(placed["b"].block[1 if tb else 0], sched.extent_b)
            elements, transfers = (cols - 1) * k_a * m_loc + (rows - 1) * k_b * n_loc, 0
        else:
            route = self._summa_route(summa)
            elements, transfers = route.traffic(*((m_loc, n_loc) if route.ring == "a" else (n_loc, m_loc)))
        sized = self.problem.padded(("G",))
        return _plan.costed_plan(sized, plan.kernel, plan.moves, elements * sized.itemsize, transfers,
                                 plan.kernel_collectives, plan.flops, self.model, plan.kernel_copied)

    def _roles(self, dists: tuple[Distribution, Distribution, Distribution]) -> dict[str, _plan.Role]:
        """Each operand's role; every grid operand of ``dists`` is on the product's grid."""
        return _roles.roles_of(dists, (self.spec.transpose_a, self.spec.transpose_b), self.nranks)

    def _on_grid(
        self, dists: tuple[Distribution, Distribution, Distribution], grid: ProcessGrid | None,
        roles: dict[str, _plan.Role], one_d: bool,
    ) -> frozenset[str]:
        """The operands of ``dists`` laid out on the product's ``grid``: those
        with a 2-D layout (role "G") and, with ``one_d``, those whose layout
        there is a 1-D split (not replicated: on one rank nothing is split,
        and every layout is "R")."""
        return frozenset(
            op for op, d in zip("abd", dists)
            if grid is not None and d.grid == grid and (roles[op] == "G" or (one_d and roles[op] != "R"))
        )

    def _given_grid(self, op: str, shape: tuple[int, int]) -> _layout.Placement:
        dist = self.planned["abd".index(op)]
        return _layout.placement_of(dist, self.geom, shape, (None, None))

    def _summa_placements(
        self, on_grid: frozenset[str], roles: dict[str, _plan.Role], shapes: dict[str, tuple[int, int]]
    ) -> tuple[dict[str, _layout.Placement], _kernels.SummaSchedule]:
        """SUMMA's own layouts on the grid: op(A) rows over "r" and K over "c",
        op(B) K over "r" and columns over "c", the result rows over "r" and
        columns over "c". Maps are taken from the operands already on the grid
        (``on_grid``): M's from op(A) or else the result, N's from op(B) or else
        the result, those with a 2-D layout (role "G") before those whose
        layout is a 1-D split (a BlockNonCyclic on a (P, 1) grid), which then
        move to the others' rather than the other way round."""
        spec = self.spec
        rows, cols = self.geom.mesh.shape["r"], self.geom.mesh.shape["c"]
        grid_maps = {
            op: self._given_grid(op, shapes[op]).maps
            for op in "abd"
            if op in on_grid and not (op == "a" and spec.transpose_a) and not (op == "b" and spec.transpose_b)
        }
        Map = _layout.DimMap

        def from_grid(sources: tuple[tuple[str, int], ...], default: _layout.DimMap) -> _layout.DimMap:
            found = [(roles[op] != "G", i) for i, (op, _) in enumerate(sources) if op in grid_maps]
            if not found:
                return default
            op, axis = sources[min(found)[1]]
            return grid_maps[op][axis]

        m_map = from_grid((("a", 0), ("d", 0)), Map.slab(spec.m, rows))
        ka_map = from_grid((("a", 1),), Map.slab(spec.k, cols))
        kb_map = from_grid((("b", 0),), Map.slab(spec.k, rows))
        n_map = from_grid((("b", 1), ("d", 1)), Map.slab(spec.n, cols))
        P = _layout.Placement
        a = P((ka_map, m_map), ("c", "r")) if spec.transpose_a else P((m_map, ka_map), ("r", "c"))
        b = P((n_map, kb_map), ("c", "r")) if spec.transpose_b else P((kb_map, n_map), ("r", "c"))
        return {"a": a, "b": b, "d": P((m_map, n_map), ("r", "c"))}, summa_schedule(ka_map, kb_map)

    def _distributions(
        self, operands: Operands
    ) -> tuple[tuple[Distribution, Distribution, Distribution], bool]:
        """The given triple, or (one process, none given) the planner's choice:
        jax.Arrays keep the 1-D layout their sharding expresses."""
        if self.spec.distributions is not None:
            return self.spec.distributions, False
        fixed = _given_distributions(self.spec, operands, self.devices)
        # a jax.Array result that no sharding expresses would come back replicated: not a candidate
        deliverable = None if self.spec.family != "jax" or self.spec.spmd else (
            lambda d: self._undeliverable(d, None) is None)
        chosen = _layouts.choose_distributions(
            self.problem, self.model, transposes=(self.spec.transpose_a, self.spec.transpose_b), fixed=fixed,
            deliverable=deliverable, algorithm=self.spec.algorithm,
        )
        return chosen, True

    @property
    def cost(self) -> _plan.Plan:
        """The planner's plan: modelled bytes, messages, flops and time per rank."""
        return self.plan
