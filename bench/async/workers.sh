#!/usr/bin/env bash
# The laptop GRPO recipe (recipes/grpo-laptop.miles) under fully_async { max_staleness = 1 } in
# three set-ups, seeds 1-3, one run after the other:
#  - inproc: in process (the embedded backend);
#  - workers: two rollout engines as worker processes (launcher = local_processes { engines = 2 }),
#    weights by `transport = broadcast, bucket = 4.MB` with the default `channel = auto`: shared
#    memory here, as every worker listens on loopback (the launcher's default bind, 127.0.0.1) on
#    this host, so sync.jsonl says `broadcast/shm`; auto falls back to TCP only on a host without
#    /dev/shm;
#  - serve: `miles serve` as the engine (engine = sglang { url }), each update a checkpoint
#    directory the server loads through /update_weights_from_disk.
# Held-out accuracy at the RL start and the end, wall time and the async metrics. Output in
# bench/out/async-workers/.
#
#   bash bench/async/workers.sh [MILES_BINARY]     (default: target/release/miles, built first)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
miles="${1:-}"
if [[ -z "$miles" ]]; then
    cargo build --release --bins
    miles="${CARGO_TARGET_DIR:-target}/release/miles"
fi
out=bench/out/async-workers
rm -rf "$out"
mkdir -p "$out"
schedule='schedule=fully_async { max_staleness = 1 }'

# The server needs a model of the recipe's shape to start from; the run pushes its own weights
# after the SFT warm-up.
"$miles" run recipes/grpo-laptop.miles --set stop=1.steps --threads 1 --progress off --out "$out/seed-model" 2>/dev/null
"$miles" serve "$out/seed-model/model" --bind 127.0.0.1:0 --threads 1 --weights-dir "$root/$out" 2> "$out/serve.log" &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
    url=$(grep -o 'http://[0-9.:]*' "$out/serve.log" | head -1 || true)
    [[ -n "$url" ]] && break
    sleep 0.1
done
[[ -n "$url" ]] || { echo "miles serve did not start: $(cat "$out/serve.log")" >&2; exit 1; }

names=()
for seed in 1 2 3; do
    base="$out/seed$seed.miles"
    sed "s/^    seed = 1$/    seed = $seed/" recipes/grpo-laptop.miles > "$base"
    sed -e 's/{ transport = local }/{ transport = broadcast, bucket = 4.MB }/' \
        -e "s/^    seed = $seed$/    launcher = local_processes { engines = 2 }\n    seed = $seed/" "$base" > "$out/workers-s$seed.miles"
    sed -e 's/{ transport = local }/{}/' \
        -e "s|^    rollout = generate(warmup) {|    rollout = generate(warmup) {\n        engine = sglang { url = \"$url\" }|" "$base" > "$out/serve-s$seed.miles"
    for setup in inproc workers serve; do
        recipe="$base"
        [[ $setup != inproc ]] && recipe="$out/$setup-s$seed.miles"
        n="$setup-s$seed"
        names+=("$n")
        echo "== $n: load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
        "$miles" run "$recipe" --set "$schedule" --threads 1 --progress off --out "$out/$n" 2>&1 | tail -1 | tee "$out/$n.log" >&2
    done
done
python3 - "$out" "${names[@]}" <<'PY'
import json, statistics, sys
out, names = sys.argv[1], sys.argv[2:]
print("| run | held-out start -> end | gain | wall | median step | gen / train per step | staleness drawn (mean) | weight swaps |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
gains = {}
for n in names:
    rows = [json.loads(l) for l in open(f"{out}/{n}/metrics.jsonl")]
    steps = [r for r in rows if "train/loss" in r]
    evals = sorted((r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r)
    start, end = evals[0][1], evals[-1][1]
    gains.setdefault(n.split("-")[0], []).append(100 * (end - start))
    med = lambda k: statistics.median(r[k] for r in steps if k in r) if any(k in r for r in steps) else float("nan")
    fa = "rollout/fully_async/"
    wall = open(f"{out}/{n}.log").read()
    wall = wall.split(" steps in ")[1].split(" s")[0] if " steps in " in wall else "?"
    swaps = sum(r.get(fa + "weight_swaps", 0) for r in steps)
    print(f"| {n} | {100*start:.1f}% -> {100*end:.1f}% | {100*(end-start):+.1f} | {wall} s | {med('perf/step_s'):.3f} s "
          f"| {med('perf/gen_s'):.3f} / {med('perf/train_s'):.3f} s | {med(fa+'staleness_drawn_mean'):.2f} | {swaps} |")
print()
for k, g in gains.items():
    print(f"{k}: gain {statistics.mean(g):+.1f} +- {statistics.stdev(g):.1f} over seeds 1-3")
PY
