#!/usr/bin/env bash
# Installs TRL into a private virtual environment under bench/out/ (git-ignored, outside `make
# test`). The registry has only CUDA builds of torch, so this pulls ~6 GB of CUDA packages that a
# CPU run never loads; that is the cost of the peer, recorded in bench/RESULTS.md.
#
# Usage: bash bench/peers/trl/setup.sh        (idempotent: a finished install is kept)
# Pinned: bench/peers/trl/requirements.txt when present (the resolved set of the measured run),
# else trl==1.16.0 and whatever pip resolves (then frozen into bench/out/trl-venv/freeze.txt).
set -euo pipefail
root="$(cd "$(dirname "$0")/../../.." && pwd)"
venv="$root/bench/out/trl-venv"
stamp="$venv/.miles-trl-ok"
if [[ -f "$stamp" ]]; then
    echo "TRL venv ready: $venv ($(cat "$stamp"))"
    exit 0
fi
mkdir -p "$root/bench/out"
t0=$(date +%s)
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
req="$root/bench/peers/trl/requirements.txt"
if [[ -f "$req" ]]; then
    "$venv/bin/python" -m pip install --quiet --no-compile -r "$req"
else
    "$venv/bin/python" -m pip install --quiet --no-compile "trl==1.16.0"
fi
"$venv/bin/python" -m pip freeze > "$venv/freeze.txt"
t1=$(date +%s)
size=$(du -sh "$venv" | cut -f1)
"$venv/bin/python" -c "import trl, transformers, torch; print('trl', trl.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)"
echo "install $((t1 - t0)) s, $size" | tee "$stamp"
