"""The model tests need both frameworks."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("jax")
