"""Compiling a planned product: its memory (ideal, needed, compiled) and the
jitted function, on the plan's mesh or inside a user's trace
(:class:`CompiledProduct`)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ... import _memory
from ...algorithms import ALGORITHMS
from ..._distribution import Replicated
from ._arrays import in_trace as in_jax_trace
from . import _exchange, _kernels, _layout, _mesh
from ._mesh import _explicit
from ._shardings import _on_mesh, _typed_on
from ._planning import PlannedProduct


def _device_room(devices: Sequence[jax.Device]) -> int | None:
    """The least any of ``devices`` has free (its allocator's limit less what it
    holds), or None where one does not say (CPU devices report nothing)."""
    room = None
    for device in devices:
        stats = device.memory_stats() or {}
        if "bytes_limit" not in stats:
            return None
        free = int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
        room = free if room is None else min(room, free)
    return room


class CompiledProduct(PlannedProduct):
    """A planned product and its jitted function (compiled on first use)."""

    # -- memory ---------------------------------------------------------------------
    def ideal_memory_bytes(self) -> float:
        """The least a rank can hold for this product: its blocks of a, b and the
        result (the largest over ranks, unpadded) plus one buffer of what travels:
        for ``summa`` one op(A) panel and one op(B) panel (as wide as the longest
        run of k one owner of each holds, :meth:`~._kernels.SummaSchedule.longest_run`:
        with uneven blocks the ring's block, not the common panel width, which may
        be 1), for ``allgather`` one block of the moving operand, for
        ``reduce_scatter`` and ``allreduce`` one partial result (accumulation
        dtype), for ``local`` nothing."""
        spec, p = self.spec, self.nranks
        info = spec.dtype_info
        shapes = spec.shapes
        blocks = 0
        for op, dist in zip("abd", self.distributions):
            blocks += max(int(np.prod(dist.shape(r, shapes[op], p))) for r in range(p))
        kern = self.plan.kernel
        in_flight = ALGORITHMS[kern.algorithm].in_flight(kern)
        if ALGORITHMS[kern.algorithm].grid:
            sched = self.local.summa
            assert sched is not None
            m_loc = self.kernel["a"].block[1 if spec.transpose_a else 0]
            n_loc = self.kernel["b"].block[0 if spec.transpose_b else 1]
            travel = sched.longest_run() * (m_loc + n_loc) * info.itemsize
        elif in_flight == ("d",):  # partial results
            travel = int(np.prod(self.kernel["d"].block)) * info.acc_itemsize
        elif in_flight:  # blocks of the travelling operand
            travel = int(np.prod(self.kernel[in_flight[0]].block)) * info.itemsize
        else:
            travel = 0
        return float(blocks * info.itemsize + travel)

    def memory_needs(self) -> tuple[list[_memory.Need], dict[str, _memory.Probe]]:
        """What this product takes, per place (:mod:`dmatmul._memory`), with no
        allocation nor compile: on each device its padded blocks of a, b and
        the result as given, their copies in the kernel's layouts where those
        differ (a replicated operand whole), c's block where it is read, and
        what the kernel holds in flight (the cost model's extra memory); for a
        numpy result, the result (this rank's block of it) on the host too.
        CPU devices use the host's memory: theirs is counted there, all of
        them together. Made once per plan."""
        if self._needs is not None:
            return self._needs
        spec, p, kern = self.spec, self.nranks, self.plan.kernel
        info, platform = spec.dtype_info, self.devices[0].platform
        cpu = platform == "cpu"
        count = 1 if spec.spmd else p  # the devices this process drives
        if cpu:
            place, on = _memory.HOST, f"on {count} cpu device{'s' if count > 1 else ''}"
        else:
            place = f"each of the {count} {platform} devices" if count > 1 else f"this process's {platform} device"
            on = ""
        times = count if cpu else 1  # (one device's bytes, or all of them where they share the host's memory)
        per: list[tuple[str, str, float]] = []
        names = {"a": "a", "b": "b", "d": "the result"}
        for op in "abd":
            per.append((op, f"{names[op]}'s blocks", float(np.prod(self.given[op].block)) * info.itemsize))
            widened = self.widened and op != "d"  # (a and b as float32 from the start: _kernels.widens)
            size = 4 if widened else info.itemsize
            if self.kernel[op] != self.given[op]:
                laid = "whole on every device" if self.kernel[op].replicated else "re-laid for the kernel"
                per.append((op, f"{names[op]} {laid}", float(np.prod(self.kernel[op].block)) * size))
            elif widened:
                per.append((op, f"{names[op]} as float32", float(np.prod(self.kernel[op].block)) * size))
        if spec.use_c:
            per.append(("c", "c's blocks", float(np.prod(self.given["d"].block)) * info.itemsize))
        pr = self.problem.padded((kern.a, kern.b, kern.d))
        assert pr.p == p
        one_shot = kern.schedule == "one_shot"
        travel = ALGORITHMS[kern.algorithm].extra_bytes(pr, kern) if p > 1 else 0.0
        if travel:
            in_flight = ALGORITHMS[kern.algorithm].in_flight(kern)
            if len(in_flight) > 1:
                op, what = in_flight[0], f"the panels of {' and '.join(in_flight)} in flight"
            elif in_flight and in_flight[0] != "d":
                op = in_flight[0]
                what = f"{op} gathered whole" if one_shot else f"{op}'s blocks in flight"
            else:
                op, what = "d", "the partial results in flight"
            per.append((op, what, travel))
        needs = [_memory.Need(place, op, f"{what} {on}".strip(), int(nbytes * times)) for op, what, nbytes in per]
        if spec.family == "numpy" and not in_jax_trace():
            shape = (spec.m, spec.n)
            if spec.spmd:
                shape = max((self.distributions[2].shape(r, shape, p) for r in range(p)), key=lambda s: s[0] * s[1])
            needs.insert(0, _memory.Need(_memory.HOST, "d", "the result as a numpy array" if not spec.spmd else
                                         "the result's block as a numpy array", shape[0] * shape[1] * info.itemsize))
        devices = self.devices if not spec.spmd else (_layout.my_device(self.geom),)
        probes: dict[str, _memory.Probe] = {} if cpu else {place: functools.partial(_device_room, devices)}
        self._needs = (needs, probes)
        return needs, probes

    def compiled_memory(self) -> dict[str, float]:
        """Bytes per rank of the compiled product, from XLA's memory analysis of the
        jitted program on padded operands (what runs under mpiexec, and for numpy
        operands): ``arguments``, ``outputs``, ``temporaries``, ``aliased`` and
        ``peak`` = arguments + outputs + temporaries - aliased (no c, no bias)."""
        fn = self._function("padded")
        args = [jax.ShapeDtypeStruct(self.given[op].shape, jnp.dtype(self.spec.dtype), sharding=self.sharding(op))
                for op in "ab"]
        with self._own_context():
            stats = fn.lower(*args, None, None).compile().memory_analysis()
        out = {
            "arguments": float(stats.argument_size_in_bytes),
            "outputs": float(stats.output_size_in_bytes),
            "temporaries": float(stats.temp_size_in_bytes),
            "aliased": float(stats.alias_size_in_bytes),
        }
        out["peak"] = out["arguments"] + out["outputs"] + out["temporaries"] - out["aliased"]
        return out

    def _own_context(self) -> contextlib.AbstractContextManager[Any]:
        """One process: dmatmul's own mesh as the context of its computations
        (:meth:`_layout.Geometry.context`). Across processes the context is set
        around each jitted step (:meth:`_execute_local_blocks`), since the local
        steps around them use this rank's device.

        Constant operands inside a user's trace (closed-over arrays, a plan
        executed in ``jit``, eager ``grad`` around constants) are staged into
        that trace as the jax.Array path stages traced ones, under this mesh's
        abstract mesh (``set_mesh`` is refused there)."""
        return contextlib.nullcontext() if self.spec.spmd else self.geom.context()


    # -- the jitted function ------------------------------------------------------
    def sharding(self, operand: str) -> NamedSharding:
        """Where ``operand`` ("a", "b", "d") lives as given (padded space)."""
        return self.geom.sharding(self.given[operand])

    def _core(self, geom: _layout.Geometry) -> Any:
        """``(a, b, c, bias) -> d`` on padded global arrays in their given placements
        on ``geom`` (the plan's, or the same made abstract inside a user's trace)."""
        given, kern_pl, ep = self.given, self.kernel, self.epilogue
        fused = kern_pl["d"] == given["d"]
        body = _kernels.body(self.local, ep if fused else None)
        redistribute = _exchange.redistribute
        widen = self.widened

        def core(a: jax.Array, b: jax.Array, c: jax.Array | None, bias: jax.Array | None) -> jax.Array:
            if widen:  # before they move (_kernels.widens)
                a, b = a.astype(jnp.float32), b.astype(jnp.float32)
            args = [redistribute(a, given["a"], kern_pl["a"], geom), redistribute(b, given["b"], kern_pl["b"], geom)]
            specs = [kern_pl["a"].spec, kern_pl["b"].spec]
            if fused and ep.use_c:
                assert c is not None  # use_c: c was given
                args.append(c)
                specs.append(given["d"].spec)
            if fused and ep.has_bias:
                assert bias is not None  # an epilog with a bias has one (checked in matmul)
                args.append(bias)
                specs.append(PartitionSpec())
            d = jax.shard_map(body, mesh=geom.mesh, in_specs=tuple(specs), out_specs=kern_pl["d"].spec)(*args)
            if not fused:
                d = redistribute(d, kern_pl["d"], given["d"], geom)
                d = _kernels.common.finish(ep, d, c, bias)
            return d

        return core

    def _padded_bias(self, bias: Any) -> Any:
        """The bias as a vector in the result's padded row space (its padded
        column space for a bias of shape (1, N))."""
        m = self.given["d"].maps[1 if self.spec.bias_columns else 0]
        bias = bias.reshape(-1)
        if m.identity:
            return bias
        if isinstance(bias, np.ndarray):
            out = np.zeros(m.padded_size, bias.dtype)
            out[m.positions] = bias
            return out
        # zeros_like keeps a 64-bit bias's dtype where x64 is off (a float64 jax.Array inside jit), as numpy's
        # path does: jnp.zeros(n, float64) would warn that it truncates it to float32
        return jnp.zeros_like(bias, shape=(m.padded_size,)).at[jnp.asarray(m.positions)].set(bias)

    def _function(self, kind: str) -> Any:
        """The jitted function for padded operands ("padded") or global jax.Arrays ("jax")."""
        if kind in self._compiled:
            return self._compiled[kind]
        core, given = self._core(self.geom), self.given
        if kind == "padded":
            fn = jax.jit(core, out_shardings=self.sharding("d"))
        elif kind == "traced":
            fn = self._traced_function()
        else:
            out = self.sharding("d") if _layout.expressible(self.unpadded["d"]) else self.geom.replicated()
            wsc = jax.lax.with_sharding_constraint

            def device(a: jax.Array, b: jax.Array, c: jax.Array | None, bias: jax.Array | None) -> jax.Array:
                a = wsc(_layout.pad(a, given["a"]), self.sharding("a"))
                b = wsc(_layout.pad(b, given["b"]), self.sharding("b"))
                if c is not None:
                    c = wsc(_layout.pad(c, given["d"]), self.sharding("d"))
                if bias is not None:
                    bias = self._padded_bias(bias)
                return _layout.unpad(core(a, b, c, bias), given["d"])

            fn = jax.jit(device, out_shardings=out)
        self._compiled[kind] = fn
        return fn

    def _traced_function(self) -> Any:
        """Global operands inside a user's trace on ``self.user_mesh``: the
        product on this plan's mesh (made abstract where the trace names no
        devices: the trace's own devices, in its order, are then the ranks, and
        no device list of dmatmul's clashes with the trace's), under that mesh
        as the context (not the user's ``jax.set_mesh``, whose axis names the
        kernels do not use), and the result typed on the user's mesh with the
        sharding its distribution implies (a result ``_replicated_result`` names:
        replicated there). Operands typed with Explicit axes are first retyped
        as Auto on their own mesh (no data moves): the layouts are then XLA's to
        match, as for any Auto operand."""
        user = self.user_mesh
        assert user is not None
        geom, given = (self.geom if isinstance(user, Mesh) else self.geom.abstract()), self.given
        core, wsc = self._core(geom), jax.lax.with_sharding_constraint
        spec = self.spec
        on_user = {
            op: _on_mesh(dist, user, shape)
            for op, dist, shape in zip("abd", self.planned, spec.shapes.values())
        }
        # the result as its distribution says (one on another grid than the product's is computed as Slab.X)
        result = _on_mesh(Replicated() if self.replicated_result is not None else self.distributions[2], user,
                          (spec.m, spec.n))
        explicit = _explicit(user)

        def enter(x: jax.Array, op: str) -> jax.Array:
            """An operand typed on the user's mesh with Auto axes: pinned there as its
            distribution says (so its cotangent is too: JAX names a gradient by the mesh
            of its type); with Explicit ones: retyped Auto."""
            if jax.typeof(x).sharding.mesh.explicit_axes:
                return _mesh._auto_typed(x)
            return x if explicit else wsc(x, on_user[op])

        def traced(a: jax.Array, b: jax.Array, c: jax.Array | None, bias: jax.Array | None) -> jax.Array:
            a, b, c = enter(a, "a"), enter(b, "b"), None if c is None else enter(c, "d")
            bias = None if bias is None else _mesh._auto_typed(bias)
            with jax.sharding.use_abstract_mesh(geom.mesh.abstract_mesh):
                a = wsc(_layout.pad(a, given["a"]), geom.sharding(given["a"]))
                b = wsc(_layout.pad(b, given["b"]), geom.sharding(given["b"]))
                if c is not None:
                    c = wsc(_layout.pad(c, given["d"]), geom.sharding(given["d"]))
                if bias is not None:
                    bias = self._padded_bias(bias)
                d = _layout.unpad(core(a, b, c, bias), given["d"])
            return _typed_on(d, result)

        return jax.jit(traced)
