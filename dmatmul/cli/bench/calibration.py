"""Calibration of the cost model, and the cost model's view of every algorithm.

``dmatmul bench --calibrate`` measures alpha (s/message, from chained ring
shifts), beta (s/byte) and gamma (s/flop per rank, from a ring's GEMMs) for
each device count, fits them (:func:`dmatmul._cost.fit`), gives a whole
collective the defaults' latency and premium per byte over a ring step
(:func:`with_default_collectives`), then times the planner's routes on a set
of products (:data:`ROUTE_SHAPES` x :data:`ROUTE_LAYOUTS`, apart from the
sweep's) and fits every constant to them (:func:`fit_routes`), and saves the
model where :func:`dmatmul._cost.model_for` finds it (``--quick``: the
micro-benchmarks alone); ``dmatmul bench --costs`` prints
the modelled bytes, messages, flops, extra memory and time of every 1-D
algorithm on its own layout, against the lower bounds.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ... import _cost
from .devices import start_jax
from .peers import make_mesh
from .timing import IdleWaiter, Runner, blocking


def calibration_samples(
    p: int,
    *,
    quick: bool = False,
    reps: int = 5,
    message_bytes: Sequence[int] | None = None,
    gemm_sizes: Sequence[int] | None = None,
    before: Callable[[], None] | None = None,
) -> list[tuple[float, float, float, float]]:
    """Measured ``(messages, nbytes, flops, seconds)`` per rank on ``p`` devices.

    * messages: a ring shift (``ppermute``) of ``B`` bytes per rank, timed as
      the difference between 2 and 10 chained shifts in one jitted call (the
      dispatch cost cancels), for several ``B``;
    * flops: every rank runs the GEMMs of a ring (``p`` products of
      ``(n/p x n) @ (n x n/p)``) at once, no communication, for several n.
    """
    jax = start_jax(p)
    import jax.numpy as jnp
    from jax import lax

    devices = jax.devices()[:p]
    mesh = make_mesh(devices)
    P = jax.sharding.PartitionSpec
    samples: list[tuple[float, float, float, float]] = []

    def med(fn: Runner) -> float:
        fn()
        fn()
        ts = []
        for _ in range(reps):
            if before:
                before()
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return float(np.median(ts))

    perm = [(i, (i - 1) % p) for i in range(p)]
    if message_bytes is None:
        message_bytes = (1 << 16, 1 << 20, 1 << 22) if quick else (1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24)
    if gemm_sizes is None:
        gemm_sizes = (512, 1024) if quick else (1024, 2048)
    for nbytes in message_bytes:
        words = nbytes // 4
        x = jax.device_put(np.ones((p, words), np.float32), jax.sharding.NamedSharding(mesh, P("x", None)))
        timed = {}
        for steps in (2, 10):

            def shifts(blk: Any, steps: int = steps) -> Any:
                for _ in range(steps):
                    blk = lax.ppermute(blk, "x", perm)
                return blk

            f = jax.jit(jax.shard_map(shifts, mesh=mesh, in_specs=P("x", None), out_specs=P("x", None)))
            timed[steps] = med(blocking(f, x))
        per = (timed[10] - timed[2]) / 8
        if per > 0:
            samples.append((1.0, float(nbytes), 0.0, per))
    prec = jax.lax.Precision.HIGHEST
    for n in gemm_sizes:
        n = max(p, n - n % p)
        blk = n // p
        a = jax.device_put(np.ones((n, n), np.float32), jax.sharding.NamedSharding(mesh, P("x", None)))
        b = jax.device_put(np.ones((n, n), np.float32), jax.sharding.NamedSharding(mesh, P()))

        def gemms(a: Any, b: Any, blk: int = blk) -> Any:
            return jnp.concatenate(
                [jnp.dot(a, b[:, j * blk : (j + 1) * blk], precision=prec) for j in range(p)], axis=1
            )

        f = jax.jit(jax.shard_map(gemms, mesh=mesh, in_specs=(P("x", None), P()), out_specs=P("x", None)))
        samples.append((0.0, 0.0, 2.0 * n**3 / p, med(blocking(f, a, b))))
    return samples


def with_default_collectives(model: _cost.MachineModel, platform: str, p: int) -> _cost.MachineModel:
    """``model`` (its alpha, beta and gamma measured) with a whole collective
    costed as the defaults cost it against a ring step: the same latency ratio
    and the same premium per byte; and the defaults' ``duplex`` (whether
    links carry both directions at once), which the calibration does not
    measure.

    The premium is not the collective's own speed: isolated all-gathers and
    reduce-scatters measure *cheaper* per byte here than ring shifts, yet the
    one-shot schedule runs 1.5-3x slower than the ring at n = 2048 on 8
    simulated devices (its gathered operand, or whole partial product, is
    materialized and multiplied out of cache). A fit of the collectives alone
    would pick the one-shot schedule at every size; the defaults' premium is
    set from where ``benchmarks/small.py`` measured the crossover.

    >>> m = _cost.MachineModel(alpha=2e-4, beta=1e-9, gamma=1e-10)
    >>> c = with_default_collectives(m, "cpu", 8)
    >>> d = _cost.DEFAULT_MODELS["cpu/8"]
    >>> round(c.cbeta / c.beta, 6) == round(d.cbeta / d.beta, 6), c.calpha == 2e-4
    (True, True)
    >>> c.duplex, with_default_collectives(m, "cuda", 8).duplex
    (False, True)
    """
    default = next(
        (_cost.DEFAULT_MODELS[k] for k in (f"{_cost._platform(platform)}/{p}", _cost._platform(platform))
         if k in _cost.DEFAULT_MODELS),
        _cost.DEFAULT_MODELS["cpu"],
    )
    return dataclasses.replace(
        model,
        collective_alpha=None if default.collective_alpha is None else model.alpha * default.calpha / default.alpha,
        collective_beta=None if default.collective_beta is None else model.beta * default.cbeta / default.beta,
        duplex=default.duplex,
    )


#: the products :func:`route_samples` times, (M, N, K) by shape family: the sweep's families
#: (:data:`.sweep.SHAPES`) at other sizes, so that the sweep measures a model fitted to other products
ROUTE_SHAPES: dict[str, tuple[int, int, int]] = {
    "square": (768, 768, 768),
    "tall": (6144, 192, 384),
    "wide": (192, 6144, 384),
    "outer": (1536, 1536, 48),
}
#: their layouts (:func:`.problem.parse_layout`): 1-D, 2-D and mixed
ROUTE_LAYOUTS = ("XYX", "YXY", "YYY", "GGG", "GXG", "XYG")


def route_samples(p: int, *, reps: int = 3, before: Callable[[], None] | None = None,
                  say: Callable[[str], None] = print, timer: Any = None) -> list[tuple[tuple[float, ...], float]]:
    """``(terms, seconds)`` of every route the sweep would time (:func:`.sweep.run_case`, the cheapest route
    of each algorithm and schedule) on the products of :data:`ROUTE_SHAPES` x :data:`ROUTE_LAYOUTS`,
    float32, on ``p`` devices: each route's :func:`dmatmul._plan.time_terms` and its median time
    (``timer``: :func:`.sweep.run_case`'s)."""
    from . import sweep

    whole = lambda x: max(p, x // p * p)  # noqa: E731
    samples: list[tuple[tuple[float, ...], float]] = []
    for family, (m, n, k) in ROUTE_SHAPES.items():
        for layout in ROUTE_LAYOUTS:
            case = sweep.Case(family, whole(m), whole(n), whole(k), layout, "float32")
            result = sweep.run_case(case, p, reps=reps, warmup=1, before=before,
                                    **({} if timer is None else {"timer": timer}))
            samples += [(r.terms, r.median) for r in result.routes if r.ok and r.terms]
            say(f"  {case.name}: {len(result.routes)} routes")
    return samples


def relative_residual(model: _cost.MachineModel, samples: Sequence[tuple[Sequence[float], float]]) -> float:
    """The RMS of ``predicted / measured - 1`` over ``samples`` of ``(terms, seconds)``.

    >>> m = _cost.MachineModel(alpha=1e-4, beta=1e-9, gamma=1e-10, mem=5e-10)
    >>> relative_residual(m, [((1, 0, 0, 0, 0, 0, 0), 2e-4)])
    0.5
    """
    from ... import _plan

    ratios = [sum(getattr(model, t) * v for t, v in zip(_plan.TERMS, terms)) / s - 1 for terms, s in samples]
    return float(np.sqrt(np.mean(np.square(ratios)))) if ratios else 0.0


def fit_routes(model: _cost.MachineModel, samples: Sequence[tuple[Sequence[float], float]],
               ) -> tuple[_cost.MachineModel, float, float]:
    """``model`` with every constant fitted to the routes' times (:func:`dmatmul._cost.fit_terms`) where that
    predicts them better than ``model`` does, else ``model``; and the RMS relative residual of each
    (:func:`relative_residual`), ``model``'s first.

    A route's time is what the planner's choice rests on: the micro-benchmarks
    leave out what a real product pays besides (an operand gathered out of
    cache, a whole collective's copy on simulated devices, the rendezvous of
    many devices sharing few cores), which the model's constants then carry.

    >>> from dmatmul import _plan
    >>> truth = _cost.MachineModel(alpha=3e-4, beta=9e-10, gamma=5e-11, mem=4e-10, collective_alpha=2e-5,
    ...                            collective_beta=1.1e-9, step_gamma=1e-11)
    >>> terms = [(7, 0, 1e6, 0, 1e8, 2e6, 1e8), (0, 1, 0, 4e6, 2e8, 0, 0), (14, 1, 2e6, 1e6, 1e8, 1e6, 1e8),
    ...          (0, 2, 0, 3e6, 4e8, 8e6, 0), (7, 0, 3e6, 0, 3e8, 0, 3e8), (21, 3, 1e6, 0, 1e8, 4e6, 0),
    ...          (0, 1, 5e5, 9e6, 6e8, 1e6, 0), (7, 0, 1e6, 0, 2e8, 0, 2e8)]
    >>> samples = [(t, sum(getattr(truth, n) * v for n, v in zip(_plan.TERMS, t))) for t in terms]
    >>> fitted, before, after = fit_routes(_cost.DEFAULT_MODELS["cpu/8"], samples)
    >>> round(fitted.alpha / truth.alpha, 6), before > 0.1, after < 1e-6
    (1.0, True, True)
    """
    from ... import _plan

    before = relative_residual(model, samples)
    if not samples:
        return model, before, before
    fitted, _ = _cost.fit_terms(samples, _plan.TERMS, model)
    after = relative_residual(fitted, samples)
    if after < before:
        return dataclasses.replace(fitted, source="calibrated"), before, after
    return model, before, before


def measure(p: int, platform_name: str, *, quick: bool, before: Callable[[], None] | None = None,
            ) -> tuple[_cost.MachineModel, float]:
    """This machine's model on ``p`` devices, fitted from :func:`calibration_samples`, and its RMS
    relative residual."""
    model, res = _cost.fit(calibration_samples(p, quick=quick, before=before))
    return with_default_collectives(dataclasses.replace(model, source="calibrated"), platform_name, p), res


def _save(models: dict[str, _cost.MachineModel], path: Any, jax: Any) -> Any:
    kind = jax.devices()[0].device_kind
    meta = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "cpus": os.cpu_count(),
        "jax": jax.__version__,
        # the device kind each entry was measured on: model_for passes over an entry of another kind
        "device_kinds": {key: kind for key in models},
    }
    return _cost.save_models(models, path, meta=meta)


@contextlib.contextmanager
def _planning_with(path: Any) -> Iterator[None]:
    """Plans read the calibration file ``path`` (``$DMATMUL_COST_MODEL``), then what they read before."""
    before = os.environ.get(_cost.MODEL_ENV)
    os.environ[_cost.MODEL_ENV] = str(path)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(_cost.MODEL_ENV, None)
        else:
            os.environ[_cost.MODEL_ENV] = before


def run_calibrate(args: argparse.Namespace) -> int:
    from ..._runtime import launched_size

    if launched_size() > 1:
        print("dmatmul bench --calibrate: run it in one process (it calibrates simulated devices)", file=sys.stderr)
        return 2
    jax = start_jax(max(args.devices))
    platform_name = jax.devices()[0].platform
    models: dict[str, _cost.MachineModel] = {}
    print(f"calibrating the alpha-beta-gamma model on {platform_name} ({os.cpu_count()} cores)")
    print(
        f"{'ranks':>5s} {'alpha (us)':>11s} {'1/beta (GB/s)':>14s} {'1/gamma (GFLOP/s/rank)':>23s} "
        f"{'rms rel res':>12s}"
    )
    for p in args.devices:
        waiter = IdleWaiter(args.wait_idle) if args.wait_idle is not None else None
        model, res = measure(p, platform_name, quick=args.quick, before=waiter)
        models[f"{platform_name}/{p}"] = model
        bw = 1 / model.beta / 1e9 if model.beta else float("inf")
        speed = 1 / model.gamma / 1e9 if model.gamma else float("inf")
        print(f"{p:5d} {model.alpha * 1e6:11.2f} {bw:14.2f} {speed:23.2f} {res:12.3f}")
    models[platform_name] = models[f"{platform_name}/{max(args.devices)}"]
    path = _save(models, args.model_out, jax)
    if not args.quick and platform_name == "cpu":  # (a model that overlaps is not linear in its constants)
        for p in (p for p in args.devices if p > 1):
            print(f"timing the planner's routes on {p} devices, to fit every constant to them:")
            waiter = IdleWaiter(args.wait_idle) if args.wait_idle is not None else None
            with _planning_with(path):  # the routes are planned with the model just measured
                routes = route_samples(p, before=waiter)
            model, before, after = fit_routes(models[f"{platform_name}/{p}"], routes)
            kept = "fitted to the routes" if model is not models[f"{platform_name}/{p}"] else "kept the micro-benchmarks'"
            print(f"{p:5d} devices, {len(routes)} routes: predicted/measured RMS deviation {before:.2f} -> "
                  f"{after:.2f} ({kept}): {model.describe()}")
            models[f"{platform_name}/{p}"] = model
        models[platform_name] = models[f"{platform_name}/{max(args.devices)}"]
        path = _save(models, args.model_out, jax)
    print(f"saved to {path}; algorithm='auto' plans with it (set {_cost.MODEL_ENV}=default to ignore it)")
    return 0


def missing_counts(counts: Sequence[int], platform_name: str, kind: str, path: Any) -> list[int]:
    """The device counts of ``counts`` that the calibration file at ``path`` has no
    entry of this device ``kind`` for (all of them with ``DMATMUL_CALIBRATE=1``,
    or where the file cannot be read: measuring replaces it)."""
    if os.environ.get(_cost.CALIBRATE_ENV, "").strip() not in ("", "0"):
        return list(counts)
    try:
        models, kinds = _cost._load(path)
    except ValueError:
        return list(counts)
    return [p for p in counts
            if f"{platform_name}/{p}" not in models or kinds.get(f"{platform_name}/{p}", kind) != kind]


def ensure_calibrated(counts: Sequence[int], say: Callable[[str], None] = print) -> None:
    """Measure this machine once (quick: a few seconds per device count) for each of ``counts``
    simulated devices its calibration file lacks, and save them there; nothing where
    ``DMATMUL_COST_MODEL=default`` (the defaults asked for) or where the file has them.
    ``DMATMUL_CALIBRATE=1`` measures again."""
    path = _cost.calibration_path()
    if path is None:
        return
    jax = start_jax(max(counts))
    platform_name, kind = jax.devices()[0].platform, jax.devices()[0].device_kind
    todo = missing_counts(counts, platform_name, kind, path)
    if not todo:
        return
    say(f"calibrating the cost model on this machine ({kind}, {os.cpu_count()} cores) for "
        f"{','.join(map(str, todo))} devices, once (saved to {path}; {_cost.CALIBRATE_ENV}=1 measures again)")
    models = {f"{platform_name}/{p}": measure(p, platform_name, quick=True)[0] for p in todo}
    _save(models, path, jax)


def format_costs(n: int, p: int, dtype: str = "float32", platform_name: str = "cpu") -> str:
    """Every 1-D algorithm (each schedule: ``allgather:one_shot``) on its own
    layout for an ``n``-cube on ``p`` ranks: bytes each rank sends and receives,
    point-to-point messages, whole collectives, flops and extra memory per
    rank, the predicted time, and the lower bounds."""
    from ... import _plan, _roles

    itemsize = 2 if dtype in ("bfloat16", "float16") else np.dtype(dtype).itemsize
    acc = 4 if itemsize == 2 else itemsize
    model = _cost.model_for(platform_name, p)
    problem = _plan.Problem1D(n, n, n, p, itemsize, acc)
    lb = _cost.lower_bounds(n, n, n, p, itemsize)
    mib = 2.0**20
    head = (
        f"{'algorithm':24s} {'a':12s} {'b':12s} {'result':12s} {'recv MiB':>9s} {'sent MiB':>9s} {'msgs':>5s} "
        f"{'colls':>5s} "
        f"{'GFLOP':>7s} {'extra MiB':>9s} {'pred ms':>8s} {'/bound':>7s}"
    )
    lines = [
        f"n={n} {dtype} on {p} ranks; model: {model.describe()}",
        f"lower bounds per rank: memory-independent {lb['memory_independent'] / mib:.2f} MiB ({lb['regime']} regime); "
        f"ring (P-1)/P*V of one operand: {lb['ring_a'] / mib:.2f} MiB",
        head,
        "-" * len(head),
    ]
    for kernel in _plan.KERNELS:
        roles = {"a": kernel.a, "b": kernel.b, "d": kernel.d}
        if "G" in roles.values():
            continue  # 2-D grid kernels: see Matmul.explain() on a grid layout
        try:
            plan = next(pl for pl in _plan.plans(problem, roles, model) if pl.kernel == kernel)
        except StopIteration:
            continue
        names = [_roles.dist_for_role(op, roles[op], False) for op in ("a", "b", "d")]
        extra = _cost.extra_memory_bytes(kernel.algorithm, n, n, n, p, itemsize, acc, moving=kernel.moving,
                                         one_shot=kernel.schedule == "one_shot")
        name = kernel.algorithm + ("" if kernel.schedule == "ring" else f":{kernel.schedule}")
        bound = f"{plan.nbytes / lb['memory_independent']:.2f}" if lb["memory_independent"] > 0 else "-"
        # every rank of a ring (or a psum) sends what it receives
        lines.append(
            f"{name:24s} {names[0]:12s} {names[1]:12s} {names[2]:12s} {plan.nbytes / mib:9.2f} "
            f"{plan.nbytes / mib:9.2f} {plan.messages:5.0f} {plan.collectives:5.0f} {plan.flops / 1e9:7.3f} {extra / mib:9.2f} "
            f"{plan.time * 1e3:8.2f} {bound:>7s}"
        )
    return "\n".join(lines) + "\n"


def run_costs(args: argparse.Namespace) -> int:
    platform_name = "cpu"
    try:
        jax = start_jax(max(args.devices))
        platform_name = jax.devices()[0].platform
    except (ImportError, SystemExit):
        pass
    for n in args.sizes:
        for p in args.devices:
            print(format_costs(n, p, args.dtype, platform_name))
    return 0
