#!/usr/bin/env bash
# Installs what the test suite drives for real: Chromium (the plan's HTML page is rendered
# headless), Neovim (a scripted language-server session), a single-node Slurm and a Ray head
# (launcher tests). Skips what is present, so a second run is a no-op. Needs root (CI and the developers' machines run as root).
set -euo pipefail

need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v nvim >/dev/null 2>&1 || need+=(neovim)

if [[ ${#need[@]} -eq 0 ]]; then
    echo "setup-test-deps: chromium and neovim present"
elif [[ $(id -u) -ne 0 ]]; then
    echo "setup-test-deps: need ${need[*]} but not root; the tests that use them will say they skipped" >&2
else
    echo "setup-test-deps: installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# A single-node Slurm cluster on 127.0.0.1 with fake GPUs, for tests/e2e/slurm.rs (idempotent;
# the tests skip with a printed reason when it is absent).
if [[ $(id -u) -eq 0 ]]; then
    bash "$(dirname "${BASH_SOURCE[0]}")/start-test-slurm.sh" || echo "setup-test-deps: no test Slurm; tests/e2e/slurm.rs will skip" >&2
fi

# A single-node Ray head on 127.0.0.1 (ray[default] in its own virtual environment), for
# tests/e2e/ray.rs (idempotent; the test skips with a printed reason when it is absent).
if command -v python3 >/dev/null 2>&1; then
    bash "$(dirname "${BASH_SOURCE[0]}")/start-test-ray.sh" || echo "setup-test-deps: no test Ray; tests/e2e/ray.rs will skip" >&2
fi

# openenv-core in its own virtual environment, for engine/runtime/tests/integration/openenv.rs (a
# real OpenEnv server on 127.0.0.1; the test skips with a printed reason when it is absent). Only
# what its server imports is installed (not gradio, the optional web UI), which keeps the install
# short.
openenv_venv=${MILES_OPENENV_VENV:-/opt/miles-openenv}
if "$openenv_venv/bin/python" -c "import openenv.core.env_server" >/dev/null 2>&1; then
    echo "setup-test-deps: openenv-core present in $openenv_venv"
elif ! command -v python3 >/dev/null 2>&1; then
    echo "setup-test-deps: no python3; engine/runtime/tests/integration/openenv.rs will skip" >&2
else
    echo "setup-test-deps: installing openenv-core 0.3.0 in $openenv_venv"
    { python3 -m venv "$openenv_venv" \
        && "$openenv_venv/bin/pip" install -q --no-deps openenv-core==0.3.0 \
        && "$openenv_venv/bin/pip" install -q fastapi uvicorn pydantic websockets fastmcp requests; } \
        || echo "setup-test-deps: openenv-core not installed; engine/runtime/tests/integration/openenv.rs will skip" >&2
fi

# Real OpenAI-API clients in their own virtual environment, for tests/e2e/real_clients.rs: the
# `openai` SDK, `verifiers` (environments the `verifiers` env kind runs) and smolagents (a third
# agent framework, through its OpenAIServerModel), and uv, which verifiers' harnesses and tool
# servers run their programs with. smolagents because it adds two packages to what
# verifiers already installs, where openai-agents and pydantic-ai need openai 3, which verifiers
# 0.4 refuses, and langchain-openai adds a dozen. The tests skip with a printed reason when it is
# absent.
agents_venv=${MILES_AGENTS_VENV:-/opt/miles-agents}
if "$agents_venv/bin/python" -c "import openai, verifiers.v1, smolagents" >/dev/null 2>&1 && [[ -x $agents_venv/bin/uv ]]; then
    echo "setup-test-deps: openai, verifiers and smolagents present in $agents_venv"
elif ! command -v python3 >/dev/null 2>&1; then
    echo "setup-test-deps: no python3; tests/e2e/real_clients.rs will skip" >&2
else
    echo "setup-test-deps: installing openai 2.54.0, verifiers 0.4.0, smolagents 1.26.0 and uv 0.13.9 in $agents_venv"
    { python3 -m venv "$agents_venv" \
        && "$agents_venv/bin/pip" install -q openai==2.54.0 verifiers==0.4.0 smolagents==1.26.0 uv==0.13.9; } \
        || echo "setup-test-deps: agent clients not installed; tests/e2e/real_clients.rs will skip" >&2
fi
