#!/usr/bin/env bash
# A change measured against the tree before it on one GPU machine: the two
# builds, then their benchmarks interleaved (base, change, base, change,
# ...), so both see the same card, clocks and power state, and the rows
# compared by compare_bench.py.
#
#   scripts/ab_bench.sh prepare REV
#       (here, in the repo root) copies every file the working tree changed
#       since REV, as it was at REV, into .ab/base (git-ignored), and lists
#       the paths in .ab/paths;
#   scripts/ab_bench.sh run OUTDIR [ROUNDS]
#       (on the GPU machine, with .ab carried there) builds both sides, then
#       measures them ROUNDS times (default 1): OUTDIR/base<i>,
#       OUTDIR/change<i>, each the bench's --out folder, then compares each
#       round's two bench.json, and with more rounds all rounds at once (a
#       row slower only where slower in each). BENCH_SECTIONS picks the
#       bench's sections (default: all); AB_COMMAND replaces the bench (run
#       with $AB_OUT set to the folder it writes to, and its JSON files
#       compared by name);
#   scripts/ab_bench.sh build | measure OUTDIR [ROUNDS]
#       the two halves of run, for a machine that stays up between calls:
#       measure reuses the last build, so a second benchmark (the decoder's,
#       say) or more rounds cost no rebuild. AB_SIDES="base" or "change"
#       measures one side, for a benchmark whose two sides outlast one call
#       (compare the two folders' JSON files with compare_bench.py after);
#   scripts/ab_bench.sh base | change
#       puts the base's files in the tree (the change's kept in .ab/change),
#       or the change's back: to build or test either by hand.
# Both sides are the pip path of gpu_check.sh through one build folder (the
# second build recompiles only what the swap touched), each installed into
# its own folder (build/ab-site/<side>, put first on PYTHONPATH when it is
# measured), so measuring either needs no rebuild.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO" || exit 1
AB=.ab

prepare() {
  local rev=$1 path
  if [ -e "$AB/on_base" ]; then
    echo "ab_bench.sh: the tree holds the base; run 'change' first" >&2; exit 1
  fi
  rm -rf "$AB" && mkdir -p "$AB/base"
  git diff --name-only "$rev" -- >"$AB/paths"
  git ls-files --others --exclude-standard -- . ":!$AB" >>"$AB/paths"
  while read -r path; do
    if git cat-file -e "$rev:$path" 2>/dev/null; then
      mkdir -p "$AB/base/$(dirname "$path")"
      git show "$rev:$path" >"$AB/base/$path"
    fi
  done <"$AB/paths"
  echo "$(wc -l <"$AB/paths") paths differ from $rev; carry [\"$AB\"] to the GPU machine"
}

# Puts the base's version of every changed path in the tree (the change's
# kept in .ab/change), or back. Touched, so the build sees them as new.
# .ab/on_base says the tree holds the base: each direction runs only from
# the other, so that the change's files are never overwritten.
swap() {  # to_base | to_change
  local path
  if [ "$1" = to_base ] && [ -e "$AB/on_base" ]; then
    echo "ab_bench.sh: the tree holds the base already" >&2; return 1
  fi
  if [ "$1" = to_change ] && [ ! -e "$AB/on_base" ]; then return 0; fi
  while read -r path; do
    if [ "$1" = to_base ]; then
      if [ -e "$path" ]; then
        mkdir -p "$AB/change/$(dirname "$path")"
        mv "$path" "$AB/change/$path"
      fi
      if [ -e "$AB/base/$path" ]; then cp "$AB/base/$path" "$path"; fi
    else
      rm -f "$path"
      if [ -e "$AB/change/$path" ]; then mv "$AB/change/$path" "$path"; fi
    fi
    [ -e "$path" ] && touch "$path"
  done <"$AB/paths"
  if [ "$1" = to_base ]; then : >"$AB/on_base"; else rm -rf "$AB/on_base" "$AB/change"; fi
}

SITES=build/ab-site

