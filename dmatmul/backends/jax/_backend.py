"""The JAX backend: plan (roles, padding, kernel) and execute (jit over shard_map)."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from ... import _cost, _plan
from ..._distribution import Distribution, Replicated, Slab
from ..._errors import DistributionError
from ..._matmul import Operands, Spec
from . import _kernels, _layout

__all__ = ["JaxBackend", "JaxPlan"]

_ACC = {"float16": jnp.float32, "bfloat16": jnp.float32}
_DIM_OF = {"a": ("M", "K"), "b": ("K", "N"), "d": ("M", "N")}


def _x64(dtype: str) -> contextlib.AbstractContextManager[Any]:
    """64-bit dtypes need JAX's x64 mode: enable it for dmatmul's own calls only."""
    if dtype in ("float64", "complex128") and not jax.config.jax_enable_x64:
        return jax.enable_x64(True)
    return contextlib.nullcontext()


def _precision(dtype: str) -> Any:
    # cuBLAS semantics: float32 means float32 (no TF32/bf16 passes on GPU/TPU)
    return jax.lax.Precision.HIGHEST if dtype in ("float32", "complex64") else None


@dataclasses.dataclass(frozen=True)
class _Layouts:
    """Roles, split axes and padded-space maps of one product."""

    roles: dict[str, _plan.Role]  # given roles: "a", "b", "d"
    transposes: tuple[bool, bool]
    maps: dict[str, _layout.DimMap]  # "M", "K", "N"

    def stored(self, operand: str) -> tuple[str, str]:
        t = {"a": self.transposes[0], "b": self.transposes[1], "d": False}[operand]
        return _plan.stored_dims(operand, t)  # type: ignore[arg-type]

    def split_axis(self, operand: str, role: _plan.Role) -> int | None:
        return None if role == "R" else self.stored(operand).index(role)

    def dim_maps(self, operand: str) -> tuple[_layout.DimMap, _layout.DimMap]:
        r, c = self.stored(operand)
        return self.maps[r], self.maps[c]


def _infer_distribution(x: Any, devices: tuple[jax.Device, ...]) -> Distribution | None:
    """The 1-D distribution a jax.Array's sharding expresses over ``devices``."""
    if not isinstance(x, jax.Array) or isinstance(x, jax.core.Tracer):
        return None
    sharding = x.sharding
    if not isinstance(sharding, NamedSharding) or tuple(sharding.mesh.devices.flat) != devices:
        return None
    if sharding.mesh.devices.ndim != 1 and len(devices) > 1:
        return None
    parts = tuple(sharding.spec) + (None,) * (2 - len(sharding.spec))
    split = [i for i, s in enumerate(parts) if s is not None]
    if not split:
        return Replicated()
    if len(split) == 1:
        return Slab(split[0])
    return None


