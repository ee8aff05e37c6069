"""The README's results table, made from the files in docs/results: fp8kit
against bf16 and against TransformerEngine, per recipe, for single layers
(bench.json) and the decoders (models_8b_slice_<framework>.json).

    python3 scripts/results_table.py [--results DIR]        # prints it
    python3 scripts/results_table.py --write README.md      # puts it in the README
    python3 scripts/results_table.py --check README.md      # exit 1: the README's differs

The table goes between the lines <!-- results-table:begin --> and
<!-- results-table:end -->; --write and --check exit 2 where they are missing.
A value the files do not hold (TransformerEngine not installed in the run,
a section or a file not there) is "-", and the caption says which.
"""

import argparse
import difflib
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- results-table:begin -->", "<!-- results-table:end -->"
RECIPES = ("delayed", "current", "block")
BENCH = "bench.json"

# Layer rows: (label, [group, case] of fp8kit vs bf16, [group, case] of fp8kit
# vs TransformerEngine), as fp8kit/bench writes them (linear_torch.py,
# fused_torch.py, dense_jax.py, mlp_jax.py); {r} is the recipe. Shapes are
# tokens x in -> out; the MLP block is Llama-3-8B's (8192 tokens, 4096 ->
# 14336 -> 4096, RMSNorm, SwiGLU).
LAYERS = [
    ("PyTorch Linear fwd+bwd, 8192 x 8192 -> 8192",
     ("PyTorch Linear fwd+bwd, fp8kit vs bf16 nn.Linear", "8192x8192x8192 {r}"),
     ("PyTorch Linear fwd+bwd, fp8kit vs TransformerEngine te.Linear, same recipe",
      "8192x8192x8192 {r}")),
    ("PyTorch Linear fwd+bwd, 8192 x 4096 -> 14336",
     ("PyTorch Linear fwd+bwd, fp8kit vs bf16 nn.Linear", "8192x4096x14336 {r}"),
     ("PyTorch Linear fwd+bwd, fp8kit vs TransformerEngine te.Linear, same recipe",
      "8192x4096x14336 {r}")),
    ("JAX dense fwd+bwd, 8192 x 8192 -> 8192",
     ("JAX jit: dense fwd+bwd (random cotangent), fp8kit vs bf16", "8192^3 {r}"),
     ("JAX jit: dense fwd+bwd (random cotangent), fp8kit vs TransformerEngine-JAX "
      "DenseGeneral, same recipe", "8192^3 {r}")),
    ("PyTorch fused LayerNormMLP fwd+bwd, Llama-3-8B MLP block",
     ("PyTorch LayerNormMLP fwd+bwd (RMSNorm, swiglu), fp8kit vs bf16",
      "8192x4096x14336 fused {r}"),
     ("PyTorch LayerNormMLP (swiglu) fwd+bwd, fp8kit fused vs TransformerEngine",
      "8192x4096x14336 {r}")),
    ("JAX layernorm_mlp fwd+bwd, Llama-3-8B MLP block",
     ("JAX jit: MLP block fwd+bwd (RMSNorm), fp8kit vs bf16", "swiglu 8192x4096x14336 fused {r}"),
     ("JAX jit: MLP block fwd+bwd (RMSNorm), fp8kit fused vs TransformerEngine",
      "swiglu 8192x4096x14336 {r}")),
]
# Decoder rows: (label, file): tokens/s of fp8kit's recipe over bf16's and
# over TransformerEngine's same recipe (te-<recipe>), python -m fp8kit.models.bench.
DECODERS = [
    ("PyTorch decoder 8b_slice, tokens/s", "models_8b_slice_torch.json"),
    ("JAX decoder 8b_slice, tokens/s", "models_8b_slice_jax.json"),
]
HEAD = ["measurement"] + [f"{r} x {peer}" for r in RECIPES for peer in ("bf16", "TE")]
CAPTION = ("x bf16: bf16 time / fp8kit time; x TE: TransformerEngine time / fp8kit time, "
           "same recipe (decoders: the ratio of tokens/s); -: not in the run.")


def load(results: pathlib.Path, name: str):
    path = results / name
    return json.loads(path.read_text()) if path.exists() else None


def cell(ratio) -> str:
    return "-" if ratio is None else f"{ratio:.2f}"


def layer_cells(bench, vs_bf16, vs_te) -> list:
    rows = {(r["group"], r["case"]): r for r in (bench or {}).get("rows", [])}

    def ratio(group, case, recipe):
        row = rows.get((group, case.format(r=recipe)))
        return None if row is None or row.get("error") else row.get("ratio")
    return [cell(ratio(*spec, r)) for r in RECIPES for spec in (vs_bf16, vs_te)]


