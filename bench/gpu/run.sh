#!/usr/bin/env bash
# One call on the GPU machine (under ~8 minutes): the GPU tests, the laptop GRPO recipe on CUDA
# against the CPU (tests/e2e/gpu.rs), a ~0.5B decoder's generation and training throughput with MFU
# against the same run's bf16 matmul peak (bench/tch/throughput.rs --device cuda), and a 1 GB CUDA
# IPC hand-off between two processes against a device-to-device copy (bench/gpu/ipc.rs). Writes its
# figures to the folder it is given (at most 8 files: what the device tool brings back).
#
# Here:   bash scripts/gpu-bundle.sh
# There:  device run, carry [".gpu"], command: bash bench/gpu/run.sh $OUT
#
# The NCCL weight channel's unit tests run on any GPU count: with one GPU they check the library,
# a one-rank communicator, the bounded join and the refusal of two ranks on one GPU; the
# trainer-to-engine broadcast itself needs two GPUs and is skipped, with the reason, below that.
# Record the results in bench/RESULTS.md with the date.
set -uo pipefail
out="${1:?usage: bench/gpu/run.sh OUT_DIR}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
mkdir -p "$out"
log="$out/summary.txt"
say() { echo "$*" | tee -a "$log"; }

[[ -x .gpu/miles-engine ]] || { say "error: .gpu/ is missing: run scripts/gpu-bundle.sh here and carry .gpu"; exit 1; }
want="$(cat .gpu/TORCH_VERSION)"
torch_dir="$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))' 2>/dev/null)" \
    || { say "error: this machine's python3 has no torch: miles needs libtorch $want's libraries"; exit 1; }
have="$(python3 -c 'import torch; print(torch.__version__)')"
if [[ "${have%%+*}" != "$want" ]]; then
    say "error: this machine's torch is $have; miles was built against libtorch $want (scripts/setup-libtorch.sh pins it)"
    exit 1
fi
site="$(dirname "$torch_dir")"
libs="$torch_dir/lib"
for d in "$site"/nvidia/*/lib "$site"/nvidia/cu13/lib; do [[ -d "$d" ]] && libs="$libs:$d"; done
export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The tests call `miles` where it was built (CARGO_BIN_EXE_miles): recreate that path here.
build="$(cat .gpu/BUILD_DIR)"
if [[ ! -x "$build/miles" ]]; then
    mkdir -p "$build"
    ln -sf "$root/.gpu/miles" "$build/miles"
    ln -sf "$root/.gpu/miles-engine" "$build/miles-engine"
fi

{
    date -u +"%Y-%m-%d %H:%M UTC"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    echo "torch $have at $torch_dir"
} >"$out/env.txt" 2>&1
cat "$out/env.txt" >>"$log"

say "== GPU tests (tests/e2e/gpu.rs), the laptop recipe on CPU and CUDA"
start=$(date +%s)
MILES_GPU_OUT="$out" timeout 300 .gpu/gpu-tests gpu:: --test-threads 1 --nocapture >"$out/tests.log" 2>&1
say "tests: exit $? in $(( $(date +%s) - start )) s (log: tests.log)"
grep -E "^test |held-out accuracy|skipped" "$out/tests.log" | tee -a "$log"

say "== throughput of a ~0.5B decoder (bench/tch/throughput.rs --device cuda)"
timeout 180 .gpu/throughput --device cuda >"$out/throughput.txt" 2>&1
say "throughput: exit $?"
cat "$out/throughput.txt" >>"$log"

say "== CUDA IPC hand-off, 1 GB (bench/gpu/ipc.rs)"
timeout 120 .gpu/ipc --gb 1 >"$out/ipc.txt" 2>&1
say "ipc: exit $?"
cat "$out/ipc.txt" >>"$log"

say "== NCCL weight channel (engine/cuda/src/nccl.rs, engine/workers/src/nccl.rs)"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
nccl_log="$(mktemp)"
timeout 120 .gpu/cuda-tests nccl --test-threads 1 --nocapture >"$nccl_log" 2>&1
say "nccl (cuda): exit $?"
timeout 180 .gpu/workers-tests nccl --test-threads 1 --nocapture >>"$nccl_log" 2>&1
say "nccl (workers): exit $?"
if (( gpus < 2 )); then
    say "nccl broadcast trainer -> engine: skipped: $gpus GPU visible; NCCL needs one GPU per rank"
fi
grep -E "^test |skipped|panicked|assert" "$nccl_log" >>"$log"
rm -f "$nccl_log"
