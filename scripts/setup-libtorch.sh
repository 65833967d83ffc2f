#!/usr/bin/env bash
# Installs the libtorch that tch 0.24 needs (2.11.0) into .libtorch/ at the repository root.
#
# Why 2.11.0: the GPU machine we measure on has torch 2.11.0+cu130 and no network; a binary built
# here against the same version runs there against that machine's libtorch (scripts/gpu-bundle.sh).
#
# Why a wheel: the registry has no CPU-only libtorch 2.11.0 and tch's download feature cannot reach
# its host, so we take the CUDA 13 torch wheel without its dependencies, plus the two small CUDA
# runtime packages that libtorch_cpu.so links against, and delete the CUDA-only libraries a CPU
# build never loads (1.1 GB -> ~0.57 GB). Versions are pinned by hash: with LIBTORCH pointing at a
# wheel, torch-sys does no version check of its own.
#
# Idempotent: a marker file records the installed versions; a second run is a fast no-op.
# Usage: scripts/setup-libtorch.sh [--force]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$ROOT/.libtorch"
MARKER="$DEST/.miles-libtorch-version"
WANT="torch==2.11.0 nvidia-cuda-runtime==13.0.96 nvidia-cuda-cupti==13.0.85"

die() {
    echo "setup-libtorch: error: $*" >&2
    exit 1
}

if [[ "${1:-}" != "--force" && -f "$MARKER" && "$(cat "$MARKER")" == "$WANT" \
    && -f "$DEST/torch/lib/libtorch_cpu.so" ]]; then
    echo "setup-libtorch: $DEST already holds $WANT"
    exit 0
fi

command -v python3 >/dev/null 2>&1 || die "python3 not found; it is needed to unpack the torch wheel"
python3 -m pip --version >/dev/null 2>&1 || die "python3 -m pip is not available; install pip"

# Install into a temporary directory next to the destination and rename at the end, so an
# interrupted run never leaves a half-populated .libtorch/ that looks complete.
TMP="$(mktemp -d "$ROOT/.libtorch.tmp.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT

REQ="$TMP/requirements.txt"
cat >"$REQ" <<'EOF'
torch==2.11.0 --hash=sha256:7aa2f9bbc6d4595ba72138026b2074be1233186150e9292865e04b7a63b8c67a \
    --hash=sha256:0f68f4ac6d95d12e896c3b7a912b5871619542ec54d3649cf48cc1edd4dd2756
nvidia-cuda-runtime==13.0.96 --hash=sha256:7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548
nvidia-cuda-cupti==13.0.85 --hash=sha256:4eb01c08e859bf924d222250d2e8f8b8ff6d3db4721288cf35d14252a4d933c8
EOF

echo "setup-libtorch: installing $WANT into $DEST (about 530 MB download)"
if ! python3 -m pip install --quiet --no-deps --no-compile --require-hashes \
    --target "$TMP/site" -r "$REQ"; then
    die "pip could not install the pinned torch wheel (network, disk space or hash mismatch?)"
fi

SITE="$TMP/site"
[[ -f "$SITE/torch/lib/libtorch_cpu.so" ]] || die "the wheel has no torch/lib/libtorch_cpu.so"

# CUDA-only libraries: a CPU build never loads them.
rm -f "$SITE"/torch/lib/libtorch_cuda*.so "$SITE"/torch/lib/libc10_cuda.so \
    "$SITE"/torch/lib/libtorch_nvshmem.so "$SITE"/torch/lib/libcaffe2_nvrtc.so \
    "$SITE"/torch/lib/libtorch_python.so
rm -f "$SITE"/nvidia/cu13/lib/libnvperf_*.so

echo "$WANT" >"$SITE/.miles-libtorch-version"
rm -rf "$DEST.old"
if [[ -e "$DEST" ]]; then
    mv "$DEST" "$DEST.old"
fi
mv "$SITE" "$DEST"
rm -rf "$DEST.old"
echo "setup-libtorch: done ($(du -sh "$DEST" | cut -f1) in $DEST)"
