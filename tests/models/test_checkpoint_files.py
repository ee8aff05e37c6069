"""Checkpoints that must not be resumed are refused at load, naming the
file and what is wrong with it: a JAX checkpoint whose FP8 scaling state
holds a value no update writes (a NaN, zero or negative scale would make
every loss NaN), refused by the rule and in the words the PyTorch trainer
uses for its own; and a file of the other trainer (both are zip archives,
told apart by their members) or of neither, said to be what it is."""

import io
import re
import zipfile

import numpy as np
import pytest
import torch

from fp8kit.models.train_jax import JaxTrainer
from fp8kit.models.train_torch import TorchTrainer
from fp8kit.recipe import DelayedScaling

from small_config import SMALL, SMALL_TRAIN

DELAYED = DelayedScaling(amax_history_len=4)
QKV_SCALE = "['fp8_states']['layers'][0]['qkv'].scale"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """{framework: path of a checkpoint written after one step}."""
    folder = tmp_path_factory.mktemp("checkpoints")
    paths = {}
    for framework, cls in (("jax", JaxTrainer), ("torch", TorchTrainer)):
        trainer = cls(SMALL, SMALL_TRAIN, DELAYED)
        trainer.train_step()
        paths[framework] = folder / f"ckpt-{framework}"
        trainer.save(paths[framework])
    return paths


def _jax_with(src, dst, name, index, value):
    """src's .npz with entry `name`[index] set to value, written to dst."""
    with np.load(src) as f:
        arrays = {k: f[k] for k in f.files}
    arrays[name] = arrays[name].copy()
    arrays[name].reshape(-1)[index] = value
    np.savez(dst, **arrays)
    return dst


def _first_scale(tree):
    """The first 'scale' tensor of a Linear's saved FP8 state."""
    items = tree.items() if isinstance(tree, dict) else enumerate(tree)
    for key, value in items:
        if key == "scale" and isinstance(value, torch.Tensor):
            return value
        if isinstance(value, (dict, list)) and (found := _first_scale(value)) is not None:
            return found
    return None


def _torch_with(src, dst, index, value):
    """src with the first saved FP8 scale's [index] set to value."""
    state = torch.load(src, weights_only=True)
    extra = next(v for k, v in state["model"].items() if k.endswith("_extra_state"))
    _first_scale(extra)[index] = value
    torch.save(state, dst)
    return dst


@pytest.mark.parametrize("value", [np.nan, 0.0, -1.0, np.inf], ids=["nan", "0", "-1", "inf"])
def test_a_corrupt_fp8_scale_is_refused_by_both_trainers_alike(saved, tmp_path, value):
    rule = (rf" holds {value:g} \(flat index 1\); scale values must be finite and > 0: the "
            "checkpoint is corrupt")
    path = _jax_with(saved["jax"], tmp_path / "jax.npz", QKV_SCALE, 1, value)
    trainer = JaxTrainer(SMALL, SMALL_TRAIN, DELAYED)
    with pytest.raises(ValueError, match=rf"checkpoint {re.escape(str(path))}: "
                                         rf"{re.escape(QKV_SCALE)}{rule}"):
        trainer.load(path)
    assert trainer.step == 0  # nothing was loaded
    path = _torch_with(saved["torch"], tmp_path / "torch.pt", 1, value)
    with pytest.raises(ValueError, match=rf"saved 'scale'{rule}"):
        TorchTrainer(SMALL, SMALL_TRAIN, DELAYED).load(path)


@pytest.mark.parametrize("field,value,match", [
    ("amax_history", -1.0, r"amax_history holds -1 \(flat index 2\); amax_history values must be "
                           r">= 0 \(NaN and inf allowed\): the checkpoint is corrupt"),
    ("seeded", 2.0, r"seeded holds 2 \(flat index 2\); .* what 2 uses of one state"),
], ids=["amax_history", "seeded"])
def test_other_corrupt_fp8_state_values_are_refused(saved, tmp_path, field, value, match):
    name = QKV_SCALE.replace(".scale", f".{field}")
    path = _jax_with(saved["jax"], tmp_path / "jax.npz", name, 2, value)
    with pytest.raises(ValueError, match=rf"{re.escape(name)} {match.split(' ', 1)[1]}"):
        JaxTrainer(SMALL, SMALL_TRAIN, DELAYED).load(path)


def test_a_valid_checkpoint_still_loads(saved):
    trainer = JaxTrainer(SMALL, SMALL_TRAIN, DELAYED)
    trainer.load(saved["jax"])
    assert trainer.step == 1 and np.isfinite(trainer.train_step())


NPZ = r"a NumPy .npz archive \(JaxTrainer.save's format\)"
TORCH = r"a PyTorch checkpoint \(torch.save's zip archive, TorchTrainer.save's format\)"


def test_each_trainer_names_the_other_trainers_checkpoint(saved):
    jax_path, torch_path = saved["jax"], saved["torch"]
    with pytest.raises(ValueError, match=rf"checkpoint {re.escape(str(torch_path))} is {TORCH}; "
                                         rf"JaxTrainer.load reads {NPZ}. Load it with "
                                         r"TorchTrainer.load."):
        JaxTrainer(SMALL, SMALL_TRAIN, DELAYED).load(torch_path)
    with pytest.raises(ValueError, match=rf"checkpoint {re.escape(str(jax_path))} is {NPZ}; "
                                         rf"TorchTrainer.load reads {TORCH}. Load it with "
                                         r"JaxTrainer.load."):
        TorchTrainer(SMALL, SMALL_TRAIN, DELAYED).load(jax_path)


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
    "npy": (lambda p: _bytes_of(p, lambda f: np.save(f, np.zeros(3))),
            r"a single NumPy array \(np.save's .npy\), not an archive"),
    "text": (lambda p: _bytes_of(p, lambda f: f.write(b"step=3\n")),
             r"not a zip archive \(it starts with b'step=3"),
    "zip": (lambda p: _zip_of(p, ["model/weights.bin"]),
            r"a zip archive of neither trainer's layout \(members \['model/weights.bin'\]\)"),
    "truncated": (lambda p: _bytes_of(p, lambda f: f.write(b"PK\x03\x04" + bytes(20))),
                  r"a damaged zip archive"),
}


@pytest.mark.parametrize("kind", OTHER_FILES)
def test_a_file_of_neither_trainer_is_named(tmp_path, kind):
    make, what = OTHER_FILES[kind]
    path = make(tmp_path / "file")
    for cls, want in ((JaxTrainer, NPZ), (TorchTrainer, TORCH)):
        with pytest.raises(ValueError, match=rf"checkpoint {re.escape(str(path))} is {what}.*; "
                                             rf"{cls.__name__}.load reads {want}\.$"):
            cls(SMALL, SMALL_TRAIN, DELAYED).load(path)


def test_an_npz_without_the_trainers_metadata_is_named(tmp_path):
    path = _bytes_of(tmp_path / "arrays.npz", lambda f: np.savez(f, weights=np.zeros(3)))
    with pytest.raises(ValueError, match=r"is a NumPy .npz archive without the '__meta__' entry "
                                         r"JaxTrainer.save writes \(it holds \['weights'\]\)"):
        JaxTrainer(SMALL, SMALL_TRAIN, DELAYED).load(path)
