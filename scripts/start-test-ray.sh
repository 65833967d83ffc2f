#!/usr/bin/env bash
# A single-node Ray head on 127.0.0.1 (Jobs API on :8265) for tests/e2e/ray.rs, with four fake GPUs.
# Idempotent: installs ray[default] in its own virtual environment if missing, starts the head if
# the Jobs API does not answer, and waits (bounded) until it does.
#   bash scripts/start-test-ray.sh          # start (or check) it
#   bash scripts/start-test-ray.sh stop     # stop it
set -euo pipefail
VENV=${MILES_RAY_VENV:-/opt/test-ray}
RAY_VERSION=2.60.0
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=1 RAY_USAGE_STATS_ENABLED=0

up() { python3 - <<'PY'
import sys, urllib.request
try:
    urllib.request.urlopen("http://127.0.0.1:8265/api/version", timeout=2)
except Exception:
    sys.exit(1)
PY
}

if [ "${1:-}" = stop ]; then
    [ -x "$VENV/bin/ray" ] && "$VENV/bin/ray" stop --force >/dev/null 2>&1 || true
    exit 0
fi
if ! "$VENV/bin/python" -c "import ray" >/dev/null 2>&1; then
    echo "start-test-ray: installing ray[default] $RAY_VERSION in $VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q "ray[default]==$RAY_VERSION"
fi
if up; then
    echo "test Ray up: http://127.0.0.1:8265"
    exit 0
fi
# From the venv's directory: the head's processes keep the directory they start in, and a job
# submission fails once it is gone (a test checkout deleted while the head runs on).
cd "$VENV"
"$VENV/bin/ray" start --head --node-ip-address=127.0.0.1 --dashboard-host=127.0.0.1 --dashboard-port=8265 \
    --num-cpus=4 --num-gpus=4 --include-dashboard=true --disable-usage-stats >/tmp/miles-test-ray.log 2>&1
for _ in $(seq 1 60); do
    if up; then
        echo "test Ray up: http://127.0.0.1:8265"
        exit 0
    fi
    sleep 1
done
echo "start-test-ray: the Jobs API did not answer within 60 s (log: /tmp/miles-test-ray.log)" >&2
exit 1
