"""One checkpoint file for both trainers: a run saved by one framework
resumes in the other with every array as it was (weights, AdamW moments,
FP8 scaling state), and a checkpoint that must not be resumed is refused
at load by both alike, naming the file and what is wrong with it: an FP8
scaling state holding a value no update writes (a NaN, zero or negative
scale would make every loss NaN), another run's, a damaged file, a file
of another kind."""

import dataclasses
import io
import json
import re
import zipfile

import numpy as np
import pytest
import torch

import fp8kit.checkpoint as portable
from fp8kit.models.train_jax import JaxTrainer
from fp8kit.models.train_torch import TorchTrainer
from fp8kit.recipe import CurrentScaling, DelayedScaling

from small_config import SMALL, SMALL_TRAIN

DELAYED = DelayedScaling(amax_history_len=4)
TRAINERS = {"torch": TorchTrainer, "jax": JaxTrainer}
QKV_SCALE = "fp8.layers.0.qkv.scale"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """{framework: path of a checkpoint written after two steps}."""
    folder = tmp_path_factory.mktemp("checkpoints")
    paths = {}
    for framework, cls in TRAINERS.items():
        trainer = cls(SMALL, SMALL_TRAIN, DELAYED)
        trainer.train_steps(2)
        paths[framework] = folder / f"ckpt-{framework}"
        trainer.save(paths[framework])
    return paths


def _arrays(path):
    return portable.load(path)[0]


@pytest.mark.parametrize("source,target", [("torch", "jax"), ("jax", "torch")])
def test_a_run_moves_between_frameworks_with_every_array_as_it_was(saved, tmp_path, source,
                                                                   target):
    """Loaded by the other trainer and saved again, the checkpoint holds the
    same bits (params, moments, FP8 states in init's layout); the resumed
    run trains on from there as the run that never switched does, within
    the two frameworks' own bf16 difference (their attention, softmax and
    AdamW arithmetic differ in rounding; fp8kit's layers do not)."""
    resumed = TRAINERS[target](SMALL, SMALL_TRAIN, DELAYED)
    resumed.load(saved[source])
    assert resumed.step == 2 and resumed.sampler.position == 2
    resumed.save(tmp_path / "again")
    before, after = _arrays(saved[source]), _arrays(tmp_path / "again")
    assert sorted(before) == sorted(after)
    assert any(k.startswith("fp8.") for k in before) and any(k.startswith("adamw.") for k in before)
    for name in before:
        assert before[name].tobytes() == after[name].tobytes(), name
    assert portable.load(tmp_path / "again")[1]["framework"] == target

    straight = TRAINERS[source](SMALL, SMALL_TRAIN, DELAYED)
    straight.train_steps(2)
    want, got = straight.train_steps(3), resumed.train_steps(3)
    assert len(set(got)) == 3
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-3)


def test_a_fresh_state_saves_as_fp8kit_jax_creates_it(tmp_path):
    """Before its first step each PyTorch Linear's FP8 state is saved as the
    state fp8kit.jax creates (empty history, scale 1, unseeded)."""
    for framework, cls in TRAINERS.items():
        cls(SMALL, SMALL_TRAIN, DELAYED).save(tmp_path / framework)
    torch_arrays, jax_arrays = _arrays(tmp_path / "torch"), _arrays(tmp_path / "jax")
    for name in torch_arrays:
        assert torch_arrays[name].tobytes() == jax_arrays[name].tobytes(), name


def _with(src, dst, name, index, value):
    """src's checkpoint with array `name`[index] set to value, written
    (with valid checksums) to dst."""
    arrays, meta = portable.load(src)
    arrays[name] = arrays[name].copy()
    arrays[name].reshape(-1)[index] = value
    portable.save(dst, arrays, meta)
    return dst


@pytest.mark.parametrize("framework", TRAINERS)
@pytest.mark.parametrize("name,index,value,rule", [
    (QKV_SCALE, 1, np.nan, "scale values must be finite and > 0"),
    (QKV_SCALE, 1, 0.0, "scale values must be finite and > 0"),
    (QKV_SCALE, 1, -1.0, "scale values must be finite and > 0"),
    (QKV_SCALE, 1, np.inf, "scale values must be finite and > 0"),
    ("fp8.layers.1.mlp.fc2.amax_history", 2, -1.0,
     r"amax_history values must be >= 0 \(NaN and inf allowed\)"),
    ("fp8.layers.0.wo.seeded", 2, 2.0, r"seeded values must be 0.0 \(fresh\) or 1.0 \(seeded\)"),
], ids=["nan", "0", "-1", "inf", "amax_history", "seeded"])
def test_a_corrupt_fp8_state_is_refused_by_both_trainers_alike(saved, tmp_path, framework, name,
                                                               index, value, rule):
    path = _with(saved["torch"], tmp_path / "ckpt", name, index, value)
    trainer = TRAINERS[framework](SMALL, SMALL_TRAIN, DELAYED)
    with pytest.raises(ValueError, match=rf"checkpoint {re.escape(str(path))}: "
                                         rf"{re.escape(name)} holds {value:g} \(flat index "
                                         rf"{index}\); {rule}: the checkpoint is corrupt"):
        trainer.load(path)
    assert trainer.step == 0   # nothing was loaded


