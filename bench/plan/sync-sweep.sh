#!/usr/bin/env bash
# Weight-sync time against fleet width, as `miles plan` reports it (issue #17): broadcast and
# P2P for one model on N H100 nodes per side (equal fleets, 1 GB buckets), plus the one-node case
# (trainer and engines on 4 + 4 GPUs of the same node).
#   bash bench/plan/sync-sweep.sh [path/to/miles]   (default target/release/miles, else debug)
# Prints a Markdown table for bench/RESULTS.md.
set -euo pipefail
miles=${1:-}
if [[ -z $miles ]]; then
    if [[ -x target/release/miles ]]; then miles=target/release/miles; else miles=target/debug/miles; fi
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

# recipe MODEL ENGINE_PRECISION TRAIN_GPUS ENGINE_GPUS ENGINE_TP EP CLUSTER_GPUS PP
recipe() {
    cat <<MILES
import std/hardware { h100 }
import std/models { $1 }
import std/tasks/arith
cluster fleet = h100 * $7
recipe sweep on fleet {
    rollout = generate($1) {
        prompts = arith.addition {}
        max_new_tokens = 4096.tokens
        engine = sglang { gpus = $4, tp = $5, precision = $2 }
    }
    reward = exact_match(rollout)
    train = grpo(rollout, reward) {
        backend = megatron { gpus = $3, tp = 1, pp = $8, ep = $6, recompute = full }
        optimizer = adam { state = stream_from_disk }
    }
    sync = weights(train -> rollout) { transport = broadcast, bucket = 1.GB }
}
MILES
}

# row LABEL MODEL PRECISION TRAIN_GPUS ENGINE_GPUS ENGINE_TP EP CLUSTER_GPUS PP
row() {
    recipe "$2" "$3" "$4" "$5" "$6" "$7" "$8" "$9" > "$dir/r.miles"
    # Plan errors (a model too big for its GPUs) do not stop the sync estimate; keep the JSON.
    "$miles" plan --format json "$dir/r.miles" > "$dir/p.json" 2>/dev/null || true
    if ! jq -e '.syncs[0]' "$dir/p.json" > /dev/null 2>&1; then
        echo "| $1 | TP$6 | (recipe does not check) | | | | |"
        return
    fi
    jq -r --arg l "$1" --arg tp "$6" '.syncs[0] as $s
        | ($s.alternatives[] | select(.transport == "p2p") | .seconds) as $p
        | "| \($l) | TP\($tp) | \($s.bytes / 1e9 | floor) GB | \($s.estimate.seconds * 10 | round / 10) s | \($p * 10 | round / 10) s | \(if $p < $s.estimate.seconds then "p2p" else "broadcast" end) | \(if .summary.errors > 0 then "no (\(.summary.errors) errors)" else "yes" end) |"' \
        "$dir/p.json"
}

echo "| fleet | engine | bytes | broadcast | p2p | faster | plan fits |"
echo "|---|---|---|---|---|---|---|"
for m in "qwen3_30b_a3b bf16 1 8 1" "qwen3_235b_a22b bf16 8 8 4" "kimi_k2 fp8_blockwise 16 8 8"; do
    set -- $m
    model=$1 prec=$2 maxtp=$3 ep=$4 pp=$5
    echo "| **$model** | | | | | | |"
    one_tp=$(( maxtp < 4 ? maxtp : 4 ))
    row "1 node (4 + 4 GPUs)" "$model" "$prec" 4 4 "$one_tp" 4 8 1
    for n in 1 2 4 8 16 32; do
        g=$(( 8 * n ))
        tp=$(( maxtp < g ? maxtp : g ))
        tpp=$(( pp < g ? pp : g ))
        tep=$(( ep < g / tpp ? ep : g / tpp ))
        row "$n node(s) per side" "$model" "$prec" "$g" "$g" "$tp" "$tep" $(( 2 * g )) "$tpp"
    done
done
