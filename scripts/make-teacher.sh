#!/usr/bin/env bash
# Writes the OPD teachers under recipes/data/ (run by hand from the repository root; CI never runs
# it). Another machine's libtorch gives other bytes (runs are deterministic per machine, not across
# them), so the figures below are this repository's machines'.
#   scripts/make-teacher.sh          recipes/data/teacher-reverse/: the laptop GRPO recipe's final
#                                    model (seed 1, 300 steps; 88.0% held-out exact match), the
#                                    student's own shape: recipes/opd-length-laptop.miles starts
#                                    from it
#   scripts/make-teacher.sh long     recipes/data/teacher-reverse-900/: the same recipe and shape
#                                    trained for 900 steps (94.0% held-out): the teacher of
#                                    recipes/opd-laptop.miles
set -euo pipefail
cargo build --release --bins
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
case "${1:-}" in
    "")
        ./target/release/miles run recipes/grpo-laptop.miles --out "$OUT/run" --threads 1 --progress off --set seed=1
        DEST=recipes/data/teacher-reverse
        ;;
    long)
        ./target/release/miles run recipes/grpo-laptop.miles --out "$OUT/run" --threads 1 --progress off --set seed=1 \
            --set stop=900.steps --set eval.every=100.steps
        DEST=recipes/data/teacher-reverse-900
        ;;
    *)
        echo "usage: scripts/make-teacher.sh [long]" >&2
        exit 2
        ;;
esac
rm -rf "$DEST"
cp -r "$OUT/run/model" "$DEST"
