#!/usr/bin/env bash
# moe-r3-laptop with the seeded MoE's new default q/k norm against qk_norm = false, fresh seeds 4-6.
# Usage: bash bench/moe/qknorm.sh [MILES_BINARY]   (runs/moe-qknorm; bench/RESULTS.md, "Hugging Face in and out")
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
MILES="${1:-target/release/miles}"
mkdir -p runs/moe-qknorm
for seed in 4 5 6; do
  for qk in true false; do
    name="qk$qk-s$seed"
    rm -rf runs/moe-qknorm/$name
    start=$(date +%s)
    "$MILES" run recipes/moe-r3-laptop.miles --out runs/moe-qknorm/$name --threads 1 --progress off \
      --set "seed=$seed" --set "policy.qk_norm=$qk" > runs/moe-qknorm/$name.log 2>&1
    echo "$name rc=$? $(( $(date +%s) - start ))s" >> runs/moe-qknorm/times.txt
  done
done
python3 bench/moe/qknorm.py runs/moe-qknorm
