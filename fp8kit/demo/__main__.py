"""python -m fp8kit.demo (see fp8kit/demo/cli.py)."""

import sys

from fp8kit.demo.cli import main

sys.exit(main())
