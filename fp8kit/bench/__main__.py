"""python -m fp8kit.bench (see fp8kit/bench/cli.py)."""

import sys

from fp8kit.bench.cli import main

sys.exit(main())
