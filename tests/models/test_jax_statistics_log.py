"""The JAX trainer's FP8 cast statistics: written at the steps a StatsLog
logs, named as the checkpoint names the Linears, and without any effect
on the run."""
import json

import pytest
from small_config import SMALL, SMALL_TRAIN

from fp8kit.inspect import StatsLog, read_run
from fp8kit.models import llama_jax
from fp8kit.models.train_jax import JaxTrainer
from fp8kit.recipe import BlockScaling, CurrentScaling, DelayedScaling

STEPS = 5


@pytest.mark.parametrize("recipe", [DelayedScaling(), CurrentScaling(), BlockScaling()],
                         ids=["delayed", "current", "block"])
def test_logged_steps_change_nothing_and_name_every_recorded_cast(tmp_path, recipe):
    path = tmp_path / "run.jsonl"
    with StatsLog(path, every=2) as log:
        inspected = JaxTrainer(SMALL, SMALL_TRAIN, recipe, statistics=log).train_steps(STEPS)
    plain = JaxTrainer(SMALL, SMALL_TRAIN, recipe).train_steps(STEPS)
    assert inspected == plain
    records = read_run(path)
    assert [r["step"] for r in records] == [0, 2, 4]
    assert {(r["framework"], r["recipe"]) for r in records} == {("jax", type(recipe).__name__)}
    # fp8kit.jax records every cast: each GEMM's input (the fused norm's and
    # activation's outputs included), kernel and output gradient.
    per_layer = [f"{gemm}/{role}" for gemm in ("mlp.fc1", "mlp.fc2", "qkv", "wo")
                 for role in ("grad_output", "input", "weight")]
    want = sorted(f"layers.{i}.{n}" for i in range(SMALL.layers) for n in per_layer)
    for r in records:
        assert sorted(r["tensors"]) == want
        for name, t in r["tensors"].items():
            assert t["numel"] > 0 and t["amax"] > 0, name
            assert 0.0 < t["relative_error"] < 0.2, name
            assert (t["scale"] is None) == isinstance(recipe, BlockScaling), name
    json.dumps(records)  # plain numbers only


def test_statistics_need_a_recipe_and_fp8kits_layers(tmp_path):
    with StatsLog(tmp_path / "run.jsonl", every=1) as log:
        with pytest.raises(ValueError, match="statistics"):
            JaxTrainer(SMALL, SMALL_TRAIN, None, statistics=log)
        other = llama_jax.JaxLayers(lambda *a, **k: None, llama_jax.FP8KIT_LAYERS.dense,
                                    llama_jax.FP8KIT_LAYERS.layernorm_mlp,
                                    llama_jax.FP8KIT_LAYERS.create_states)
        with pytest.raises(ValueError, match="fp8kit's FP8 layers"):
            JaxTrainer(SMALL, SMALL_TRAIN, DelayedScaling(), layers=other, statistics=log)


def test_a_logged_step_is_read_once_the_next_one_is_queued(tmp_path):
    """Reading a logged step's statistics waits for that step; the trainer
    does it after queueing the next one (so the device is not left idle
    while the host waits and writes), and before train_steps returns."""
    class Recorded(StatsLog):
        def write(self, step, *args):
            queued.append((step, trainer.step))
            return super().write(step, *args)

    queued = []
    with Recorded(tmp_path / "run.jsonl", every=2) as log:
        trainer = JaxTrainer(SMALL, SMALL_TRAIN, DelayedScaling(), statistics=log)
        trainer.train_steps(STEPS)
        assert queued == [(0, 1), (2, 3), (4, 5)]  # step 4's by train_steps' own wait
        trainer.train_step()  # step 5: not logged, nothing left to write
        assert len(queued) == 3
    assert [r["step"] for r in read_run(tmp_path / "run.jsonl")] == [0, 2, 4]


@pytest.mark.parametrize("recipe", [DelayedScaling(), BlockScaling()], ids=["delayed", "block"])
def test_a_mixture_of_experts_logs_its_grouped_layers(tmp_path, recipe):
    import dataclasses
    cfg = dataclasses.replace(SMALL, experts=4, top_k=2)
    path = tmp_path / "moe.jsonl"
    with StatsLog(path, every=2) as log:
        inspected = JaxTrainer(cfg, SMALL_TRAIN, recipe, statistics=log).train_steps(3)
    assert inspected == JaxTrainer(cfg, SMALL_TRAIN, recipe).train_steps(3)
    records = read_run(path)
    names = [f"layers.{i}.{gemm}/{role}" for i in range(cfg.layers)
             for gemm in ("qkv", "wo", "experts.gate_up", "experts.down")
             for role in ("input", "weight", "grad_output")]
    for r in records:
        assert list(r["tensors"]) == names  # the model's order
        assert r["tensors"]["layers.0.experts.down/weight"]["scale"] is None
