"""The norm and activation of the block-scaled fused layers
(fp8kit.torch._block_fused: the core's kernels without their cast, through
torch.ops.fp8kit.norm_forward_values, activation_forward_values and
activation_backward_values) against the NumPy model of the documented
float32 order (fused_reference.py): forward and gradients bit for bit on
the CPU, in float32 and bfloat16; one graph under torch.compile; clear
errors; CUDA against the CPU (the norm bit for bit, the activation within
fp8kit/activation.h's bound)."""

import numpy as np
import pytest
import torch

import fused_reference as R
from torch_reference import cuda_or_skip, to_numpy_f32
from fp8kit.torch._block_fused import block_activation, block_norm

DTYPES = (torch.float32, torch.bfloat16)
EPS = 1e-5


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().contiguous().view(torch.int16 if t.element_size() == 2
                                              else torch.int32).numpy()


def _rounded(v: np.ndarray, dtype) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(v, np.float32)).to(dtype)


def _norm_inputs(rows, hidden, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, hidden, generator=g) * 2 + 0.5).to(dtype)
    gamma = (1 + 0.2 * torch.randn(hidden, generator=g)).to(dtype)
    beta = (0.5 * torch.randn(hidden, generator=g)).to(dtype)
    dy = torch.randn(rows, hidden, generator=g).to(dtype)
    return x, gamma, beta, dy


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
@pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("rows", [1, 37, 0])
def test_norm_forward_and_backward_bits(normalization, dtype, rows):
    layernorm = normalization == "LayerNorm"
    x, gamma, beta, dy = _norm_inputs(rows, 64, dtype, seed=rows + 3)
    beta = beta if layernorm else None
    xs, gs = x.clone().requires_grad_(), gamma.clone().requires_grad_()
    bs = beta.clone().requires_grad_() if layernorm else None
    y = block_norm(xs, gs, bs, normalization, EPS)
    y.backward(dy)
    xf, gf = to_numpy_f32(x), to_numpy_f32(gamma)
    bf = to_numpy_f32(beta) if layernorm else None
    want_y, mean, rsigma = R.norm_forward(xf, gf, bf, layernorm, EPS)
    np.testing.assert_array_equal(_bits(y), _bits(_rounded(want_y, dtype)))
    dx, dgamma, dbeta = R.norm_backward(to_numpy_f32(dy), xf, mean, rsigma, gf, layernorm)
    np.testing.assert_array_equal(_bits(xs.grad), _bits(_rounded(dx, dtype)))
    np.testing.assert_array_equal(_bits(gs.grad), _bits(_rounded(dgamma, dtype)))
    if layernorm:
        np.testing.assert_array_equal(_bits(bs.grad), _bits(_rounded(dbeta, dtype)))


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
@pytest.mark.parametrize("rows", [1, 37, 0])
def test_activation_forward_and_backward_bits(activation, dtype, rows):
    f = 48
    g = torch.Generator().manual_seed(rows + 11)
    h = (3 * torch.randn(rows, 2 * f if activation == "swiglu" else f, generator=g)).to(dtype)
    d_a = torch.randn(rows, f, generator=g).to(dtype)
    hs = h.clone().requires_grad_()
    a = block_activation(hs, activation)
    a.backward(d_a)
    hf = to_numpy_f32(h)
    np.testing.assert_array_equal(_bits(a), _bits(_rounded(R.activation_forward(hf, activation),
                                                           dtype)))
    want_dh = R.activation_backward(to_numpy_f32(d_a), hf, activation)
    np.testing.assert_array_equal(_bits(hs.grad), _bits(_rounded(want_dh, dtype)))


def test_compiled_is_one_graph_with_the_eager_bits():
    x, gamma, beta, dy = _norm_inputs(40, 128, torch.float32, seed=5)

    def f(x, gamma, beta):
        return block_activation(block_norm(x, gamma, beta, "LayerNorm", EPS), "swiglu")

    def run(fn):
        xs, gs, bs = (t.clone().requires_grad_() for t in (x, gamma, beta))
        y = fn(xs, gs, bs)
        y.backward(dy[:, :64])
        return [y, xs.grad, gs.grad, bs.grad]

    torch._dynamo.reset()
    for got, want in zip(run(torch.compile(f, fullgraph=True)), run(f)):
        assert torch.equal(got, want)


def test_bad_arguments_raise_clear_errors():
    x, gamma, beta, _ = _norm_inputs(4, 64, torch.float32, seed=1)
    with pytest.raises(ValueError, match="normalization is 'BatchNorm'"):
        block_norm(x, gamma, beta, "BatchNorm", EPS)
    with pytest.raises(ValueError, match="beta is None but LayerNorm needs beta"):
        block_norm(x, gamma, None, "LayerNorm", EPS)
    with pytest.raises(ValueError, match="activation is 'relu'"):
        block_activation(x, "relu")
    with pytest.raises(ValueError, match="h has last dimension 24"):
        block_activation(torch.zeros(4, 24), "swiglu")
    with pytest.raises(TypeError, match="gamma has dtype torch.float64"):
        block_norm(x, gamma.double(), beta, "LayerNorm", EPS)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
def test_cuda_matches_cpu(dtype):
    dev = cuda_or_skip()
    x, gamma, beta, dy = _norm_inputs(300, 256, dtype, seed=9)
    for normalization in ("LayerNorm", "RMSNorm"):
        b = beta if normalization == "LayerNorm" else None
        cpu = block_norm(x, gamma, b, normalization, EPS)
        gpu = block_norm(x.to(dev), gamma.to(dev), None if b is None else b.to(dev),
                         normalization, EPS)
        np.testing.assert_array_equal(_bits(gpu), _bits(cpu))
    for activation in ("gelu", "swiglu"):
        h = x if activation == "swiglu" else x[:, :128].contiguous()
        cpu = block_activation(h, activation).float()
        gpu = block_activation(h.to(dev), activation).float().cpu()
        # fp8kit/activation.h's bound (the GPU's sigmoid), plus the rounding
        # of a 16-bit output either way.
        amax = cpu.abs().max()
        ulp = 2.0 ** -18 if dtype == torch.float32 else 2.0 ** -8
        assert ((gpu - cpu).abs() <= ulp * cpu.abs() + 2.0 ** -20 * amax).all(), activation
