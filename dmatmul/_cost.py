"""The alpha-beta-gamma cost model and its calibration (and, re-exported from :mod:`dmatmul._bounds`, the communication lower bounds).

A plan's modelled time per rank is ``alpha * messages + beta * bytes +
gamma * flops``: ``alpha`` the latency of one message (s), ``beta`` the time
per byte a rank receives (s/B), ``gamma`` the time per flop of a rank's local
GEMM while every rank computes at once (s/flop). Defaults per platform live in
:data:`DEFAULT_MODELS`.

What a "message" is. A ring (AllGather+GEMM, GEMM+ReduceScatter, SUMMA, a
general redistribution) issues one point-to-point shift per step, P - 1 of
them: each is a collective call of its own (on CPU one rendezvous of all the
devices, on GPU one NCCL launch), and costs ``alpha``. A *whole* collective
(one ``all_gather``, ``psum_scatter``, ``psum`` or ``all_to_all``) is one call
however many steps its engine runs inside it (XLA on CPU: one rendezvous and
a copy; NCCL: a ring of P - 1 steps in one launch): it costs
``collective_alpha`` once, and its bytes ``collective_beta`` each (None: alpha
and beta). On CPU XLA's whole all-gathers and reduce-scatters copy more
slowly per byte than its point-to-point shifts, so a one-shot schedule wins
only while latency dominates. The calibration measures the point-to-point
terms and keeps the defaults' premium of a collective over them
(``dmatmul.cli.bench.calibration.with_default_collectives`` says why).

Calibration. ``dmatmul bench --calibrate`` measures the three constants on
this machine and writes them as JSON to :func:`calibration_path`:
``$DMATMUL_COST_MODEL`` when set, else ``$XDG_CACHE_HOME/dmatmul/cost_model.json``
(``~/.cache/dmatmul/cost_model.json``). :func:`model_for` reads that file
when it exists, so ``algorithm="auto"`` then plans with the measured machine;
``DMATMUL_COST_MODEL=default`` ignores any file and uses the defaults. The
file holds one entry per platform, and optionally per rank count
(``"cpu/8"``: simulated devices share the host's cores, so the per-rank GEMM
speed depends on how many there are)::

    {"version": 1, "models": {"cpu": {"alpha": 2e-05, "beta": 2.5e-10, "gamma": 5e-11},
                              "cpu/8": {...}}, "meta": {...}}
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import re
import socket
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from . import _world
from ._bounds import extra_memory_bytes, lower_bound_regime, lower_bound_words, lower_bounds, ring_allgather_words

__all__ = [
    "MachineModel",
    "DEFAULT_MODELS",
    "MODEL_ENV",
    "model_for",
    "calibration_path",
    "load_models",
    "save_models",
    "fit",
    "fit_terms",
    "lower_bound_words",
    "lower_bound_regime",
    "lower_bounds",
    "ring_allgather_words",
    "bidirectional_pays",
    "extra_memory_bytes",
]

MODEL_ENV = "DMATMUL_COST_MODEL"
#: ``DMATMUL_CALIBRATE=1``: measure this machine again (``dmatmul bench``, ``dmatmul plan --machine here``)
#: even where its calibration file has the constants already
CALIBRATE_ENV = "DMATMUL_CALIBRATE"
_FORMAT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class MachineModel:
    """Latency (s/message), inverse bandwidth (s/byte) and inverse speed (s/flop) per rank.

    ``mem``: a rank's inverse local memory bandwidth (s/byte), the floor under
    a GEMM that touches many bytes for its flops (a thin inner dimension: see
    :meth:`gemm`); None takes ``beta`` (simulated CPU devices, whose
    "communication" is a memory copy).
    """

    alpha: float
    beta: float
    gamma: float
    source: str = "default"
    mem: float | None = None
    #: one whole collective (see the module's docstring): its latency (s) and time per byte a rank receives in
    #: it (s/B); None: ``alpha`` and ``beta``
    collective_alpha: float | None = None
    collective_beta: float | None = None
    #: whether a ring's transfers overlap its GEMMs (GPU, TPU: XLA and cuBLASMp issue the next transfer
    #: beside the step's GEMM); on CPU XLA's collectives are synchronous, so they add up
    overlap: bool = False
    #: the time per flop a GEMM cut into steps (a ring's P calls, SUMMA's panels) takes beyond ``gamma``: on
    #: 8 simulated CPU devices a rank's GEMM in a ring's calls ran 1.24-1.56x slower than one call of the same
    #: flops; 0 where the calibration has not measured it (its micro-benchmark times the ring's calls)
    step_gamma: float = 0.0
    #: whether a link carries both directions at once, each at ``beta`` (full duplex: NVLink, ICI), so that
    #: two rings in opposite directions move twice the bytes of one (:func:`bidirectional_pays`); simulated
    #: CPU devices copy on the cores they share, and two rings' bytes add up
    duplex: bool = False

    @property
    def calpha(self) -> float:
        """The latency of one whole collective."""
        return self.alpha if self.collective_alpha is None else self.collective_alpha

    @property
    def mem_beta(self) -> float:
        """The time per byte a rank copies within its own memory: ``mem``, or ``beta`` where it is None."""
        return self.beta if self.mem is None else self.mem

    @property
    def cbeta(self) -> float:
        """The time per byte a rank receives in one whole collective."""
        return self.beta if self.collective_beta is None else self.collective_beta

    def time(self, *, messages: float, nbytes: float, flops: float, collectives: float = 0.0,
             collective_bytes: float = 0.0) -> float:
        """``alpha * messages + beta * nbytes + gamma * flops``, plus ``collectives``
        whole collectives receiving ``collective_bytes`` in all."""
        return (self.alpha * messages + self.beta * nbytes + self.gamma * flops
                + self.calpha * collectives + self.cbeta * collective_bytes)

    def ring_beta(self, p: int, *, both_ways: bool) -> float:
        """Time per byte a rank receives around a ring of ``p`` ranks: ``beta``,
        or half of it for two rings in opposite directions (``both_ways``) on
        links that carry both at once (``duplex``), where the two neighbours
        differ (``p > 2``; on two ranks one ring already uses the link both
        ways).

        >>> gpu = DEFAULT_MODELS["gpu"]
        >>> gpu.ring_beta(8, both_ways=True) / gpu.beta, gpu.ring_beta(2, both_ways=True) / gpu.beta
        (0.5, 1.0)
        >>> DEFAULT_MODELS["cpu"].ring_beta(8, both_ways=True) / DEFAULT_MODELS["cpu"].beta
        1.0
        """
        return self.beta / 2 if both_ways and self.duplex and p > 2 else self.beta

    def gemm(self, flops: float, nbytes: float) -> float:
        """One local GEMM: its flops, or the bytes it reads and writes where
        those take longer (a roofline).

        >>> m = MachineModel(alpha=0.0, beta=1e-9, gamma=1e-10)
        >>> m.gemm(1e6, 1e3), m.gemm(1e6, 1e6)  # compute-bound, then memory-bound
        (0.0001, 0.001)
        """
        return max(self.gamma * flops, self.mem_beta * nbytes)

    def to_dict(self) -> dict[str, float]:
        out: dict[str, Any] = {"alpha": self.alpha, "beta": self.beta, "gamma": self.gamma}
        for name in ("mem", "collective_alpha", "collective_beta"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.step_gamma:
            out["step_gamma"] = self.step_gamma
        for name in ("overlap", "duplex"):
            if getattr(self, name):
                out[name] = True
        return out

    def describe(self) -> str:
        """``alpha 20 us, beta 4.0 GB/s, gamma 20.0 GFLOP/s per rank (default)``."""
        bw = f"{1 / self.beta / 1e9:.3g} GB/s" if self.beta > 0 else "inf GB/s"
        speed = f"{1 / self.gamma / 1e9:.3g} GFLOP/s" if self.gamma > 0 else "inf GFLOP/s"
        coll = ""
        if self.collective_alpha is not None or self.collective_beta is not None:
            cbw = f"{1 / self.cbeta / 1e9:.3g} GB/s" if self.cbeta > 0 else "inf GB/s"
            coll = f"; one collective {self.calpha * 1e6:.3g} us + {cbw}"
        if self.step_gamma and self.gamma:
            coll += f"; a GEMM cut into steps {self.step_gamma / self.gamma:+.0%} per flop"
        return f"alpha {self.alpha * 1e6:.3g} us, beta {bw}, gamma {speed} per rank{coll} ({self.source})"


#: Defaults per JAX platform / backend. "cpu" is this project's reference
#: machine: simulated devices sharing 2 cores, where "communication" is a
#: memory copy (a few GB/s) and a rank's GEMM gets a share of ~150 GFLOP/s.
#: ``"cpu/<P>"``: the same machine calibrated by ``dmatmul bench --calibrate``
#: for P simulated devices (they share the 2 cores, so a rank's GEMM speed
#: falls as P grows); used when a caller passes ``nranks``.
#: A whole collective on CPU is one rendezvous, as one ring step is (``collective_alpha`` = ``alpha``), but
#: its bytes cost more: the gathered operand (or the whole partial product) is materialized and multiplied
#: in one GEMM that no longer fits in cache. ``collective_beta`` puts the crossover where
#: ``benchmarks/small.py`` measured it (8 devices: the one-shot schedule 1.0-3x faster up to n = 1024, the
#: ring 1.5-2.9x faster at n = 2048; 4 devices: about n = 1024). On GPU and TPU one collective is one launch
#: (NCCL runs its own steps inside), and a ring overlaps its transfers with its GEMMs.
DEFAULT_MODELS: dict[str, MachineModel] = {
    "cpu": MachineModel(alpha=2e-5, beta=1 / 4e9, gamma=1 / 20e9, collective_beta=1 / 3.2e9),
    "cpu/2": MachineModel(alpha=1e-5, beta=1 / 10e9, gamma=1 / 95e9, collective_beta=1 / 8e9),
    "cpu/4": MachineModel(alpha=5e-5, beta=1 / 8e9, gamma=1 / 44e9, collective_beta=1 / 6.4e9),
    "cpu/8": MachineModel(alpha=1.1e-4, beta=1 / 2.8e9, gamma=1 / 20e9, collective_beta=1 / 2.2e9),
    "gpu": MachineModel(alpha=1e-5, beta=1 / 100e9, gamma=1 / 300e12, mem=1 / 2e12, overlap=True, duplex=True),
    "tpu": MachineModel(alpha=1e-5, beta=1 / 100e9, gamma=1 / 300e12, mem=1 / 1e12, overlap=True, duplex=True),
}

_ALIASES = {"cuda": "gpu", "rocm": "gpu"}


def _platform(platform: str) -> str:
    return _ALIASES.get(platform, platform)


# --------------------------------------------------------------------------- #
# calibration files
# --------------------------------------------------------------------------- #
def machine_key() -> str:
    """This machine's name in its calibration file's name: the host and its core
    count (``node17-16cores``), so that a home directory shared by several
    machines holds one calibration per machine, and a machine's constants are
    never another's. Its devices' kind keys each entry inside the file
    (:func:`model_for`'s ``kind``)."""
    host = re.sub(r"[^A-Za-z0-9_.-]+", "_", socket.gethostname() or "host")
    return f"{host}-{os.cpu_count() or 1}cores"


def calibration_path() -> Path | None:
    """Where calibrated models are read and written: ``$DMATMUL_COST_MODEL``
    when set (None when it is ``default``, ``none`` or empty: defaults only),
    else this machine's file in the user cache
    (``$XDG_CACHE_HOME/dmatmul/cost_model-<machine_key()>.json``)."""
    env = os.environ.get(MODEL_ENV)
    if env is not None:
        if env.strip().lower() in ("", "default", "defaults", "none", "0"):
            return None
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "dmatmul" / f"cost_model-{machine_key()}.json"


_loaded: dict[tuple[str, float], tuple[dict[str, MachineModel], dict[str, str]]] = {}

#: the fields of one entry of a calibration file: the constants (s/message, s/byte, s/flop; None: not given)
#: and the flags (true/false)
_CONSTANTS = ("alpha", "beta", "gamma", "mem", "collective_alpha", "collective_beta", "step_gamma")
_FLAGS = ("overlap", "duplex")


def _entry(name: str, e: Any, source: str) -> MachineModel:
    """The model of entry ``name`` of a calibration file; ValueError naming
    the field, what it must be and what it is."""
    if not isinstance(e, dict):
        raise ValueError(f"models[{name!r}] must be an object of alpha, beta, gamma, ...; got {e!r}")
    unknown = sorted(set(e) - set(_CONSTANTS) - set(_FLAGS))
    if unknown:
        raise ValueError(f"models[{name!r}] has unknown field(s) {unknown}; known: {', '.join(_CONSTANTS + _FLAGS)}")
    values: dict[str, Any] = {}
    for field in _CONSTANTS:
        v = e.get(field)
        if v is None and field not in ("alpha", "beta", "gamma"):
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"models[{name!r}].{field} must be a finite number >= 0 (seconds per message, byte "
                             f"or flop), got {v!r}")
        values[field] = float(v)
    for field in _FLAGS:
        v = e.get(field, False)
        if not isinstance(v, bool):
            raise ValueError(f"models[{name!r}].{field} must be true or false, got {v!r}")
        values[field] = v
    return MachineModel(source=source, **values)