@pytest.mark.parametrize("framework", TRAINERS)
def test_another_runs_checkpoint_is_refused_naming_the_difference(saved, framework):
    cls = TRAINERS[framework]
    with pytest.raises(ValueError, match=r"recipe.amax_history_len: saved 4, now 16"):
        cls(SMALL, SMALL_TRAIN, DelayedScaling()).load(saved["torch"])
    with pytest.raises(ValueError, match=r"recipe.type: saved 'DelayedScaling', now "
                                         r"'CurrentScaling'"):
        cls(SMALL, SMALL_TRAIN, CurrentScaling()).load(saved["jax"])
    bigger = dataclasses.replace(SMALL, layers=SMALL.layers + 1)
    with pytest.raises(ValueError, match=rf"model.layers: saved {SMALL.layers}, now "
                                         rf"{SMALL.layers + 1}"):
        cls(bigger, SMALL_TRAIN, DELAYED).load(saved["torch"])


def test_a_dense_run_is_described_without_the_router_setting():
    """Files of dense runs written before the MoE balancing loss existed
    stay loadable: a dense description leaves the router's coefficient out,
    an MoE one keeps it (a change of it changes the training)."""
    from fp8kit.models.checkpoint import run_description
    dense = run_description(SMALL, SMALL_TRAIN, DELAYED)["model"]
    assert "router_aux_loss_coef" not in dense
    moe = run_description(dataclasses.replace(SMALL, experts=4, top_k=2), SMALL_TRAIN,
                          DELAYED)["model"]
    assert moe["router_aux_loss_coef"] == SMALL.router_aux_loss_coef


def test_a_damaged_file_is_named_with_the_array_it_hits(saved, tmp_path):
    data = bytearray(saved["torch"].read_bytes())
    header_len = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + header_len])
    begin, _ = header["params.embed"]["data_offsets"]
    data[8 + header_len + begin + 5] ^= 0x40      # one bit of the embedding
    flipped = tmp_path / "flipped"
    flipped.write_bytes(bytes(data))
    truncated = tmp_path / "truncated"
    truncated.write_bytes(bytes(data[:-7]))
    for cls in TRAINERS.values():
        with pytest.raises(ValueError, match=rf"checkpoint {re.escape(str(flipped))} is damaged: "
                                             r"the bytes of 'params.embed' changed"):
            cls(SMALL, SMALL_TRAIN, DELAYED).load(flipped)
        with pytest.raises(ValueError, match=rf"checkpoint {re.escape(str(truncated))} is not a "
                                             r"whole safetensors file"):
            cls(SMALL, SMALL_TRAIN, DELAYED).load(truncated)


def _bytes_of(path, save):
    """path holding what save(file object) writes (np.save would add .npy to a path)."""
    buffer = io.BytesIO()
    save(buffer)
    path.write_bytes(buffer.getvalue())
    return path


def _zip_of(path, members):
    with zipfile.ZipFile(path, "w") as z:
        for name in members:
            z.writestr(name, b"")
    return path


OTHER_FILES = {
    "npy": (lambda p: _bytes_of(p, lambda f: np.save(f, np.zeros(3))), r"a NumPy .npy array"),
    "npz": (lambda p: _bytes_of(p, lambda f: np.savez(f, w=np.zeros(3))),
            r"a NumPy .npz archive \(an older fp8kit JaxTrainer checkpoint\?\)"),
    "torch": (lambda p: _bytes_of(p, lambda f: torch.save({"w": torch.zeros(3)}, f)),
              r"a torch.save archive \(an older fp8kit TorchTrainer checkpoint\?\)"),
    "text": (lambda p: _bytes_of(p, lambda f: f.write(b"step=3\n")),
             r"a file starting with b'step=3"),
    "zip": (lambda p: _zip_of(p, ["model/weights.bin"]), r"a zip archive"),
}


@pytest.mark.parametrize("kind", OTHER_FILES)
def test_a_file_of_another_kind_is_named(tmp_path, kind):
    make, what = OTHER_FILES[kind]
    path = make(tmp_path / "file")
    for cls in TRAINERS.values():
        with pytest.raises(ValueError, match=rf"checkpoint {re.escape(str(path))} is not a whole "
                                             rf"safetensors file \(.*\); it is {what}"):
            cls(SMALL, SMALL_TRAIN, DELAYED).load(path)


def test_a_safetensors_file_of_another_writer_is_named(tmp_path):
    from safetensors.numpy import save_file
    path = tmp_path / "model.safetensors"
    save_file({"w": np.zeros(3, np.float32)}, str(path))
    with pytest.raises(ValueError, match=r"without fp8kit's format tag 'fp8kit-checkpoint-1' "
                                         r"\(it has None\)"):
        JaxTrainer(SMALL, SMALL_TRAIN, DELAYED).load(path)
