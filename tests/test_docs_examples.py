"""Every Python code block of README.md and docs/*.md runs as written.

Each ```python block is saved to a file of its own and run in a fresh
interpreter, from an empty directory, against the installed fp8kit, on the
CPU: what a user gets by pasting it. A block whose first line is a comment
naming a launcher runs through it:

    # torchrun --nproc-per-node=2 fsdp_example.py

runs the block on 2 ranks with torch.distributed's launcher. Blocks of
other languages (```starlark for Bazel files, ```sh, plain ```) are not
run. The same parse checks that every relative link of those pages points
at a file of the repository.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
# A block runs in seconds on the CPU; the limit only turns a hang into a failure.
TIMEOUT_S = 300
FENCE = re.compile(r"^```(\S*)\s*$")
LAUNCHER = re.compile(r"^#\s*torchrun\s+--nproc-per-node[= ](\d+)\s+\S+\.py\s*(?:\(.*\))?$")
LINK = re.compile(r"\[[^\]]*\]\(([^)#\s]+)(?:#[^)]*)?\)")


def code_blocks(page: Path):
    """(language, first line number, source) of each fenced block of `page`."""
    blocks, lang, start, lines = [], None, 0, []
    for number, line in enumerate(page.read_text().splitlines(), 1):
        fence = FENCE.match(line)
        if fence and lang is None:
            lang, start, lines = fence.group(1), number + 1, []
        elif line.strip() == "```" and lang is not None:
            blocks.append((lang, start, "\n".join(lines) + "\n"))
            lang = None
        elif lang is not None:
            lines.append(line)
    if lang is not None:
        raise AssertionError(f"{page.name}:{start - 1}: code block never closed")
    return blocks


def python_examples():
    params = []
    for page in PAGES:
        for lang, line, source in code_blocks(page):
            if lang == "python":
                rel = page.relative_to(ROOT)
                params.append(pytest.param(source, id=f"{rel}:{line}"))
    return params


def _command(source: str, script: Path) -> list:
    launcher = LAUNCHER.match(source.splitlines()[0])
    if launcher:
        return [sys.executable, "-m", "torch.distributed.run",
                f"--nproc-per-node={launcher.group(1)}", str(script)]
    return [sys.executable, str(script)]


@pytest.mark.parametrize("source", python_examples())
def test_python_example_runs(source, tmp_path):
    script = tmp_path / "example.py"
    script.write_text(source)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", JAX_PLATFORMS="cpu")
    # The installed package, not the source tree's fp8kit/ (which has no
    # compiled extensions): run from an empty directory, PYTHONPATH unset.
    env.pop("PYTHONPATH", None)
    done = subprocess.run(_command(source, script), cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, (
        f"the example exited with {done.returncode}\n--- stdout\n{done.stdout[-4000:]}"
        f"\n--- stderr\n{done.stderr[-4000:]}")


def test_every_page_has_closed_blocks_and_python_examples_exist():
    examples = python_examples()
    assert len(examples) >= 5, "README.md and docs/ should show runnable Python examples"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_into_the_repository(page):
    text = page.read_text()
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):  # https:, mailto: ...
            continue
        path = (page.parent / target).resolve()
        if not path.exists() or ROOT not in (path, *path.parents):
            broken.append(target)
    assert not broken, f"{page.name} links to missing or outside files: {broken}"


def test_launcher_line_is_recognised():
    assert _command("# torchrun --nproc-per-node=2 fsdp_example.py\nx = 1\n",
                    Path("x.py"))[1:4] == ["-m", "torch.distributed.run", "--nproc-per-node=2"]
    assert _command("x = 1\n", Path("x.py")) == [sys.executable, "x.py"]
