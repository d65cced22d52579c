"""``precision=`` on the nvmath backend: nvmath's compute type, as a name.

Pure Python (no nvmath import), so the mapping is tested on CPU; the engine
turns the name into ``nvmath.distributed.linalg.ComputeType[name]`` and passes
it as ``MatmulOptions(compute_type=...)``.

The contract (section 3): ``None`` follows the framework's default -- on
nvmath, its own default compute type, which this module expresses as ``None``
(leave ``MatmulOptions.compute_type`` unset; nvmath 1.0 then picks COMPUTE_32F
for 16- and 32-bit types and COMPUTE_64F for 64-bit ones, so no TF32).
"default" is the same here. "high" allows TF32 for float32 (and the float32
parts of complex64); "highest" forbids it. Neither ever lowers the
accumulation below the nvmath default: float16/bfloat16 keep COMPUTE_32F,
float64/complex128 keep COMPUTE_64F (no emulation).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..._spec import PrecisionName, normalize_precision

__all__ = ["compute_type", "normalize_precision"]

#: dtype name -> (compute type for "high", compute type for "highest"); None/"default": nvmath's default
_COMPUTE_TYPES = {
    "float16": ("COMPUTE_32F", "COMPUTE_32F"),
    "bfloat16": ("COMPUTE_32F", "COMPUTE_32F"),
    "float32": ("COMPUTE_32F_FAST_TF32", "COMPUTE_32F"),
    "complex64": ("COMPUTE_32F_FAST_TF32", "COMPUTE_32F"),
    "float64": ("COMPUTE_64F", "COMPUTE_64F"),
    "complex128": ("COMPUTE_64F", "COMPUTE_64F"),
    # FP8: cuBLASLt's one compute type (float32 accumulation), whatever the precision
    "float8_e4m3fn": ("COMPUTE_32F", "COMPUTE_32F"),
    "float8_e5m2": ("COMPUTE_32F", "COMPUTE_32F"),
}


def _dtype_name(dtype: Any) -> str:
    name = getattr(dtype, "name", None) if not isinstance(dtype, str) else dtype
    if name not in _COMPUTE_TYPES:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            pass
    if name not in _COMPUTE_TYPES:
        raise ValueError(
            f"dtype {dtype!r} has no nvmath compute type here: expected one of {', '.join(_COMPUTE_TYPES)}"
        )
    return str(name)


def compute_type(dtype: Any, precision: PrecisionName | None) -> str | None:
    """The ``nvmath...ComputeType`` member name for ``dtype`` at ``precision``
    (a name as :class:`dmatmul._options.Options` holds it, normalized once
    there), or None for nvmath's default (leave ``compute_type`` unset).

    >>> compute_type("float32", "high"), compute_type("float32", "highest"), compute_type("float32", None)
    ('COMPUTE_32F_FAST_TF32', 'COMPUTE_32F', None)
    >>> compute_type("float16", "high"), compute_type("float64", "high")
    ('COMPUTE_32F', 'COMPUTE_64F')
    """
    name = _dtype_name(dtype)
    if precision is None or precision == "default":
        return None
    high, highest = _COMPUTE_TYPES[name]
    return high if precision == "high" else highest
