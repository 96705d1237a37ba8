"""`python -m benchmarks`: list the suites, or run one (see `benchmarks/cli.py`)."""

import sys

from benchmarks.cli import main

sys.exit(main())
