"""``dm.matmul``'s shortcut for a call like a recent one (:class:`Recent`):
one process, operands a backend's array kind keys, the options of a call
that passed its checks; asked at every ``dm.matmul``, so written for speed."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

from . import _runtime
from ._plans import PLANS
from ._sharded import Sharded
from ._spec import KINDS, Operands

__all__ = ["RECENT", "Recent"]


class Recent:
    """dm.matmul's shortcut for a call like a recent one: a call, in one
    process, of arrays a backend's kind keys (:meth:`ArrayKind.recent_key`:
    jax.Arrays outside any trace, by shape, dtype, sharding, committedness,
    ``jax.set_mesh``'s mesh and x64) whose key and options (type and value)
    are those of one that passed the checks runs that call's plan again
    without them, through the runner its ``repeat`` made (the JAX plan still
    refuses deleted operands and traces, and then the full call raises what
    it must). The runners live in the plan cache with their plan
    (:meth:`dmatmul._plans.Plans.runner`): a plan that leaves takes them
    along. A plan of no ``repeat`` keeps none; neither do calls of numpy
    operands, whose checks read their memory (byte order, strides)."""

    def key(self, a: Any, b: Any, c: Any, options: Mapping[str, Any]) -> Hashable | None:
        """The call's key, or None where it is not one to keep."""
        if _runtime.launched_size() > 1 or _runtime.active() is not None:
            return None
        xs = (a, b, c, options.get("bias"))
        for held in KINDS:  # (none keys numpy operands, whose checks read their memory)
            arrays = held.recent_key(xs)
            if arrays is not None:
                break
        else:
            return None
        values = tuple(options.values())
        types = tuple(map(type, values))  # (1.0 and 1+0j differ: a real product refuses the second)
        if "bias" in options or list in types or tuple in types or Sharded in types:
            opts: Hashable = tuple(sorted((k, _typed(v)) for k, v in options.items() if k != "bias"))
        else:  # the common case, built fast (keywords in another order make another key, as good)
            opts = (tuple(options), values, types)
        try:
            return _Key((arrays, opts))
        except TypeError:  # an unhashable option (an array as alpha, say): the full call judges it
            return None

    def run(self, key: Hashable, operands: Operands) -> Any:
        """The product by the runner kept for ``key``; None where there is none or it may not run."""
        run = PLANS.runner(key)
        return None if run is None else run(operands)

    def keep(self, key: Hashable, plan: Any, operands: Operands) -> None:
        """Keep ``plan``'s runner for operands laid out as ``operands`` (those of the call that made ``key``)."""
        run = plan.repeat(operands)
        if run is not None:
            PLANS.keep_runner(key, plan, run)


class _Key:
    """A recent call's key, hashed once: the cache's lookup and its move to the end hash it again,
    and the shardings in it hash in Python."""

    __slots__ = ("value", "_hash")

    def __init__(self, value: tuple[Any, ...]) -> None:
        self.value = value
        self._hash = hash(value)  # (TypeError where an option is unhashable)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Key) and self._hash == other._hash and self.value == other.value


def _typed(v: Any) -> Any:
    """An option as a key: its type with its value (1.0 and 1+0j differ: a real product refuses the
    second), sequences as tuples, a Sharded by its mesh and spec."""
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, tuple(_typed(x) for x in v))
    if isinstance(v, Sharded):  # (it equals its 2-D form on any mesh size; a call on another is refused)
        return (Sharded, v.mesh, v.spec)
    return (type(v), v)


RECENT = Recent()
