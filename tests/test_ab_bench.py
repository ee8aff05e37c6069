"""scripts/ab_bench.sh: `prepare REV` keeps what the change touched as it
was at REV, `base` puts exactly that in the tree (modified files back,
deleted ones restored, added ones out), `change` puts the change back, and
neither ever overwrites the change's files (the tree's state is kept in
.ab/on_base)."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "ab_bench.sh"

if not SCRIPT.is_file():
    pytest.skip("scripts/ is not next to the tests (a copy of tests/ alone)",
                allow_module_level=True)
if shutil.which("git") is None or shutil.which("bash") is None:
    pytest.skip("needs git and bash", allow_module_level=True)


def _run(repo, *args, check=True):
    return subprocess.run(list(args), cwd=repo, check=check, capture_output=True, text=True)


def _ab(repo, *args, check=True):
    return _run(repo, "bash", "scripts/ab_bench.sh", *args, check=check)


@pytest.fixture
def repo(tmp_path):
    """A repository at REV (a.txt, b.txt, sub/c.txt, the script), then a
    change: a.txt edited, b.txt deleted, d.txt and sub/e.txt added (one
    untracked, one staged)."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(SCRIPT, tmp_path / "scripts" / "ab_bench.sh")
    (tmp_path / "a.txt").write_text("a at REV\n")
    (tmp_path / "b.txt").write_text("b at REV\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.txt").write_text("c, unchanged\n")
    _run(tmp_path, "git", "init", "-q")
    _run(tmp_path, "git", "add", "-A")
    _run(tmp_path, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "REV")
    (tmp_path / "a.txt").write_text("a, changed\n")
    (tmp_path / "b.txt").unlink()
    (tmp_path / "d.txt").write_text("d, added\n")
    (tmp_path / "sub" / "e.txt").write_text("e, added\n")
    _run(tmp_path, "git", "add", "sub/e.txt")
    return tmp_path


def _tree(repo):
    return {str(p.relative_to(repo)): p.read_text() for p in sorted(repo.rglob("*.txt"))
            if ".git" not in p.parts and ".ab" not in p.parts}


CHANGE = {"a.txt": "a, changed\n", "d.txt": "d, added\n", "sub/c.txt": "c, unchanged\n",
          "sub/e.txt": "e, added\n"}
BASE = {"a.txt": "a at REV\n", "b.txt": "b at REV\n", "sub/c.txt": "c, unchanged\n"}


def test_base_and_change_swap_exactly_the_changed_files(repo):
    _ab(repo, "prepare", "HEAD")
    assert sorted((repo / ".ab" / "paths").read_text().split()) == [
        "a.txt", "b.txt", "d.txt", "sub/e.txt"]
    assert _tree(repo) == CHANGE
    _ab(repo, "base")
    assert _tree(repo) == BASE
    _ab(repo, "change")
    assert _tree(repo) == CHANGE
    _ab(repo, "base")
    assert _tree(repo) == BASE, "a second round swaps the same way"
    _ab(repo, "change")
    assert _tree(repo) == CHANGE


def test_the_change_is_never_overwritten(repo):
    _ab(repo, "prepare", "HEAD")
    _ab(repo, "change")                      # already the change's: nothing to do
    assert _tree(repo) == CHANGE
    _ab(repo, "base")
    assert _ab(repo, "base", check=False).returncode != 0
    assert _ab(repo, "prepare", "HEAD", check=False).returncode != 0
    _ab(repo, "change")
    assert _tree(repo) == CHANGE


def test_run_and_swaps_need_prepare_first(repo):
    for args in (["run", "out"], ["build"], ["measure", "out"], ["base"], ["change"]):
        result = _ab(repo, *args, check=False)
        assert result.returncode == 2 and "prepare REV" in result.stderr
    assert _tree(repo) == CHANGE


def test_measure_needs_both_sides_built(repo):
    _ab(repo, "prepare", "HEAD")
    result = _ab(repo, "measure", "out", check=False)
    assert result.returncode == 2 and "run 'build' first" in result.stderr
    assert not (repo / "out").exists()


def test_measure_names_a_bad_side(repo):
    _ab(repo, "prepare", "HEAD")
    result = subprocess.run(["bash", "scripts/ab_bench.sh", "measure", "out"], cwd=repo,
                            capture_output=True, text=True, env={**os.environ, "AB_SIDES": "bsae"})
    assert result.returncode == 2 and "no side 'bsae'" in result.stderr


def test_measure_runs_only_the_sides_named(repo):
    _ab(repo, "prepare", "HEAD")
    for side in ("base", "change"):
        (repo / "build" / "ab-site" / side).mkdir(parents=True)
    env = {**os.environ, "AB_SIDES": "base", "AB_COMMAND": 'echo "$PYTHONPATH" > "$AB_OUT/site"'}
    result = subprocess.run(["bash", "scripts/ab_bench.sh", "measure", str(repo / "out")],
                            cwd=repo, capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (repo / "out").iterdir()) == ["base1"]
    site = (repo / "out" / "base1" / "site").read_text().strip()
    assert site == str(repo / "build" / "ab-site" / "base")


def test_measure_compares_every_round_then_all_rounds_at_once(repo):
    """A row slower in one round only is the machine's noise: the
    all-rounds comparison does not count it."""
    shutil.copy(SCRIPT.parent / "compare_bench.py", repo / "scripts")
    _ab(repo, "prepare", "HEAD")
    for side in ("base", "change"):
        (repo / "build" / "ab-site" / side).mkdir(parents=True)
    fake = repo / "fake_decoder_bench.py"
    fake.write_text(
        "import json, os\n"
        "out = os.environ['AB_OUT']\n"
        "delayed = 120.0 if out.endswith('change1') else 140.0  # slower in round 1 only\n"
        "runs = [{'framework': 'torch', 'recipe': r, 'mode': 'eager', 'tokens_per_s': t}\n"
        "        for r, t in (('bf16', 100.0), ('delayed', delayed))]\n"
        "json.dump({'run': {'gpu': 'G'}, 'config': 'c', 'runs': runs},\n"
        "          open(os.path.join(out, 'models.json'), 'w'))\n")
    env = {**os.environ, "AB_COMMAND": f"python3 {fake}"}
    result = subprocess.run(["bash", "scripts/ab_bench.sh", "measure", str(repo / "out"), "2"],
                            cwd=repo, capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    rounds = result.stdout.split("== models.json")
    assert len(rounds) == 4  # round 1, round 2, all rounds
    assert "2 rows compared, 1 slower" in rounds[1]
    assert "2 rows compared, 0 slower" in rounds[2]
    assert rounds[3].startswith(", all rounds")
    assert "2 rows compared, 0 slower in all 2 pairs" in rounds[3]
