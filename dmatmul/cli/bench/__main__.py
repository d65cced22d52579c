"""``python -m dmatmul.cli.bench [options]``: ``dmatmul bench`` without the ``dmatmul`` CLI."""

import sys

from . import main

sys.exit(main())
