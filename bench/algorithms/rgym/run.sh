#!/usr/bin/env bash
# recipes/rgym-laptop.miles over three seeds, then the held-out accuracy curves (summary.py).
# From the repository's root: bash bench/algorithms/rgym/run.sh  (outputs in bench/out/rgym-s*)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
bash bench/algorithms/rgym/setup.sh
cargo build --release --locked --bin miles --bin miles-engine
for seed in 1 2 3; do
    rm -rf "bench/out/rgym-s$seed"
    start=$(date +%s)
    # Bounded: a run that hangs is stopped (a healthy one takes minutes).
    timeout 1800 ./target/release/miles run recipes/rgym-laptop.miles --out "bench/out/rgym-s$seed" --progress off --set "seed=$seed"
    echo "seed $seed: $(($(date +%s) - start)) s wall"
done
python3 bench/algorithms/rgym/summary.py bench/out/rgym-s1 bench/out/rgym-s2 bench/out/rgym-s3
