"""fp8kit's two front ends from another workspace, on the CPU.

Leaves py_test's settings at their defaults: with legacy_create_init Bazel
adds an __init__.py to the fp8kit repository's directory in the runfiles,
which must not stand in for the fp8kit package.
"""
import os
import unittest

import numpy as np


class FrameworksTest(unittest.TestCase):
    def test_package_is_fp8kit_not_the_repository_directory(self):
        import fp8kit
        self.assertTrue(fp8kit.__version__)
        package_dir = os.path.dirname(fp8kit.__file__)
        # runfiles/fp8kit/fp8kit: the package inside the repository.
        self.assertEqual(os.path.basename(package_dir), "fp8kit")
        self.assertEqual(os.path.basename(os.path.dirname(package_dir)), "fp8kit")

    def test_jax_quantize_round_trip(self):
        import jax.numpy as jnp
        import fp8kit.jax as fj

        x = jnp.array([[0.5, -1.25], [0.3, 300.0]], jnp.float32)
        st = fj.quantize(x, jnp.float32(2.0), "e4m3")
        back = np.asarray(fj.dequantize(st, jnp.float32))
        # E4M3 rounds 0.6 to 0.625 and saturates 600 at 448 (see c_api_test.c).
        np.testing.assert_array_equal(back, [[0.5, -1.25], [0.3125, 224.0]])

    def test_torch_linear_forward_and_backward(self):
        import torch
        import fp8kit.torch as ft

        torch.manual_seed(0)
        layer = ft.Linear(32, 16)
        reference = torch.nn.Linear(32, 16)
        reference.load_state_dict(layer.state_dict(), strict=False)
        x = torch.randn(16, 32, requires_grad=True)
        with ft.autocast(recipe=ft.DelayedScaling()):
            y = layer(x)
        y.sum().backward()
        expected = reference(x)
        # FP8 (E4M3) operands: a few percent of the output's scale.
        error = (y - expected).abs().max() / expected.abs().max()
        self.assertLess(float(error), 0.1)
        self.assertEqual(tuple(layer.weight.grad.shape), (16, 32))
        self.assertEqual(tuple(x.grad.shape), (16, 32))


if __name__ == "__main__":
    unittest.main()
