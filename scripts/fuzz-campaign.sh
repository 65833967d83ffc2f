#!/usr/bin/env bash
# One bounded campaign per cargo-fuzz target (fuzz/): SECONDS_EACH seconds each (default 180),
# seeded once into fuzz/corpus/<target> (not committed) from the repository's recipes, manifests,
# fixture safetensors headers and chat templates, and a lock and /generate bodies written here.
# Prints one line per target: executions, seconds, corpus size, and whether a crash was found.
# Needs nightly and cargo-fuzz (fuzz/README.md).
set -uo pipefail
cd "$(dirname "$0")/.."
secs="${1:-180}"
targets="${2:-check lock manifest safetensors_header chat_template generate_request}"
cargo +nightly fuzz build -O >/dev/null 2>&1 || { echo "cargo fuzz build failed"; exit 1; }
# Seeds, once: real inputs of each kind from the repository.
seed() { [[ -d fuzz/corpus/$1 && -n $(ls -A "fuzz/corpus/$1") ]] && return 1; mkdir -p "fuzz/corpus/$1"; }
if seed check; then cp recipes/*.miles tests/cases/*.miles fuzz/corpus/check/; fi
if seed manifest; then find examples tests -name miles.toml | while read -r f; do cp "$f" "fuzz/corpus/manifest/$(echo "$f" | tr / _)"; done; fi
if seed lock; then printf '%s\n' 'version = 1' '' '[[package]]' 'name = "platform"' 'version = "1.2.0"' \
    'source = "git+https://example.com/team/platform.git"' 'reference = "tag:v1.2.0"' \
    'commit = "0123456789abcdef0123456789abcdef01234567"' \
    'hash = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"' \
    'dependencies = []' >fuzz/corpus/lock/seed0; fi
seed safetensors_header && python3 - <<'PY'
import glob, struct
k = 0
for f in glob.glob("tests/**/*.safetensors", recursive=True):
    b = open(f, "rb").read()
    if len(b) < 8: continue
    n = struct.unpack("<Q", b[:8])[0]
    if n > min(len(b), 1 << 20): continue
    open(f"fuzz/corpus/safetensors_header/seed{k}", "wb").write(b[:8 + n + 64]); k += 1
    if k == 8: break
PY
seed chat_template && python3 - <<'PY'
import glob, json
for k, f in enumerate(glob.glob("tests/**/tokenizer_config.json", recursive=True) + glob.glob("recipes/data/*/tokenizer_config.json")):
    t = json.load(open(f)).get("chat_template")
    if isinstance(t, str): open(f"fuzz/corpus/chat_template/seed{k}", "w").write(t)
PY
if seed generate_request; then
    echo '{"input_ids": [1, 2, 3]}' >fuzz/corpus/generate_request/seed0
    echo '{"input_ids": [[1, 2], [3]], "sampling_params": {"n": 4, "max_new_tokens": 8}}' >fuzz/corpus/generate_request/seed1
    echo '{"input_ids": [[1], [2]], "sampling_params": [{"n": 2, "temperature": 0.5}, {"n": 2, "top_k": 1}]}' >fuzz/corpus/generate_request/seed2
fi
for t in $targets; do
    mkdir -p "fuzz/corpus/$t"
    dict=(); [[ $t == check ]] && dict=(-dict=fuzz/miles.dict)
    log="$(mktemp)"
    cargo +nightly fuzz run -O "$t" "fuzz/corpus/$t" -- -max_total_time="$secs" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 "${dict[@]}" >"$log" 2>&1
    rc=$?
    execs="$(grep -a -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)"
    [[ -z $execs ]] && execs="$(grep -a -o '#[0-9]*' "$log" | tail -1 | tr -d '#')"
    crash="none"; [[ $rc -ne 0 ]] && crash="FOUND (exit $rc, see $log)"
    echo "$t: ${execs:-?} executions in ${secs} s, corpus $(ls "fuzz/corpus/$t" | wc -l) inputs, crash: $crash"
done
