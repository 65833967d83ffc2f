#!/usr/bin/env bash
# Builds what bench/gpu/run.sh runs on the GPU machine into .gpu/ (git-ignored), to be carried
# there: the release `miles` and `miles-engine`, the throughput and IPC benchmarks and the e2e test binary,
# stripped. They link libtorch 2.11.0 (scripts/setup-libtorch.sh), the version of the GPU
# machine's torch, and find it there through LD_LIBRARY_PATH (bench/gpu/run.sh sets it from that
# machine's Python); libtorch's CUDA half is loaded at run time (engine/tch/src/device.rs).
#
#   bash scripts/gpu-bundle.sh        # then: device run, carry [".gpu"], bash bench/gpu/run.sh $OUT
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
[[ -f .libtorch/torch/lib/libtorch_cpu.so ]] || bash scripts/setup-libtorch.sh
cargo build --release --quiet --bin miles --bin miles-engine
cargo build --release --quiet -p miles-tch --bench throughput
cargo build --release --quiet -p miles-cuda --bench ipc
# The NCCL channel's unit tests (engine/cuda and engine/workers), run by bench/gpu/run.sh.
unit() {
    cargo test --release --no-run -p "$1" --lib --message-format=json 2>/dev/null | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["lib"]:
        print(m["executable"])' | tail -1
}
cuda_tests=$(unit miles-cuda)
workers_tests=$(unit miles-workers)
# The GPU tests (the `gpu` module of the end-to-end test binary, tests/e2e/; run.sh runs `gpu::`);
# their path to `miles` is compiled in (CARGO_BIN_EXE_miles), so run.sh recreates this build's
# target directory on the GPU machine when the checkout lies elsewhere there.
tests=$(cargo test --release --no-run --test e2e --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "e2e":
        print(m["executable"])' | tail -1)
bench=$(ls -t "$CARGO_TARGET_DIR"/release/deps/throughput-* | grep -v '\.d$' | head -1)
ipc=$(ls -t "$CARGO_TARGET_DIR"/release/deps/ipc-* | grep -v '\.d$' | head -1)
[[ -x "$tests" && -x "$bench" && -x "$ipc" && -x "$cuda_tests" && -x "$workers_tests" ]] || { echo "gpu-bundle: error: the test or bench binary was not built" >&2; exit 1; }
rm -rf .gpu.tmp && mkdir -p .gpu.tmp
cp "$CARGO_TARGET_DIR/release/miles" "$CARGO_TARGET_DIR/release/miles-engine" .gpu.tmp/
cp "$tests" .gpu.tmp/gpu-tests
cp "$bench" .gpu.tmp/throughput
cp "$ipc" .gpu.tmp/ipc
cp "$cuda_tests" .gpu.tmp/cuda-tests
cp "$workers_tests" .gpu.tmp/workers-tests
strip .gpu.tmp/* 2>/dev/null || true
echo "$CARGO_TARGET_DIR/release" >.gpu.tmp/BUILD_DIR
grep -o "torch==[0-9.]*" .libtorch/.miles-libtorch-version | cut -d= -f3 >.gpu.tmp/TORCH_VERSION
rm -rf .gpu && mv .gpu.tmp .gpu
echo "gpu-bundle: $(du -sh .gpu | cut -f1) in .gpu/ (libtorch $(cat .gpu/TORCH_VERSION))"
