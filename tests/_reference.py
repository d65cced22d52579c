"""The numpy reference of the tests: the package's own (``dmatmul._reference``)."""

from dmatmul._reference import (  # noqa: F401
    TOLERANCE,
    assert_close,
    error_ratio,
    gelu_tanh,
    random_matrix,
    reference,
    wide,
)
