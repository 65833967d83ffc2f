#!/usr/bin/env bash
# Writes recipes/data/teacher-reverse/: the teacher of recipes/opd-laptop.miles, the laptop GRPO
# recipe's final model (seed 1, 300 steps; 88.0% held-out exact match on this machine,
# bench/RESULTS.md "GRPO learns"). Run by hand from the repository root; CI never runs it. Another
# machine's libtorch gives other bytes (runs are deterministic per machine, not across them).
set -euo pipefail
cargo build --release --bins
OUT="$(mktemp -d)"
./target/release/miles run recipes/grpo-laptop.miles --out "$OUT/run" --threads 1 --progress off --set seed=1
rm -rf recipes/data/teacher-reverse
cp -r "$OUT/run/model" recipes/data/teacher-reverse
rm -rf "$OUT"
