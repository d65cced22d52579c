"""``python -m dmatmul``: the same as the ``dmatmul`` command."""

import sys

from .cli import main

sys.exit(main())
