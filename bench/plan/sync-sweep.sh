#!/usr/bin/env bash
# Weight-sync time against fleet width and engine TP, as `miles plan` reports it (issues #17,
# #38): broadcast and P2P for one model on N H100 nodes per side (equal fleets, 1 GB buckets,
# Megatron layouts as Miles publishes them for the model's size), plus the one-node case
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

# recipe MODEL ENGINE_PRECISION TRAIN_GPUS ENGINE_GPUS ENGINE_TP EP CLUSTER_GPUS PP TRAIN_TP
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
        backend = megatron { gpus = $3, tp = ${9}, pp = $8, ep = $6, recompute = full }
        optimizer = adam { state = stream_from_disk }
    }
    sync = weights(train -> rollout) { transport = broadcast, bucket = 1.GB }
}
MILES
}

# row LABEL MODEL PRECISION TRAIN_GPUS ENGINE_GPUS ENGINE_TP EP CLUSTER_GPUS PP TRAIN_TP
row() {
    recipe "$2" "$3" "$4" "$5" "$6" "$7" "$8" "$9" "${10}" > "$dir/r.miles"
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
# model, engine precision, trainer TP, PP and EP at full width, engine TPs to try
for m in "qwen3_30b_a3b bf16 4 1 8 1,8" "qwen3_235b_a22b bf16 4 4 16 8,32" "kimi_k2 fp8_blockwise 8 8 32 16,32"; do
    set -- $m
    model=$1 prec=$2 ttp=$3 pp=$4 ep=$5 tps=$6
    echo "| **$model** | | | | | | |"
    row "1 node (4 + 4 GPUs)" "$model" "$prec" 4 4 4 $(( ep < 4 ? ep : 4 )) 8 1 $(( ttp < 4 ? ttp : 4 ))
    for n in 1 2 4 8 16 32; do
        g=$(( 8 * n ))
        tpp=$(( pp < g / ttp ? pp : g / ttp ))
        tep=$(( ep < g / tpp ? ep : g / tpp ))
        for etp in ${tps//,/ }; do
            (( etp <= g )) || continue
            row "$n node(s) per side" "$model" "$prec" "$g" "$g" "$etp" "$tep" $(( 2 * g )) "$tpp" "$ttp"
        done
    done
done
