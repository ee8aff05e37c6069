"""TorchTrainer(compile=True): the decoder's forward, loss and backward as
one torch.compile(fullgraph=True) graph. With the aot_eager backend (eager
mode's kernels, run from the traced graphs) a compiled run equals an eager
one bit for bit: losses, weights, optimizer state and FP8 scaling state.
With inductor (what the benchmark times) it compiles once over the steps
and tracks eager mode within inductor's rounding."""

import re

import pytest
import torch
import torch._dynamo.testing

from fp8kit.models.train_torch import TorchTrainer
from fp8kit.recipe import DelayedScaling

from small_config import SMALL, SMALL_TRAIN
from snapshots import assert_identical, snapshot

DELAYED = DelayedScaling(amax_history_len=4)
STEPS = 4


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """No compiled graph or counter leaks from one test into the next."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_the_decoder_is_one_graph_without_breaks():
    trainer = TorchTrainer(SMALL, SMALL_TRAIN, DELAYED)
    batch = torch.from_numpy(trainer.sampler.next()).long()
    explained = torch._dynamo.explain(trainer.loss)(batch)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
    # Every layer's FP8 work is in that graph, as fp8kit's dispatcher ops:
    # per layer one Linear (wo) and two fused layers (RMSNorm + QKV, RMSNorm + MLP).
    code = explained.graphs[0].print_readable(print_output=False)
    ops = re.findall(r"torch\.ops\.fp8kit\.(\w+)", code)
    assert ops.count("linear_forward") == SMALL.layers
    assert ops.count("norm_forward") == 2 * SMALL.layers
    assert ops.count("activation_forward") == SMALL.layers


@pytest.mark.parametrize("recipe", [DELAYED, None], ids=["delayed", "bf16"])
def test_compiled_training_equals_eager_bit_for_bit(recipe):
    """aot_eager runs the kernels eager mode runs, so every number of the
    run (the delayed-scaling state updated inside the graph included) is
    the same; one compilation serves all steps."""
    eager = TorchTrainer(SMALL, SMALL_TRAIN, recipe)
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = TorchTrainer(SMALL, SMALL_TRAIN, recipe, compile=True, compile_backend=counter)
    want = [eager.train_step() for _ in range(STEPS)]
    got = [compiled.train_step() for _ in range(STEPS)]
    assert got == want   # float equality: the same bits
    assert len(set(want)) == STEPS   # the steps did change something
    assert_identical(snapshot(compiled), snapshot(eager))
    assert counter.frame_count == 1


def test_inductor_compiles_once_and_tracks_eager():
    """Inductor fuses the norms, the rotary embedding and the loss and
    rounds to bf16 at other points than eager mode, and a bf16 value one
    ulp away can land on another FP8 code: the first loss (same weights,
    same batch) differs by that rounding only; later ones also carry the
    updates' differences, still far below FP8's distance from bf16 (0.03
    in test_training.py)."""
    eager = TorchTrainer(SMALL, SMALL_TRAIN, DELAYED)
    counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    compiled = TorchTrainer(SMALL, SMALL_TRAIN, DELAYED, compile=True, compile_backend=counter)
    want = [eager.train_step() for _ in range(STEPS)]
    got = [compiled.train_step() for _ in range(STEPS)]
    assert abs(got[0] - want[0]) < 2e-4, (got, want)
    for a, b in zip(got, want):
        assert abs(a - b) < 0.01, (got, want)
    assert got[-1] < got[0] - 0.3   # it learns
    assert counter.frame_count == 1


def test_a_compiled_run_resumes_bit_exactly(tmp_path):
    """The checkpoint of a compiled run records the scaling state the
    graph updated (seeded slots included: a slot restored unseeded would
    be seeded again from the next batch), so 2 + 2 steps equal 4."""
    def trainer():
        return TorchTrainer(SMALL, SMALL_TRAIN, DELAYED, compile=True,
                            compile_backend="aot_eager")
    straight = trainer()
    want = [straight.train_step() for _ in range(STEPS)]
    first = trainer()
    got = [first.train_step() for _ in range(STEPS // 2)]
    first.save(tmp_path / "ckpt")
    resumed = trainer()
    resumed.load(tmp_path / "ckpt")
    got += [resumed.train_step() for _ in range(STEPS - STEPS // 2)]
    assert got == want
    assert_identical(snapshot(resumed), snapshot(straight))
