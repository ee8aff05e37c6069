"""python -m fp8kit.inspect (see fp8kit/inspect/cli.py)."""

import sys

from fp8kit.inspect.cli import main

sys.exit(main())