def _read(p: Path) -> tuple[dict[str, Any], dict[str, MachineModel]]:
    """The document in calibration file ``p`` and its models; ValueError
    naming the file, what is wrong, and the fixes."""
    try:
        if not p.is_file():
            raise ValueError("it is not a file")
        data = json.loads(p.read_text())
        if not isinstance(data, dict) or not isinstance(data.get("models"), dict):
            raise ValueError('expected an object {"version": 1, "models": {"cpu": {...}, ...}}')
        if data.get("version", _FORMAT_VERSION) != _FORMAT_VERSION:
            raise ValueError(f"expected version {_FORMAT_VERSION}, got {data['version']!r}")
        models = {str(name): _entry(str(name), e, f"calibrated {p}") for name, e in data["models"].items()}
    except (OSError, ValueError) as e:
        raise ValueError(
            f"cost model file {p} is not a dmatmul calibration ({e}); "
            f"rerun `dmatmul bench --calibrate`, delete the file, or set {MODEL_ENV}=default"
        ) from None
    return data, models


def load_models(path: str | os.PathLike[str] | None = None) -> dict[str, MachineModel]:
    """The calibrated models in ``path`` (default :func:`calibration_path`),
    keyed ``"cpu"``, ``"cpu/8"``, ...; ``{}`` when there is no file.

    A file that exists but cannot be read, or whose entries are not finite
    non-negative constants (a model that would plan nonsense), raises
    ValueError naming it and the field.
    """
    return _load(path)[0]


