#!/usr/bin/env bash
# `miles serve` load test (bench/RESULTS.md, "miles serve load test"): trains the tiny model of the
# end-to-end tests (seconds), serves it with the default limits, and runs bench/serve-load/load.rs
# against it for SECONDS (default 60). Everything it starts ends with it.
#   bash bench/serve-load/run.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
SECS=${1:-60}
WORK=${WORK:-/tmp/miles-serve-load}
cargo build --locked --bin miles --bin miles-engine
MILES=target/debug/miles
rm -rf "$WORK" && mkdir -p "$WORK"
# tests/common/tiny.rs's recipe: a one-layer model on one-digit addition.
cat > "$WORK/tiny.miles" <<'MILES'
import std/tasks/arith
model policy = transformer { layers = 1, d_model = 32, heads = 2, vocab = arith.vocab, max_len = 12 }
cluster laptop = local { cpus = 2 }
recipe tiny on laptop {
    warmup = sft(policy) { data = arith.addition { digits = 1 }, steps = 30.steps, lr = 3e-3 }
    rollout = generate(warmup) {
        prompts = arith.addition { digits = 1, split = train }
        samples_per_prompt = 4
        max_prompt_tokens = 6.tokens
        max_new_tokens = 3.tokens
    }
    reward = exact_match(rollout)
    train = grpo(rollout, reward) { rollout_batch = 8, global_batch = 32, micro_batch = 32, lr = 1e-3 }
    sync = weights(train -> rollout) { transport = local }
    stop = 2.steps
}
MILES
"$MILES" run "$WORK/tiny.miles" --out "$WORK/out" --threads 1 --progress off
env -u MILES_API_KEY "$MILES" serve "$WORK/out/model" --bind 127.0.0.1:0 --threads 1 2> "$WORK/serve.log" &
SERVER=$!
trap 'kill "$SERVER" 2>/dev/null || true' EXIT
URL=
for _ in $(seq 600); do
    URL=$(grep -o 'http://[0-9.:]*' "$WORK/serve.log" | head -1 || true)
    [ -n "$URL" ] && break
    kill -0 "$SERVER" 2>/dev/null || { cat "$WORK/serve.log"; exit 1; }
    sleep 0.1
done
[ -n "$URL" ] || { echo "miles serve did not start within 60 s"; cat "$WORK/serve.log"; exit 1; }
echo "miles serve on $URL; load for ${SECS} s"
# A dev build: the load generator only sends requests (and the server above is a dev build too).
cargo bench --locked --profile dev -p miles-workers --bench serve-load -- --url "$URL" --seconds "$SECS"