class JaxPlan:
    """A compiled product on a set of JAX devices (one process)."""

    def __init__(self, spec: Spec, operands: Operands) -> None:
        self.spec = spec
        self.devices = _layout.process_devices(spec.nprocs) if spec.spmd else _layout.resolve_devices(spec.devices)
        self.mesh = _layout.mesh_1d(self.devices)
        self.nranks = p = len(self.devices)
        self.model = _cost.model_for(self.devices[0].platform)
        itemsize = np.dtype(operands.a.dtype).itemsize
        acc_dtype = _ACC.get(spec.dtype, jnp.dtype(spec.dtype))
        self.problem = _plan.Problem1D(spec.m, spec.n, spec.k, p, itemsize, np.dtype(acc_dtype).itemsize)
        self.distributions, self.chosen_by_model = self._distributions(operands)
        roles = self._roles(self.distributions)
        self.plan = _plan.choose(
            self.problem,
            roles,
            algorithm=spec.algorithm,
            model=self.model,
            transposes=(spec.transpose_a, spec.transpose_b),
        )
        kern = self.plan.kernel
        split = {r for r in (*roles.values(), kern.a, kern.b, kern.d) if r != "R"}
        maps = {
            dim: _layout.DimMap(size, p, padded=dim in split and size % p != 0)
            for dim, size in (("M", spec.m), ("K", spec.k), ("N", spec.n))
        }
        self.layouts = _Layouts(roles, (spec.transpose_a, spec.transpose_b), maps)
        self.local = _kernels.LocalProblem(
            kernel=kern,
            nranks=p,
            transpose_a=spec.transpose_a,
            transpose_b=spec.transpose_b,
            block={d: maps[d].block for d in "MKN"},
            acc_dtype=acc_dtype,
            precision=_precision(spec.dtype),
        )
        self.epilogue = _kernels.Epilogue(
            alpha=spec.alpha,
            beta=spec.beta,
            epilog=spec.epilog,
            use_c=spec.use_c,
            has_bias=spec.has_bias,
            out_dtype=jnp.dtype(spec.dtype),
        )
        self.algorithm = self.plan.algorithm
        self._compiled: dict[str, Any] = {}

    # -- planning -------------------------------------------------------------
    def _roles(self, dists: tuple[Distribution, Distribution, Distribution]) -> dict[str, _plan.Role]:
        spec, p = self.spec, self.nranks
        roles: dict[str, _plan.Role] = {}
        for operand, name, dist, t in zip(
            ("a", "b", "d"), ("a", "b", "result"), dists, (spec.transpose_a, spec.transpose_b, False)
        ):
            try:
                dist.nranks(p)
            except DistributionError as e:
                raise DistributionError(
                    f"distribution of {name}: {dist!r} does not fit the {p} devices in use: {e}"
                ) from None
            role = _plan.role_of(dist, operand, t, p)  # type: ignore[arg-type]
            if role is None:
                raise NotImplementedError(
                    f"distribution of {name}: {dist!r} needs a 2-D grid, which the JAX backend "
                    "does not run yet; use Slab.X, Slab.Y or Replicated()"
                )
            roles[operand] = role
        return roles

    def _distributions(
        self, operands: Operands
    ) -> tuple[tuple[Distribution, Distribution, Distribution], bool]:
        """The given triple, or (one process, none given) the modelled cheapest:
        jax.Arrays keep the 1-D layout their sharding expresses."""
        if self.spec.distributions is not None:
            return self.spec.distributions, False
        options = (Slab.X, Slab.Y, Replicated())
        fixed = [_infer_distribution(operands.a, self.devices), _infer_distribution(operands.b, self.devices)]
        best: tuple[float, tuple[Distribution, Distribution, Distribution]] | None = None
        for da, db, dd in itertools.product(
            [fixed[0]] if fixed[0] else options, [fixed[1]] if fixed[1] else options, options
        ):
            roles = self._roles((da, db, dd))
            plan = _plan.plans(self.problem, roles, self.model)[0]
            placement = sum(
                self.model.beta * self.problem.elements(op) * self.problem.itemsize / (1 if r == "R" else self.nranks)
                for op, r, given in (("a", roles["a"], fixed[0]), ("b", roles["b"], fixed[1]))
                if given is None
            )
            cost = plan.time + placement
            if best is None or cost < best[0]:
                best = (cost, (da, db, dd))
        assert best is not None
        return best[1], True

    # -- shardings -------------------------------------------------------------
    def sharding(self, operand: str, role: _plan.Role) -> NamedSharding:
        return NamedSharding(self.mesh, _layout.spec(self.layouts.split_axis(operand, role)))

    def _core(self) -> Any:
        """``(a, b, c, bias) -> d`` on padded global arrays in the given layouts."""
        lay, kern, ep = self.layouts, self.plan.kernel, self.epilogue
        roles = lay.roles
        fused = kern.d == roles["d"]
        body = _kernels.body(self.local, ep if fused else None)
        wsc = jax.lax.with_sharding_constraint

        def core(a: jax.Array, b: jax.Array, c: jax.Array | None, bias: jax.Array | None) -> jax.Array:
            a = wsc(a, self.sharding("a", kern.a))
            b = wsc(b, self.sharding("b", kern.b))
            args = [a, b]
            specs = [self.sharding("a", kern.a).spec, self.sharding("b", kern.b).spec]
            if fused and ep.use_c:
                args.append(c)
                specs.append(self.sharding("d", kern.d).spec)
            if fused and ep.has_bias:
                args.append(bias)
                specs.append(PartitionSpec())
            d = jax.shard_map(
                body, mesh=self.mesh, in_specs=tuple(specs), out_specs=self.sharding("d", kern.d).spec
            )(*args)
            if not fused:
                d = wsc(d, self.sharding("d", roles["d"]))
                d = _kernels.finish(ep, d, c, bias)
            return d

        return core

    def _padded_bias(self, bias: Any) -> Any:
        m = self.layouts.maps["M"]
        bias = bias.reshape(-1)
        if m.identity:
            return bias
        if isinstance(bias, np.ndarray):
            out = np.zeros(m.padded_size, bias.dtype)
            out[m.positions] = bias
            return out
        return jnp.zeros(m.padded_size, bias.dtype).at[jnp.asarray(m.positions)].set(bias)

    def _function(self, kind: str) -> Any:
        """The jitted function for host ("numpy") or device ("jax") operands."""
        if kind in self._compiled:
            return self._compiled[kind]
        core, lay = self._core(), self.layouts
        d_role = lay.roles["d"]
        if kind == "numpy":
            fn = jax.jit(core, out_shardings=self.sharding("d", d_role))
        else:
            even = all(m.identity for m in lay.dim_maps("d"))
            out = self.sharding("d", d_role) if even else NamedSharding(self.mesh, PartitionSpec())

            def device(a: jax.Array, b: jax.Array, c: jax.Array | None, bias: jax.Array | None) -> jax.Array:
                a = jax.lax.with_sharding_constraint(_layout.pad(a, lay.dim_maps("a")), self.sharding("a", lay.roles["a"]))
                b = jax.lax.with_sharding_constraint(_layout.pad(b, lay.dim_maps("b")), self.sharding("b", lay.roles["b"]))
                if c is not None:
                    c = jax.lax.with_sharding_constraint(_layout.pad(c, lay.dim_maps("d")), self.sharding("d", d_role))
                if bias is not None:
                    bias = self._padded_bias(bias)
                return _layout.unpad(core(a, b, c, bias), lay.dim_maps("d"))

            fn = jax.jit(device, out_shardings=out)
        self._compiled[kind] = fn
        return fn

    # -- execution ---------------------------------------------------------------
    def _device_operand(self, x: Any, operand: str) -> jax.Array:
        """A jax.Array operand on this plan's devices (moved there only if it
        lives on other devices; an operand already laid out is used as it is)."""
        x = jnp.asarray(x)
        if isinstance(x, jax.core.Tracer) or x.sharding.device_set == set(self.devices):
            return x
        lay = self.layouts
        even = operand != "bias" and all(m.identity for m in lay.dim_maps(operand))
        target = self.sharding(operand, lay.roles[operand]) if even else NamedSharding(self.mesh, PartitionSpec())
        return jax.device_put(x, target)

    def execute(self, operands: Operands) -> Any:
        spec, lay = self.spec, self.layouts
        c = operands.c if spec.use_c else None
        bias = operands.bias if spec.has_bias else None
        with _x64(spec.dtype):
            if spec.spmd:
                return self._execute_local_blocks(operands, c, bias)
            if operands.family == "numpy":
                fn = self._function("numpy")
                a = _layout.host_to_device(operands.a, lay.dim_maps("a"), self.sharding("a", lay.roles["a"]))
                b = _layout.host_to_device(operands.b, lay.dim_maps("b"), self.sharding("b", lay.roles["b"]))
                if c is not None:
                    c = _layout.host_to_device(c, lay.dim_maps("d"), self.sharding("d", lay.roles["d"]))
                if bias is not None:
                    bias = jax.device_put(self._padded_bias(np.asarray(bias)), NamedSharding(self.mesh, PartitionSpec()))
                return _layout.device_to_host(fn(a, b, c, bias), lay.dim_maps("d"))
            fn = self._function("jax")
            a = self._device_operand(operands.a, "a")
            b = self._device_operand(operands.b, "b")
            c = None if c is None else self._device_operand(c, "d")
            bias = None if bias is None else self._device_operand(bias, "bias")
            return fn(a, b, c, bias)

    def _execute_local_blocks(self, operands: Operands, c: Any, bias: Any) -> Any:
        """Several processes: this rank's blocks in, this rank's result block out."""
        lay = self.layouts
        rank = self.devices.index(_layout.my_device(self.devices))

        def place(x: Any, operand: str) -> jax.Array:
            return _layout.local_to_global(
                np.asarray(x), lay.dim_maps(operand), lay.split_axis(operand, lay.roles[operand]),
                self.sharding(operand, lay.roles[operand]),
            )

        a, b = place(operands.a, "a"), place(operands.b, "b")
        c = None if c is None else place(c, "d")
        if bias is not None:
            bias = _layout.replicated(self._padded_bias(np.asarray(bias)), NamedSharding(self.mesh, PartitionSpec()))
        d = self._function("numpy")(a, b, c, bias)
        d_dist = self.distributions[2]
        local_shape = d_dist.shape(rank, (self.spec.m, self.spec.n), self.nranks)
        block = _layout.global_to_local(d, lay.dim_maps("d"), lay.split_axis("d", lay.roles["d"]), local_shape)
        if operands.family == "jax":
            return block
        return np.asarray(block)

    # -- reporting ------------------------------------------------------------------
    def explain(self) -> list[str]:
        spec, lay, plan, pr = self.spec, self.layouts, self.plan, self.problem
        names = {"M": "M", "K": "K", "N": "N", "R": "nothing (replicated)"}
        dists = self.distributions
        lines = [
            f"devices:    {self.nranks} x {self.devices[0].platform} (1-D mesh axis '{_layout.AXIS}')",
            "distributions" + (" (chosen by the cost model):" if self.chosen_by_model else ":"),
        ]
        for op, name, d in zip(("a", "b", "d"), ("a", "b", "result"), dists):
            lines.append(f"  {name:7s} {d!r:16s} splits {names[lay.roles[op]]}")
        kern = plan.kernel
        what = {
            "local": "local GEMM, no communication",
            "allgather": f"ring AllGather+GEMM: {kern.moving} travels {self.nranks - 1} ppermute steps",
            "reduce_scatter": f"ring GEMM+ReduceScatter: partial sums travel {self.nranks - 1} ppermute steps",
            "allreduce": "GEMM + psum (AllReduce)",
        }[kern.algorithm]
        lines.append(f"kernel:     {what}; roles a:{kern.a} b:{kern.b} result:{kern.d}")
        for mv in plan.moves:
            lines.append(f"moves:      {mv.describe()}")
        padded = [f"{d} {m.size}->{m.padded_size}" for d, m in lay.maps.items() if not m.identity]
        if padded:
            lines.append(f"padding:    {', '.join(padded)} (uneven over {self.nranks} ranks)")
        lb = _cost.lower_bound_words(pr.m, pr.n, pr.k, pr.p) * pr.itemsize
        ratio = f"{plan.nbytes / lb:.2f}x the bound" if lb > 0 else "bound is 0"
        lines += [
            f"modelled:   {_plan._fmt_bytes(plan.nbytes)} received per rank in {plan.messages:.0f} messages, "
            f"{plan.flops / 1e9:.3g} GFLOP per rank",
            f"lower bound: {_plan._fmt_bytes(lb)} per rank (memory-independent); {ratio}",
            f"predicted:  {plan.time * 1e3:.3g} ms ({self.model.source} {self.devices[0].platform} model)",
        ]
        return lines

    def free(self) -> None:
        """Nothing to release: compiled functions live in the backend's plan cache."""


class JaxBackend:
    """Plans are cached per (Spec, layouts of the jax.Array operands): repeated
    ``dm.matmul`` calls on the same problem compile once."""

    name = "jax"
    cache_size = 128

    def __init__(self) -> None:
        self._plans: dict[Any, JaxPlan] = {}

    def plan(self, spec: Spec, operands: Operands) -> JaxPlan:
        key: Any = spec
        if spec.distributions is None and spec.family == "jax":
            devices = _layout.resolve_devices(spec.devices)
            key = (spec, _infer_distribution(operands.a, devices), _infer_distribution(operands.b, devices))
        plan = self._plans.get(key)
        if plan is None:
            plan = JaxPlan(spec, operands)
            if len(self._plans) >= self.cache_size:
                self._plans.pop(next(iter(self._plans)))
            self._plans[key] = plan
        return plan
