"""Backends behind :func:`dmatmul.matmul`: one protocol, one table, lazy loading.

A backend is one package under ``dmatmul/backends/`` that exposes
``BACKEND`` (an object of the :class:`Backend` protocol),
``unavailable()`` (why it cannot run here, or None) and optionally
``details()`` (lines for ``dmatmul info``) and ``node_view()`` with
``passed_over(runtime)`` (see :func:`passed_over`), plus one row of
:data:`TABLE` and one extra in ``pyproject.toml``. The front end talks to
backends only through this module; backends import only the shared
vocabulary (:mod:`dmatmul._spec`, :mod:`dmatmul._plan`, ...), never the front
end's implementation or each other's private modules.

A backend module is imported only when a product asks for it, so ``import
dmatmul`` never imports JAX, nvmath-python or CuPy.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import sys
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any

from .. import _spec, _world

if TYPE_CHECKING:
    from .._cost import MachineModel
    from .._plan import Kernel, Plan, Problem1D
    from .._problem import Spec
    from .._spec import Operands
    from .._world import Runtime

__all__ = [
    "Backend", "BackendPlan", "BackendInfo", "TABLE", "NAMES", "get", "resolve", "probe", "info", "details", "loaded",
    "for_redistribute", "passed_over", "node_view",
]


class BackendPlan:
    """A planned product: what :class:`dmatmul.Matmul` holds. A backend's plan
    derives from it; every member the front end calls has a default here, so
    none is looked for.

    ``algorithm`` is one of :data:`dmatmul.ALGORITHMS`; ``cost`` the planner's
    :class:`dmatmul._plan.Plan` (modelled bytes, messages, flops, time) or
    None where the backend plans no communication of its own; ``explain()``
    the lines :meth:`dmatmul.Matmul.explain` prints after its header.
    ``repeat(operands)``: a runner that computes the product, in one process,
    of operands laid out as ``operands`` without the front end's checks (they
    passed for these operands, or for a call of the same shapes, dtypes,
    placements and options: :meth:`dmatmul.Matmul.execute`,
    :func:`dmatmul.matmul`), or None where it may not (the default: every
    call is checked; docs/architecture.md).
    """

    algorithm: str = "local"

    @property
    def cost(self) -> Plan | None:
        return None

    def execute(self, operands: Operands) -> Any:
        raise NotImplementedError

    def explain(self) -> list[str]:
        return []

    def free(self) -> None:
        """Release what the plan holds (nothing, by default)."""

    def repeat(self, operands: Operands) -> Callable[[Operands], Any] | None:
        return None


class Backend:
    """What a backend provides. A backend derives from it; every member the
    front end calls has a default here (so none is looked for), but
    ``plan`` and ``ranks``, which each backend says.

    * ``plan(spec, operands)``: a :class:`BackendPlan` for a validated
      product, made anew: the front end's one plan cache
      (:mod:`dmatmul._plans`) keeps it under ``key(spec, operands)``, what the
      plan depends on (default: the spec), checked at every call (the JAX
      backend refuses a product inside ``shard_map`` there), and holds at
      most ``cache_size`` of the backend's plans. Where plans are collective
      (``plans_collectively``), every rank's key is gathered at each lookup
      and handed to ``agree_keys(keys, rank)``, which raises where the ranks'
      keys cannot make one plan (default: any keys can).
    * ``ranks(spec, operands)``: how many ranks a product of ``spec`` on
      ``operands`` spans here (raising where the backend refuses the operands'
      own layouts, as ``plan`` would: an empty product asks only this).
    * ``start(runtime)``: bring the backend's own process group up under a
      multi-process launch (called once, before its first product); returns
      the runtime, with this process's device filled in where it has one
      (default: the runtime as it is). ``stop()`` undoes what ``start`` did
      (:func:`dmatmul.finalize`).
    * ``redistribute(...)`` (only backends whose row says ``redistributes``):
      a matrix from one distribution to another, for :func:`dmatmul.redistribute`.
    * ``place(result, spec, operands)``: where the result of an empty product
      (K, M or N = 0: computed without the backend) goes, in one process (the
      JAX backend: a jax.Array on the user's mesh; default: as it is).
    * ``lay_out(d, dist, operands)``: in one process, a result re-laid from a
      2-D layout into the :class:`~dmatmul.Sharded` ``dist`` it was asked in
      (:mod:`dmatmul._relay`; the JAX backend: that NamedSharding where the
      splits are even, on the operands' mesh where they are on one; default:
      as it is).
    * ``planner(spec, operands, nranks)``: the sizes, machine model and
      kernels (None: every registered one) its planner costs a product of
      ``spec`` on ``nranks`` ranks with, for a planner outside it (the
      re-lay's choice of layouts, :mod:`dmatmul._relay_choice`); pure, nothing
      compiled. Default: the spec's sizes on the default CPU model.
    * ``fits(spec, operands)``: raise what :meth:`plan` raises when
      ``spec``'s named algorithm does not fit its distributions (asked for
      an empty product, which is never planned, with its sizes made 1;
      default: nothing to refuse).
    * ``refuses(spec, nranks)``: why it cannot run ``spec``'s product (A and
      B read) on its layouts as given on ``nranks`` ranks, where its library
      cannot take them (a limit of the library, not of the contract: the
      front end then re-lays the operands into layouts it takes,
      :mod:`dmatmul._relay`), else None; raises what :meth:`plan` raises for
      anything else it refuses. Pure, the same on every rank (default: takes
      every layout).
    * ``memory(spec, operands)``: what the product takes, as
      :class:`dmatmul._memory.Need` per place, and a probe per place other
      than the host of what it has free; pure (nothing allocated, nothing
      compiled): the front end judges it before the plan is made to run.
      Default: the result (this rank's block of it) on the host.
    * ``plans_collectively`` and ``preview(spec, operands)``: where making a
      plan runs collectives under several processes (nvmath's), the
      algorithm and ``explain()`` lines of the plan :meth:`plan` would make,
      told from this rank alone, with no collective: ``Matmul.algorithm`` and
      ``explain()`` before the plan is made, which one rank may ask alone
      (default: no collective in a plan, so the plan itself tells).
    """

    name: str = ""
    plans_collectively: bool = False
    cache_size: int = 64
    #: whether it takes FP8 a and b with their MXFP8 block scales (nvmath: cuBLASMp's own MXFP8 path, where the
    #: plan qualifies); else the front end hands it the dequantized float32 operands (dmatmul._mxfp8)
    takes_block_scales: bool = False

    def plan(self, spec: Spec, operands: Operands) -> BackendPlan:
        raise NotImplementedError

    def key(self, spec: Spec, operands: Operands) -> Hashable:
        return spec

    def agree_keys(self, keys: tuple[Hashable, ...], rank: int) -> None:
        """Every rank's key is one plan's (by default)."""

    def ranks(self, spec: Spec, operands: Operands) -> int:
        raise NotImplementedError

    def start(self, runtime: Runtime) -> Runtime:
        return runtime

    def stop(self) -> None:
        """Nothing started, nothing to stop (by default)."""

    def place(self, result: Any, spec: Spec, operands: Operands) -> Any:
        return result

    def lay_out(self, d: Any, dist: Any, operands: Operands) -> Any:
        """One process: a result laid out as the :class:`~dmatmul.Sharded` ``dist``
        (of every dimension) says, where this backend's arrays carry a layout
        (JAX); by default as it is."""
        return d

    def planner(self, spec: Spec, operands: Operands, nranks: int) -> tuple[Problem1D, MachineModel, Sequence[Kernel] | None]:
        """The spec's sizes on the default CPU model, every kernel (by default)."""
        from .. import _cost

        return spec.sizes(nranks), _cost.model_for("cpu", nranks), None

    def fits(self, spec: Spec, operands: Operands) -> None:
        """Nothing to refuse (by default)."""

    def refuses(self, spec: Spec, nranks: int) -> str | None:
        """Every layout is taken as given (by default)."""
        return None

    def memory(self, spec: Spec, operands: Operands) -> tuple[list[Any], dict[str, Any]]:
        from .. import _memory

        rt = _world.runtime() if spec.spmd else None
        return _memory.result_on_host(spec, None if rt is None else rt.rank), {}

    def preview(self, spec: Spec, operands: Operands) -> tuple[str, list[str]]:
        plan = self.plan(spec, operands)
        return plan.algorithm, plan.explain()

    def batched(self, spec: Spec, operands: Operands) -> BackendPlan | None:
        """A plan of a batched product (``spec.batch_shape`` not empty) in one
        program of the backend's own, or None: the front end then runs one plan
        of the matrix product on each item (:mod:`dmatmul._batched`)."""
        return None

    def batches(self, spec: Spec) -> bool:
        """Whether :meth:`batched` plans ``spec`` (a batch whose A and B are read)
        in a program of its own; where not, the batch is folded into one matrix
        product or looped (:mod:`dmatmul._batched`)."""
        return False


@dataclasses.dataclass(frozen=True)
class BackendInfo:
    """One row of the backend table.

    ``packages`` are the import names checked (without importing them) before
    the module is; ``extra`` is what ``pip install 'dmatmul[<extra>]'``
    installs them with; ``one_rank_per_process``: one process drives one
    device, so a one-process product over several devices goes elsewhere;
    ``redistributes``: it implements
    ``redistribute(x, src, dst, *, shape, family, devices, rank)``;
    ``tells_node``: its module (light to import) has ``node_view()`` and
    ``passed_over(runtime)`` (see :func:`passed_over`); ``arrays``: a light
    module (it imports no array library) whose ``KIND``, a
    :class:`dmatmul._spec.ArrayKind`, tells the neutral core what it knows of
    its arrays (their family, traces, the claim on a product: :func:`resolve`).
    """

    name: str
    module: str
    extra: str
    packages: tuple[str, ...]
    summary: str
    one_rank_per_process: bool = False
    redistributes: bool = False
    tells_node: bool = False
    arrays: str | None = None


#: Every backend, in the order ``backend="auto"`` prefers them when they can
#: run (a product over several devices of one process skips the ones that run
#: one rank per process: see :func:`resolve`).
TABLE: tuple[BackendInfo, ...] = (
    BackendInfo("nvmath", "dmatmul.backends.nvmath", "nvmath", ("nvmath", "cupy"),
                "cuBLASMp through nvmath-python (NVIDIA GPUs, one rank per process)", one_rank_per_process=True,
                tells_node=True, arrays="dmatmul.backends.nvmath._arrays"),
    BackendInfo("jax", "dmatmul.backends.jax", "jax", ("jax",),
                "JAX shard_map ring kernels (CPU, GPU, TPU; one or several processes)", redistributes=True,
                arrays="dmatmul.backends.jax._arrays"),
)
_BY_NAME = {row.name: row for row in TABLE}
#: The ``backend=`` values.
NAMES: tuple[str, ...] = ("auto", *sorted(_BY_NAME))

_loaded: dict[str, Backend] = {}


def info(name: str) -> BackendInfo:
    """The table row of backend ``name``."""
    return _BY_NAME[name]


def probe(name: str) -> str | None:
    """Why backend ``name`` cannot run here, or None when it can: it cannot
    run on this machine (:func:`_unavailable`), or not on this run's ranks
    (:func:`passed_over`)."""
    reason = _unavailable(name)
    return reason if reason is not None else _passed_over(name)


def _unavailable(name: str) -> str | None:
    """Why backend ``name`` cannot run on this machine, or None.

    Cheap for a missing package (no import is attempted); the backend module's
    own ``unavailable()`` does the deeper checks (a CUDA device, libraries).
    """
    row = _BY_NAME[name]
    missing = [pkg for pkg in row.packages if not _importable(pkg)]
    if missing:
        return f"{' and '.join(missing)} not installed: pip install 'dmatmul[{row.extra}]'"
    if not _importable(row.module):
        return f"the {name} backend is not part of this dmatmul version"
    reason: str | None = importlib.import_module(row.module).unavailable()
    return reason


def passed_over(name: str) -> str | None:
    """Why backend ``name``, which can run on this machine, does not run on
    the ranks of this run (nvmath: ranks that would share a GPU), or None:
    what ``Matmul.explain()`` and ``dmatmul info`` say of a backend
    ``backend="auto"`` passed over. The same on every rank: it is told from
    what every rank said of its node when the runtime started
    (:func:`node_view`); None in one process."""
    return _passed_over(name) if _unavailable(name) is None else None


def _passed_over(name: str) -> str | None:
    rt = _world.runtime()
    if rt is None or rt.size == 1 or not rt.nodes:
        return None
    row = _BY_NAME[name]
    if not row.tells_node:
        return None
    why: str | None = importlib.import_module(row.module).passed_over(rt)
    return why


def node_view() -> tuple[tuple[str, Any], ...]:
    """What this rank tells the others of its node when the runtime starts
    (:func:`dmatmul._runtime.init`): ``(backend, view)`` for each backend whose
    row ``tells_node`` and whose packages are installed (nvmath: the GPUs
    this rank sees). Never raises: every rank must reach the allgather that
    carries it."""
    views = []
    for row in TABLE:
        try:
            if row.tells_node and all(_importable(pkg) for pkg in (*row.packages, row.module)):
                views.append((row.name, importlib.import_module(row.module).node_view()))
        except Exception:  # noqa: BLE001 - a broken install: its probe says so later, on this rank
            continue
    return tuple(views)


def _importable(name: str) -> bool:
    """Whether module ``name`` can be imported: as ``sys.modules`` has it where it
    is there (imported, put there, or None: blocked), else found on the path, which
    is searched once per process (a search stats every ``sys.path`` entry, and
    ``backend="auto"`` probes the backends before each product)."""
    if name in sys.modules:
        return sys.modules[name] is not None
    return _on_path(name)


@functools.lru_cache(maxsize=None)
def _on_path(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def details(name: str) -> list[str]:
    """What the backend's package reports about its installation (``dmatmul info``):
    its optional ``details()`` function, called without loading its libraries."""
    row = _BY_NAME[name]
    if importlib.util.find_spec(row.module) is None:
        return []
    try:
        module = importlib.import_module(row.module)
    except ImportError:
        if any(importlib.util.find_spec(pkg) is None for pkg in row.packages):
            return []  # its module needs a package that is missing: probe(name) says what to install
        raise
    report = getattr(module, "details", None)
    return list(report()) if report is not None else []


def get(name: str) -> Backend:
    """The backend ``name``, imported on first use; raises if it cannot run."""
    if name not in _loaded:
        reason = probe(name)
        if reason is not None:
            raise RuntimeError(f"backend={name!r} is not available: {reason}")
        _loaded[name] = importlib.import_module(_BY_NAME[name].module).BACKEND
    return _loaded[name]


def loaded() -> dict[str, Backend]:
    """The backends imported so far (what :func:`dmatmul.finalize` stops)."""
    return dict(_loaded)


def resolve(name: str, spec: Spec | None = None) -> Backend:
    """``"auto"``: the backend whose array kind claims the product
    (:meth:`dmatmul._spec.ArrayKind.claims`: JAX's, for a one-process product
    on jax.Arrays, inside a trace or over several devices), else the first
    backend of :data:`TABLE` that can run here.
    """
    if name != "auto":
        return get(name)
    if spec is not None:
        for row, kind in _KINDS:
            if kind.claims(spec):
                return get(row.name)  # (raises, naming what to install, where it cannot run)
    for row in TABLE:
        if probe(row.name) is None:
            return get(row.name)
    return get(TABLE[-1].name)  # the fallback: raises, naming what to install


def _register_kinds() -> list[tuple[BackendInfo, _spec.ArrayKind]]:
    """Each row's array kind (its light ``arrays`` module), in the table's order,
    also made known to the neutral core (:data:`dmatmul._spec.KINDS`)."""
    kinds = []
    for row in TABLE:
        if row.arrays is not None and _importable(row.arrays):
            kind: _spec.ArrayKind = importlib.import_module(row.arrays).KIND
            kinds.append((row, kind))
            if kind not in _spec.KINDS:
                _spec.KINDS.append(kind)
    return kinds


_KINDS = _register_kinds()


def for_redistribute() -> Any:
    """The backend :func:`dmatmul.redistribute` runs on (the first that
    redistributes and can run; an error naming the extra when none can)."""
    rows = [row for row in TABLE if row.redistributes]
    for row in rows:
        if probe(row.name) is None:
            return get(row.name)
    return get(rows[0].name)
