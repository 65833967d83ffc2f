#!/usr/bin/env bash
# The GRPO comparison in one command: miles and TRL on recipes/compare-trl.miles, alternately over
# seeds, then the table (bench/peers/RESULTS-table.md) with the profile of our step.
#
#   bash bench/peers/run.sh [--recipe R] [--seeds N] [--threads N] [--steps N] [--threshold R]
#
# --recipe recipes/compare-trl-10m.miles: the same run at ~10M parameters (fewer steps), its table
# in bench/peers/RESULTS-table-10m.md and outputs in bench/out/peers-10m/ (the 0.1M ones untouched).
# ~10 min a seed on 2 shared cores.
# --recipe recipes/compare-trl-hf.miles: the same-model comparison: both sides start from ONE
# Hugging Face Llama checkpoint (recipes/data/compare-trl-init, from
# bench/peers/trl/make_same_model.py; rewritten when missing), table bench/peers/RESULTS-table-hf.md.
#
# Installs what it needs first: libtorch (scripts/setup-libtorch.sh), the release `miles`, the
# helpers in bench/peers/tools (own workspace), TRL in bench/out/trl-venv (~6 GB, git-ignored).
# Not part of `make test`. Takes ~15 min for 3 seeds on 2 shared cores, mostly TRL.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
[[ -f .libtorch/torch/lib/libtorch_cpu.so ]] || bash scripts/setup-libtorch.sh
cargo build --release --quiet --bin miles --bin miles-engine  # `miles run` execs miles-engine
cargo build --release --quiet --manifest-path bench/peers/tools/Cargo.toml
bash bench/peers/trl/setup.sh
python3 bench/peers/run.py --miles "$CARGO_TARGET_DIR/release/miles" --tools "$CARGO_TARGET_DIR/release" "$@"