# The build's log stays in the side's folder only when the build fails, and
# the bench draws no plots: each side's folder holds what is compared
# (bench.json and the bench's log), few files to copy back.
build_side() {  # side, log dir
  if [ -x /usr/bin/g++ ]; then export CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++; fi
  rm -rf "$SITES/$1"
  python3 -m pip install -q --no-build-isolation --no-deps --target "$SITES/$1" \
    -Ccmake.define.FP8KIT_CUDA=ON -Ccmake.define.FP8KIT_CUDA_ARCHITECTURES=90 \
    -Cbuild-dir=build/gpu-pip-sysgcc . >"$2/build-$1.log" 2>&1 && rm -f "$2/build-$1.log"
}

build_both() {  # log dir
  local side built
  mkdir -p "$1"
  for side in base change; do
    if [ "$side" = base ]; then swap to_base || exit 1; fi
    build_side "$side" "$1"
    built=$?
    [ "$side" = base ] && swap to_change  # the tree is the change's again
    if [ "$built" != 0 ]; then
      echo "ab_bench.sh: the $side build failed:"
      tail -30 "$1/build-$side.log"
      exit 1
    fi
    echo "built: $side"
  done
}

measure_side() {  # side, out dir
  local site sections=()
  site=$(cd "$SITES/$1" && pwd)
  [ -n "${BENCH_SECTIONS:-}" ] && sections=(--sections "$BENCH_SECTIONS")
  if [ -n "${AB_COMMAND:-}" ]; then
    (cd /tmp && PYTHONPATH="$site" AB_OUT=$2 bash -c "$AB_COMMAND") >"$2/measure.log" 2>&1
  else
    (cd /tmp && PYTHONPATH="$site" python3 -m fp8kit.bench --full --out "$2" --plain-progress \
      --no-plots "${sections[@]}") >"$2/measure.log" 2>&1
  fi
}

measure() {  # out dir, rounds
  local out=$1 rounds=${2:-1} i side json
  local sides=${AB_SIDES:-base change}
  for side in $sides; do
    case $side in base | change) ;; *) echo "ab_bench.sh: AB_SIDES: no side '$side'" >&2; exit 2 ;; esac
    [ -d "$SITES/$side" ] || { echo "ab_bench.sh: no $side build; run 'build' first" >&2; exit 2; }
  done
  for i in $(seq 1 "$rounds"); do
    for side in $sides; do
      mkdir -p "$out/$side$i"
      measure_side "$side" "$out/$side$i" || echo "ab_bench.sh: the $side measurement failed:" \
        "$out/$side$i/measure.log"
      echo "round $i: $side measured"
    done
    for json in "$out/change$i"/*.json; do
      [ -f "$json" ] && [ -f "$out/base$i/${json##*/}" ] || continue
      echo "== ${json##*/}"
      python3 scripts/compare_bench.py "$out/base$i/${json##*/}" "$json"
    done
  done
  [ "$rounds" -gt 1 ] || return 0
  # All rounds' pairs at once: a row is slower only when slower in each.
  for json in "$out/change1"/*.json; do
    local name=${json##*/} pairs=()
    for i in $(seq 1 "$rounds"); do
      [ -f "$out/base$i/$name" ] && [ -f "$out/change$i/$name" ] &&
        pairs+=("$out/base$i/$name" "$out/change$i/$name")
    done
    [ "${#pairs[@]}" -gt 2 ] || continue
    echo "== $name, all rounds"
    python3 scripts/compare_bench.py "${pairs[@]}"
  done
}

prepared() {
  [ -f "$AB/paths" ] || { echo "ab_bench.sh: no $AB/paths; run 'prepare REV' first" >&2; exit 2; }
}

case "${1:-}" in
  prepare) prepare "${2:?prepare REV}" ;;
  run) prepared; build_both "${2:?run OUTDIR [ROUNDS]}" && measure "$2" "${3:-1}" ;;
  build) prepared; build_both "${2:-build/ab-logs}" ;;
  measure) prepared; measure "${2:?measure OUTDIR [ROUNDS]}" "${3:-1}" ;;
  base) prepared; swap to_base ;;
  change) prepared; swap to_change ;;
  *) echo "usage: scripts/ab_bench.sh prepare REV | run OUTDIR [ROUNDS] | build [LOGDIR]" \
       "| measure OUTDIR [ROUNDS] | base | change" >&2
     exit 2 ;;
esac