def _load(path: str | os.PathLike[str] | None = None) -> tuple[dict[str, MachineModel], dict[str, str]]:
    """:func:`load_models`, and the device kind each entry was measured on (``meta.device_kinds``)."""
    p = Path(path).expanduser() if path is not None else calibration_path()
    if p is None or not p.exists():
        return {}, {}
    key = (str(p), p.stat().st_mtime)
    if key not in _loaded:
        data, models = _read(p)
        meta: dict[str, Any] = data["meta"] if isinstance(data.get("meta"), dict) else {}
        kinds: dict[str, Any] = meta["device_kinds"] if isinstance(meta.get("device_kinds"), dict) else {}
        _loaded[key] = (models, {str(k): str(v) for k, v in kinds.items()})
    return _loaded[key]


def share_calibration(comm: Any) -> tuple[dict[str, MachineModel], dict[str, str]] | str:
    """Rank 0's calibration, broadcast on ``comm`` (every rank calls it, when
    the runtime starts): the models every rank then plans with
    (:func:`model_for`), so that ranks on machines with different files, or
    none, plan alike. A file rank 0 cannot read is its error message, raised
    on every rank where a plan asks for the model."""
    payload: Any = None
    if comm.Get_rank() == 0:
        try:
            models, kinds = _load()
            payload = ({k: m.to_dict() for k, m in models.items()}, kinds, str(calibration_path()))
        except ValueError as e:
            payload = str(e)
    payload = comm.bcast(payload, root=0)
    if isinstance(payload, str):
        return payload
    entries, kinds, where = payload
    return {k: _entry(k, e, f"calibrated {where} (rank 0's)") for k, e in entries.items()}, dict(kinds)


