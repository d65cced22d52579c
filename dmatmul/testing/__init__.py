"""dmatmul's own test oracle, public: check the library (or your use of it)
against a float64 numpy reference from your own tests.

Two levels:

* the reference: :func:`reference` (``epilog(alpha * op(a) @ op(b) + beta * c
  + bias)`` in float64/complex128), :func:`reference_vjp` and
  :func:`reference_jvp` (its derivatives as ``jax.vjp``/``jax.jvp`` define
  them), :func:`assert_close` and :func:`error_ratio` (the tolerance of each
  dtype: :data:`TOLERANCE`)::

      import numpy as np
      import dmatmul as dm
      from dmatmul.testing import assert_close, reference

      def test_my_product():
          a, b = np.ones((64, 32), np.float32), np.ones((32, 16), np.float32)
          assert_close(dm.matmul(a, b, devices=2), reference(a, b), "float32")

* the differential check behind ``dmatmul check``: random products over the
  whole layout space (every distribution kind, grid, block size, dtype,
  transpose, epilogue, array family, memory layout, call form, JAX
  transformation), each run and compared with the reference::

      import dmatmul.testing

      def test_dmatmul_here():
          result = dmatmul.testing.check(cases=20, seed=1)
          assert result.failures == 0, result

  :func:`check` returns a :class:`Report` (``str()`` is the table by layout
  family, with a line reproducing each of the first failures). The pieces:
  :func:`cases` draws :class:`Case` values (the same ones for the same seed),
  :func:`run_case` runs one and returns its :class:`Outcome`, :func:`report`
  tabulates outcomes. A case is a plain value: build one, or change a drawn
  one with ``dataclasses.replace``, and run it (its :meth:`Case.describe` is
  a line of Python that makes the product, ``rand`` being :func:`rand`).

Importing this package needs numpy only (JAX is imported when a case runs on
it); ``import dmatmul`` does not import it.
"""

from __future__ import annotations

from .case import (
    BIAS_KINDS, CALLS, LAYOUT_FAMILIES, LAYOUTS, MATMUL_PRECISIONS, NRANKS, PLACEMENTS, TRANSFORMS, Case, OnMesh,
    Refusal, Reset, Transform,
)
from .suite import Report, cases, check
from .draw import Chooser, NumpyChooser, draw_case
from .operands import lay_out, rand, rand_scales
from .reference import (
    TOLERANCE, assert_close, error_ratio, random_matrix, reference, reference_jvp, reference_vjp,
)
from .table import report
from .run import Outcome, combine, run_case

__all__ = [
    "TOLERANCE", "reference", "reference_vjp", "reference_jvp", "assert_close", "error_ratio", "random_matrix",
    "check", "Report", "cases", "Case", "Outcome", "run_case", "combine", "report", "draw_case", "Chooser",
    "NumpyChooser", "rand", "rand_scales", "lay_out", "OnMesh", "Reset", "Transform", "Refusal", "NRANKS",
    "LAYOUT_FAMILIES", "LAYOUTS", "BIAS_KINDS", "PLACEMENTS", "CALLS", "TRANSFORMS", "MATMUL_PRECISIONS",
]
