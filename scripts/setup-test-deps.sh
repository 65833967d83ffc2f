#!/usr/bin/env bash
# Installs the Debian packages the test suite drives for real: Chromium (the plan's HTML page is
# rendered headless), Neovim (a scripted language-server session). Skips what is present, so a
# second run is a no-op. Needs root (CI and the developers' machines run as root).
set -euo pipefail

need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v nvim >/dev/null 2>&1 || need+=(neovim)

if [[ ${#need[@]} -eq 0 ]]; then
    echo "setup-test-deps: all present"
    exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
    echo "setup-test-deps: need ${need[*]} but not root; the tests that use them will say they skipped" >&2
    exit 0
fi
echo "setup-test-deps: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