def _calibrated() -> tuple[Mapping[str, MachineModel], Mapping[str, str]]:
    """The calibration plans read: under a multi-process runtime rank 0's
    (:func:`share_calibration`), else this process's file."""
    shared = getattr(_world.runtime(), "cost_models", None)
    if isinstance(shared, str):
        raise ValueError(shared)
    return shared if shared is not None else _load()


def save_models(
    models: Mapping[str, MachineModel],
    path: str | os.PathLike[str] | None = None,
    *,
    meta: Mapping[str, Any] | None = None,
    merge: bool = True,
) -> Path:
    """Write ``models`` (keys ``"cpu"``, ``"cpu/8"``, ...) as a calibration file;
    with ``merge`` the entries already in the file for other keys are kept."""
    p = Path(path).expanduser() if path is not None else calibration_path()  # (~ too, as the variable's)
    if p is None:
        raise ValueError(f"{MODEL_ENV}=default: give a path to write the calibration to")
    entries: dict[str, Any] = {}
    old_meta: dict[str, Any] = {}
    if merge and p.is_file():
        try:
            old, _ = _read(p)
        except ValueError:
            pass  # a broken file is replaced, not merged: the calibration is what it says
        else:
            entries.update(old["models"])
            old_meta = dict(old["meta"]) if isinstance(old.get("meta"), dict) else {}
    entries.update({k: m.to_dict() for k, m in models.items()})
    p.parent.mkdir(parents=True, exist_ok=True)
    new_meta = {**old_meta, **dict(meta or {})}
    if isinstance(old_meta.get("device_kinds"), dict) and isinstance((meta or {}).get("device_kinds"), dict):
        new_meta["device_kinds"] = {**old_meta["device_kinds"], **dict(meta or {})["device_kinds"]}
    doc = {"version": _FORMAT_VERSION, "models": entries, "meta": new_meta}
    tmp = p.with_suffix(p.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    tmp.replace(p)
    return p


def model_for(platform: str, nranks: int | None = None, *, calibrated: bool = True,
              kind: str | None = None) -> MachineModel:
    """The model for a platform name ("cpu", "gpu"/"cuda"/"rocm", "tpu").

    A calibration (see :func:`calibration_path`; under ``mpiexec`` rank 0's,
    :func:`share_calibration`) wins over the defaults: its
    ``"<platform>/<nranks>"`` entry first, then ``"<platform>"``; then the
    defaults in the same order. ``kind``: the devices' kind (JAX's
    ``device_kind``); an entry measured on another kind is passed over.
    ``calibrated=False``: the defaults only (the same on every process,
    whatever file each one finds).
    """
    platform = _platform(platform)
    keys = ([f"{platform}/{nranks}"] if nranks is not None else []) + [platform]
    if calibrated:
        models, kinds = _calibrated()
        for key in keys:
            if key in models and (kind is None or kinds.get(key, kind) == kind):
                return models[key]
    for key in keys:
        if key in DEFAULT_MODELS:
            return DEFAULT_MODELS[key]
    return DEFAULT_MODELS["cpu"]


# --------------------------------------------------------------------------- #
# fitting
# --------------------------------------------------------------------------- #
def fit(samples: Iterable[Sequence[float]]) -> tuple[MachineModel, float]:
    """Least-squares ``alpha, beta, gamma >= 0`` from ``(messages, nbytes, flops, seconds)``.

    Residuals are relative (each sample weighted by ``1/seconds``), so a
    20 us message counts as much as a 2 s GEMM. Non-negativity is exact: the
    best of the unconstrained fits over every subset of the three constants
    whose solution is non-negative. Returns the model and the RMS relative
    residual.

    >>> m, r = fit([(1, 0, 0, 1e-5), (1, 1e6, 0, 1e-5 + 1e-3), (0, 0, 1e9, 0.05)])
    >>> round(m.alpha * 1e6, 3), round(1 / m.beta / 1e9, 3), round(1 / m.gamma / 1e9, 3)
    (10.0, 1.0, 20.0)
    """
    import numpy as np

    rows = np.asarray([tuple(s) for s in samples], dtype=float)
    if rows.ndim != 2 or rows.shape[1] != 4 or len(rows) == 0:
        raise ValueError("fit needs samples (messages, nbytes, flops, seconds)")
    (alpha, beta, gamma), res = _nonnegative_fit(rows[:, :3], rows[:, 3], "fit")
    return MachineModel(float(alpha), float(beta), float(gamma), source="fit"), res


def _nonnegative_fit(x: Any, seconds: Any, what: str) -> tuple[Any, float]:
    """Coefficients ``>= 0`` of the columns of ``x`` that best give ``seconds``,
    each row weighted by ``1/seconds`` (relative residuals), and the RMS
    relative residual: the best unconstrained fit over every subset of the
    columns whose solution is non-negative (exact non-negativity; 63 subsets for
    six constants). A column that is zero in every row gets 0."""
    import numpy as np

    x, seconds = np.asarray(x, dtype=float), np.asarray(seconds, dtype=float)
    if (seconds <= 0).any():
        raise ValueError(f"{what}: every sample needs a positive time")
    w = 1.0 / seconds
    x, y = x * w[:, None], seconds * w
    width = x.shape[1]
    live = [c for c in range(width) if x[:, c].any()]
    best: tuple[float, np.ndarray] | None = None
    for size in range(len(live), 0, -1):
        for cols in itertools.combinations(live, size):
            coef, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
            if (coef < 0).any():
                continue
            full = np.zeros(width)
            full[list(cols)] = coef
            res = float(np.sum((x @ full - y) ** 2))
            if best is None or res < best[0] - 1e-15:
                best = (res, full)
    if best is None:
        raise ValueError(f"{what}: no non-negative solution (all samples empty?)")
    return best[1], math.sqrt(best[0] / len(y))


#: the constants :func:`fit_terms` fits, as :data:`dmatmul._plan.TERMS` names the attribute that reads each, and
#: the field of :class:`MachineModel` that holds it
_TERM_FIELDS = {"alpha": "alpha", "calpha": "collective_alpha", "beta": "beta", "cbeta": "collective_beta",
                "gamma": "gamma", "mem_beta": "mem", "step_gamma": "step_gamma"}


def fit_terms(samples: Iterable[tuple[Sequence[float], float]], names: Sequence[str], base: MachineModel,
              ) -> tuple[MachineModel, float]:
    """The constants that best give measured plans' times: ``samples`` of
    ``(terms, seconds)``, ``terms`` what a plan's modelled time multiplies each
    constant named in ``names`` by (:func:`dmatmul._plan.time_terms`: messages,
    whole collectives, bytes of each kind, GEMM flops, bytes copied). The fit
    is least squares, relative, non-negative (:func:`fit`'s); a constant no
    sample exercises keeps ``base``'s value, as do ``base``'s flags. Returns the
    model and the RMS relative residual.

    >>> base = MachineModel(alpha=1e-4, beta=1e-9, gamma=1e-10)
    >>> names = ("alpha", "calpha", "beta", "cbeta", "gamma", "mem_beta")
    >>> truth = (2e-4, 5e-5, 8e-10, 1.2e-9, 5e-11, 4e-10)
    >>> terms = [(7, 0, 1e6, 0, 1e8, 2e6), (0, 1, 0, 4e6, 2e8, 0), (14, 1, 2e6, 1e6, 1e8, 1e6),
    ...          (0, 2, 0, 3e6, 4e8, 8e6), (7, 0, 3e6, 0, 3e8, 0), (21, 3, 1e6, 0, 1e8, 4e6), (0, 1, 5e5, 9e6, 6e8, 1e6)]
    >>> m, res = fit_terms([(t, sum(c * v for c, v in zip(truth, t))) for t in terms], names, base)
    >>> [round(getattr(m, f) / c, 6) for f, c in zip(names, truth)]
    [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    """
    import numpy as np

    pairs = [(tuple(t), s) for t, s in samples]
    if not pairs:
        raise ValueError("fit_terms needs samples (terms, seconds)")
    x = np.asarray([t for t, _ in pairs], dtype=float)
    if x.shape[1] != len(names) or any(n not in _TERM_FIELDS for n in names):
        raise ValueError(f"fit_terms: terms must be one number per constant of {names}, "
                         f"constants among {sorted(_TERM_FIELDS)}")
    coef, res = _nonnegative_fit(x, [s for _, s in pairs], "fit_terms")
    values: dict[str, Any] = {_TERM_FIELDS[n]: float(c) if x[:, i].any() else getattr(base, n)
                              for i, (n, c) in enumerate(zip(names, coef))}
    return dataclasses.replace(base, source="fit", **values), res


# --------------------------------------------------------------------------- #
# rings
# --------------------------------------------------------------------------- #
def bidirectional_pays(model: MachineModel, nbytes: float, p: int) -> bool:
    """Whether a ring whose steps each move a block of ``nbytes`` around ``p``
    ranks is modelled faster as two rings in opposite directions, half of each
    block each way.

    One ring: ``P - 1`` steps of one message of the whole block,
    ``(P - 1) * (alpha + beta * nbytes)``. Two rings, where a link carries both
    directions at once (``model.duplex``, :meth:`MachineModel.ring_beta`, as
    dm.matmul's planner costs its "bidirectional" schedule): each step sends two messages of
    half the block side by side, ``(P - 1) * (2 * alpha + beta * nbytes / 2)``;
    they pay once a block's bytes take longer than two latencies
    (``nbytes > 2 * alpha / beta``: 2 MB on the default GPU model). Without
    duplex links (simulated CPU devices) the halves' bytes add up and the
    second message is pure cost; on two ranks both neighbours are the same
    rank, whose link one ring already uses both ways.

    >>> gpu, tpu, cpu = (DEFAULT_MODELS[k] for k in ("gpu", "tpu", "cpu"))
    >>> bidirectional_pays(gpu, 64 << 20, 8), bidirectional_pays(tpu, 64 << 20, 4)  # 64 MiB blocks
    (True, True)
    >>> bidirectional_pays(gpu, 64 << 10, 8), bidirectional_pays(gpu, 64 << 20, 2)  # 64 KiB; two ranks
    (False, False)
    >>> bidirectional_pays(cpu, 64 << 20, 8)
    False
    """
    steps = p - 1
    one_way = model.alpha * steps + model.ring_beta(p, both_ways=False) * steps * nbytes
    both_ways = model.alpha * 2 * steps + model.ring_beta(p, both_ways=True) * steps * nbytes
    return both_ways < one_way
