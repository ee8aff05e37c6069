"""A trainer's whole state as NumPy arrays, and their comparison bit for
bit: what the tests that expect two runs to be the same run compare."""

import jax
import numpy as np
import torch


def snapshot(trainer):
    """Every number the run's future depends on, as NumPy arrays."""
    if trainer.framework == "torch":
        def plain(v):
            if isinstance(v, torch.Tensor):
                return v.detach().cpu().numpy().copy()
            if isinstance(v, dict):
                return {k: plain(x) for k, x in v.items()}
            if isinstance(v, (list, tuple)):
                return [plain(x) for x in v]
            return v
        return plain({"model": trainer.model.state_dict(),
                      "optimizer": trainer.optimizer.state_dict()["state"]})
    trees = {"params": trainer.params, "opt": trainer.opt_state, "fp8": trainer.fp8_states}
    return {jax.tree_util.keystr(path): np.asarray(leaf)
            for path, leaf in jax.tree_util.tree_leaves_with_path(trees)}


def assert_identical(a, b, where=""):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_identical(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_identical(x, y, f"{where}[{i}]")
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert a.tobytes() == b.tobytes(), where   # bit for bit
    else:
        assert a == b, where
