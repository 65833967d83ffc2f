#!/usr/bin/env bash
# A private virtual environment for the reasoning-gym task of the algorithms bench: the dataset
# generator (make_data.py) and the reward program (score.py) import `reasoning_gym` from it.
# Idempotent: a venv that already imports the pinned version is left alone.
#
#   bash bench/algorithms/rgym/setup.sh        # -> bench/out/rgym-venv (git-ignored)
#
# Override the location with RGYM_VENV=DIR (recipes/rgym-laptop.miles names the default path).
set -euo pipefail

# Pinned: the generators' output (and so recipes/data/rgym/) depends on the version.
RGYM_VERSION=0.1.25
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
venv=${RGYM_VENV:-$root/bench/out/rgym-venv}
# Written last: a venv without it is a half-made install (interrupted) and is made again.
marker=$venv/.rgym-$RGYM_VERSION

if [[ -f $marker ]] && "$venv/bin/python" -c "import reasoning_gym" >/dev/null 2>&1; then
    echo "rgym setup: reasoning-gym $RGYM_VERSION present in $venv"
    exit 0
fi
command -v python3 >/dev/null 2>&1 || { echo "rgym setup: no python3 on PATH" >&2; exit 1; }
echo "rgym setup: installing reasoning-gym $RGYM_VERSION in $venv"
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check "reasoning-gym==$RGYM_VERSION"
"$venv/bin/python" -c "import reasoning_gym" || { echo "rgym setup: reasoning_gym does not import" >&2; exit 1; }
touch "$marker"
echo "rgym setup: ready (reasoning-gym $("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("reasoning-gym"))'))"
