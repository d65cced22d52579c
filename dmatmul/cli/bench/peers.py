"""What a bench group times, built alike in one process and under mpiexec.

dmatmul's entries (``auto`` and each named algorithm that fits the layout,
with the cost model's facts about its plan, read through the backend
protocol: ``plan_of(mm).cost`` and ``.sharding(op)`` where the plan has it)
and the peers: ``xla`` (``jax.jit(jnp.dot)`` at the same precision on the
same shardings), ``xla-1dev`` (the same on one device) and
``numpy`` (its GEMM of the whole problem).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from ... import _cost
from ..._spec import ALGORITHMS, AlgorithmName, PrecisionName

PEERS = ("xla", "xla-1dev", "numpy")


def partition_spec(dist: Any, two_d: bool = False) -> Any:
    """PartitionSpec of a distribution on the 1-D mesh ("x",) or the 2-D mesh ("r", "c")."""
    from jax.sharding import PartitionSpec

    from ..._distribution import BlockNonCyclic, Replicated

    if isinstance(dist, Replicated):
        return PartitionSpec()
    if isinstance(dist, BlockNonCyclic):
        return PartitionSpec("r", "c")
    axis: Any = ("r", "c") if two_d else "x"
    return PartitionSpec(axis, None) if dist.dim == 0 else PartitionSpec(None, axis)


def make_mesh(devices: Sequence[Any], grid: tuple[int, int] | None = None) -> Any:
    from jax.sharding import AxisType, Mesh

    if grid is not None:
        arr = np.array(list(devices), dtype=object).reshape(grid)
        return Mesh(arr, ("r", "c"), axis_types=(AxisType.Auto, AxisType.Auto))
    return Mesh(np.array(list(devices), dtype=object), ("x",), axis_types=(AxisType.Auto,))


def shardings(dists: Sequence[Any], devices: Sequence[Any], mm: Any = None) -> dict[str, Any]:
    """The NamedSharding of "a", "b" and "d": the plan's own where the backend
    exposes it (``mm``: a planned Matmul), else built from the distributions
    (1-D mesh "x", or a 2-D mesh ("r", "c") when one is on a grid)."""
    if mm is not None:
        from ..._matmul import plan_of

        plan = plan_of(mm)
        if hasattr(plan, "sharding"):  # the JAX backend's plans say where each operand lives
            return {op: plan.sharding(op) for op in "abd"}
    import jax

    grids = [d.grid.shape for d in dists if getattr(d, "grid", None) is not None and d.grid.ndim == 2]
    mesh = make_mesh(devices, grids[0] if grids else None)
    return {op: jax.sharding.NamedSharding(mesh, partition_spec(d, bool(grids))) for op, d in zip("abd", dists)}


def precision(dtype: str) -> PrecisionName | None:
    """The ``precision=`` every contender runs with, dmatmul's and XLA's alike:
    full precision for float32 and float64 (``None``, the framework's default,
    may mean TF32 on a GPU), the default for the half precisions (accumulated
    in float32 either way)."""
    return "highest" if dtype in ("float32", "float64") else None


def xla_dot(dtype: str) -> Callable[[Any, Any], Any]:
    """``jnp.dot`` as the bench runs dmatmul: at :func:`precision`, half
    precisions accumulated in float32 and rounded once."""
    import jax
    import jax.numpy as jnp

    prec = None if precision(dtype) is None else jax.lax.Precision.HIGHEST
    if dtype in ("bfloat16", "float16"):
        return lambda x, y: jnp.dot(x, y, precision=prec, preferred_element_type=jnp.float32).astype(x.dtype)
    return lambda x, y: jnp.dot(x, y, precision=prec)


def plan_facts(mm: Any, n: int, p: int, itemsize: int, platform_name: str) -> dict[str, Any]:
    """Prediction and modelled traffic of a planned Matmul, from its plan's
    ``cost`` (the backend protocol: a :class:`dmatmul._plan.Plan`, or None
    where the backend models none)."""
    from ..._matmul import plan_of

    facts: dict[str, Any] = {"algorithm": mm.algorithm}
    cost = plan_of(mm).cost
    lb = _cost.lower_bounds(n, n, n, p, itemsize)
    facts["lower_bound_bytes"] = lb["memory_independent"]
    facts["regime"] = lb["regime"]
    if cost is not None:
        facts["predicted_s"] = float(cost.time)  # the plan's own model (the platform's, for its rank count)
        facts["modelled_bytes"] = float(cost.nbytes)
        facts["messages"] = float(cost.messages)
    return facts


def memory_facts(mm: Any) -> dict[str, Any]:
    """Peak bytes per rank of a planned Matmul's compiled program (XLA's memory
    analysis: arguments + outputs + temporaries - aliased) and the ideal (this
    rank's blocks of a, b and the result plus one buffer of what travels), where
    the backend's plan reports them (``compiled_memory``, ``ideal_memory_bytes``:
    the JAX backend)."""
    from ..._matmul import plan_of

    plan = plan_of(mm)
    compiled, ideal = getattr(plan, "compiled_memory", None), getattr(plan, "ideal_memory_bytes", None)
    if compiled is None or ideal is None:
        return {}
    return {"peak_bytes": compiled()["peak"], "ideal_bytes": ideal()}


def compiled_peak_bytes(fn: Any, *args: Any) -> float:
    """Peak bytes per device of a jitted function on ``args`` (XLA's memory
    analysis: arguments + outputs + temporaries - aliased)."""
    stats = fn.lower(*args).compile().memory_analysis()
    return float(
        stats.argument_size_in_bytes + stats.output_size_in_bytes + stats.temp_size_in_bytes
        - stats.alias_size_in_bytes
    )


def named_algorithms(args: argparse.Namespace) -> list[AlgorithmName]:
    """``--algorithms`` (checked by its argparse type), or auto and every named algorithm."""
    if args.algorithms is not None:
        return cast("list[AlgorithmName]", list(args.algorithms))
    return cast("list[AlgorithmName]", ["auto", *ALGORITHMS])


def dmatmul_plans(a: Any, b: Any, dists: Sequence[Any], args: argparse.Namespace, **where: Any) -> dict[str, Any]:
    """A planned :class:`dmatmul.Matmul` (JAX backend) of ``a @ b`` for each
    of :func:`named_algorithms` that fits the layout, by algorithm, at the XLA
    peer's :func:`precision`; ``where``: more keywords of ``Matmul``
    (``devices=p`` in one process)."""
    import dmatmul as dm

    plans: dict[str, Any] = {}
    for algorithm in named_algorithms(args):
        try:
            mm = dm.Matmul(a, b, distribution=dists, backend="jax", algorithm=algorithm,
                           precision=precision(args.dtype), **where)
            mm.plan()
        except (ValueError, NotImplementedError):
            continue  # does not fit this layout
        plans[algorithm] = mm
    return plans
