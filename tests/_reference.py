"""The numpy reference of the tests: the package's own (``dmatmul.testing.reference``)."""

from dmatmul.testing.reference import (
    TOLERANCE,
    assert_close,
    error_ratio,
    gelu_tanh,
    random_matrix,
    reference,
    reference_vjp,
    silu,
    wide,
)

__all__ = ["TOLERANCE", "assert_close", "error_ratio", "gelu_tanh", "random_matrix", "reference", "reference_vjp",
           "silu", "wide"]
