"""Argument checking shared by the process grid and the distributions: ints,
pairs, names, arrays (errors name the argument, what was expected and what was
given)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ._errors import DistributionError

#: the most ranks a distribution spans: MPI numbers ranks with a C int
MAX_RANKS = 2**31 - 1


def as_int(value: Any, what: str, *, minimum: int, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what} must be an int, got {value!r} ({type(value).__name__})")
    value = int(value)
    if value < minimum:
        raise DistributionError(f"{what} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise DistributionError(f"{what} must be <= {maximum} (MPI numbers ranks with a C int), got {value}")
    return value


def as_pair(value: Any, what: str, *, minimum: int) -> tuple[int, int]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) != 2:
        raise TypeError(f"{what} must be a pair of ints, got {value!r}")
    return (
        as_int(value[0], f"{what}[0]", minimum=minimum),
        as_int(value[1], f"{what}[1]", minimum=minimum),
    )


def one_of(value: Any, names: Sequence[str | None]) -> bool:
    """Whether ``value`` is one of ``names`` (strings, and None where None is
    one): only a string can equal a name, so any other value (a numpy array,
    whose ``==`` is elementwise; bytes; a list) is simply not one of them.

    >>> one_of("row", ("row", "col")), one_of(np.array(["row", "col"]), ("row", "col")), one_of(None, (None, "x"))
    (True, False, True)
    """
    if value is None:
        return None in names
    return isinstance(value, str) and value in names


def to_numpy(x: Any, name: str) -> np.ndarray:
    """``np.asarray(x)``; numpy's error on what is no array (a ragged list) named for ``name``."""
    try:
        return np.asarray(x)
    except (ValueError, TypeError) as e:
        raise type(e)(f"{name} cannot be read as an array ({type(x).__name__}): {e}") from e