def decoder_cells(models) -> list:
    # The eager (PyTorch) or jit (JAX) step; --compile adds compiled runs, another measurement.
    runs = {r["recipe"]: r.get("tokens_per_s") for r in (models or {}).get("runs", [])
            if "error" not in r and not r.get("diverged") and r.get("mode") != "compile"}

    def over(recipe, base):
        mine, theirs = runs.get(recipe), runs.get(base)
        return mine / theirs if mine and theirs else None
    return [cell(over(r, base)) for r in RECIPES for base in ("bf16", f"te-{r}")]


def has_te(name: str, doc) -> bool:
    if name == BENCH:
        return any("TransformerEngine" in r["group"] and r.get("ratio") is not None
                   for r in doc.get("rows", []))
    return any(r["recipe"].startswith("te-") and "error" not in r for r in doc.get("runs", []))


def run_of(doc) -> tuple:
    """(GPU, date, commit) of the run that made a file: its "run" header
    (scripts/publish_results.py), else the bench's own meta."""
    run, meta = doc.get("run", {}), doc.get("meta", {})
    return (run.get("gpu") or meta.get("device") or "GPU unknown",
            (run.get("date") or meta.get("time") or "date unknown")[:10],
            "commit " + (run.get("commit") or (meta.get("commit") or "")[:7] or "unknown"))


def notes(name: str, doc) -> list:
    """Why a file's values may be "-": it is missing, or its run left a part out."""
    if doc is None:
        return ["missing"]
    out = [f"sections {', '.join(doc['sections'])}"] if "sections" in doc else []
    return out + ([] if has_te(name, doc) else ["no TransformerEngine in the run"])


def sources(docs: dict) -> str:
    """The caption's sources: the run of each file, said once where they share one."""
    runs = {name: run_of(doc) for name, doc in docs.items() if doc is not None}
    shared = len(runs) > 1 and len(set(runs.values())) == 1
    parts = []
    for name, doc in docs.items():
        about = ([] if shared or doc is None else [", ".join(runs[name])]) + notes(name, doc)
        parts.append(name + (f" ({'; '.join(about)})" if about else ""))
    one = f", one run ({', '.join(next(iter(runs.values())))})" if shared else ""
    return f"From docs/results{one}: " + "; ".join(parts) + "."


def table(results: pathlib.Path) -> str:
    bench = load(results, BENCH)
    lines = ["| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    for label, vs_bf16, vs_te in LAYERS:
        lines.append("| " + " | ".join([label] + layer_cells(bench, vs_bf16, vs_te)) + " |")
    docs = {BENCH: bench}
    for label, name in DECODERS:
        docs[name] = load(results, name)
        lines.append("| " + " | ".join([label] + decoder_cells(docs[name])) + " |")
    return "\n".join(lines) + "\n\n" + CAPTION + " " + sources(docs) + "\n"


def with_table(text: str, new: str) -> str:
    """text with the lines between the markers replaced by `new`;
    ValueError where the markers are missing."""
    lines = text.split("\n")
    stripped = [ln.strip() for ln in lines]
    if BEGIN not in stripped or END not in stripped[stripped.index(BEGIN):]:
        raise ValueError(f"no lines {BEGIN} ... {END} to hold the table")
    begin = stripped.index(BEGIN)
    end = stripped.index(END, begin)
    return "\n".join(lines[:begin + 1] + new.rstrip("\n").split("\n") + lines[end:])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=pathlib.Path, default=ROOT / "docs" / "results",
                    help="the folder of result files (default: docs/results)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--write", type=pathlib.Path, metavar="README",
                      help="replace the table between the README's markers")
    mode.add_argument("--check", type=pathlib.Path, metavar="README",
                      help="exit 1 when the README's table is not the one the files give")
    args = ap.parse_args(argv)
    new = table(args.results)
    readme = args.write or args.check
    if readme is None:
        print(new, end="")
        return 0
    text = readme.read_text()
    try:
        updated = with_table(text, new)
    except ValueError as e:
        print(f"error: {readme}: {e}", file=sys.stderr)
        return 2
    if args.write:
        readme.write_text(updated)
        return 0
    if updated != text:
        diff = difflib.unified_diff(text.splitlines(), updated.splitlines(), str(readme),
                                    "from " + str(args.results), lineterm="")
        print("\n".join(diff), file=sys.stderr)
        print(f"{readme}'s results table is not what {args.results} gives: run "
              f"scripts/results_table.py --write {readme}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
