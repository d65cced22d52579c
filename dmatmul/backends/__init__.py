"""Backends behind :func:`dmatmul.matmul`: one small protocol, a lazy registry.

A backend module is imported only when a product asks for it, so ``import
dmatmul`` never imports JAX, nvmath-python or CuPy.

The protocol (see :class:`Backend` and :class:`BackendPlan`): a backend turns
a validated :class:`dmatmul._matmul.Spec` plus the operands into a plan, and
a plan executes on operands of the same shapes, dtypes and families.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .._matmul import Operands, Spec

__all__ = ["Backend", "BackendPlan", "BACKENDS", "get", "resolve", "probe"]


class BackendPlan(Protocol):
    """A planned product: what :class:`dmatmul.Matmul` holds."""

    algorithm: str

    def execute(self, operands: Operands) -> Any: ...

    def explain(self) -> list[str]: ...

    def free(self) -> None: ...


class Backend(Protocol):
    name: str

    def plan(self, spec: Spec, operands: Operands) -> BackendPlan: ...

    def ranks(self, spec: Spec) -> int: ...  # how many ranks a product of ``spec`` spans


#: name -> (module, the extra that installs it)
BACKENDS: dict[str, tuple[str, str]] = {
    "jax": ("dmatmul.backends.jax", "jax"),
    "nvmath": ("dmatmul.backends.nvmath", "nvmath"),
}

_loaded: dict[str, Backend] = {}


def probe(name: str) -> str | None:
    """Why backend ``name`` cannot run here, or None when it can.

    Cheap for a missing package (no import is attempted); the backend module's
    own ``unavailable()`` does the deeper checks (a CUDA device, libraries).
    """
    module, extra = BACKENDS[name]
    needed = {"jax": ("jax",), "nvmath": ("nvmath", "cupy")}[name]
    missing = [pkg for pkg in needed if importlib.util.find_spec(pkg) is None]
    if missing:
        return f"{' and '.join(missing)} not installed: pip install 'dmatmul[{extra}]'"
    if importlib.util.find_spec(module) is None:
        return f"the {name} backend is not part of this dmatmul version"
    reason: str | None = importlib.import_module(module).unavailable()
    return reason


def get(name: str) -> Backend:
    """The backend ``name``, imported on first use; raises if it cannot run."""
    if name not in _loaded:
        reason = probe(name)
        if reason is not None:
            raise RuntimeError(f"backend={name!r} is not available: {reason}")
        _loaded[name] = importlib.import_module(BACKENDS[name][0]).BACKEND
    return _loaded[name]


def resolve(name: str, spec: Spec | None = None) -> Backend:
    """``"auto"``: nvmath where it can run (nvmath-python, CUDA GPU, cuBLASMp), else jax.

    nvmath runs one rank per process, so a one-process product asked to span
    several devices (``devices=N``, N > 1) goes to jax.
    """
    if name != "auto":
        return get(name)
    several_devices = spec is not None and not spec.spmd and spec.devices not in (None, 1)
    if not several_devices and probe("nvmath") is None:
        return get("nvmath")
    return get("jax")
