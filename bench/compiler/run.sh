#!/usr/bin/env bash
# The compiler benchmark: a generated 10,000-line library of 100 modules, `miles check` on it
# (release build), with `miles --version` and `jq` on a JSON file of the same size measured in
# the same run. Figures go to bench/RESULTS.md by hand, with the date and machine.
#   bash bench/compiler/run.sh [RUNS]        (needs python3 and jq: apt-get install -y jq)
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v jq >/dev/null || { echo "needs jq (apt-get install -y jq)" >&2; exit 1; }
cargo build --release --locked -p miles >&2
out=bench/out/compiler
rm -rf "$out" && mkdir -p "$out/lib"
python3 bench/compiler/gen.py "$out/lib"
target=${CARGO_TARGET_DIR:-target}
python3 bench/compiler/bench.py "$target/release/miles" "$out/lib" "${1:-15}"
