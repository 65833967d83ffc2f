#!/usr/bin/env bash
# Publishes examples/packages/platform as its own git repository at /tmp/miles-examples/platform
# (or $1), tagged v1.0.0, which team/miles.toml depends on. Then:
#   cd examples/packages/team && miles check recipes/team.miles && miles test ../platform
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=${1:-/tmp/miles-examples/platform}
rm -rf "$repo"
mkdir -p "$repo"
cp -r "$here/platform/." "$repo/"
cd "$repo"
git init -q
git -c init.defaultBranch=main checkout -q -b main 2>/dev/null || true
git add -A
git -c user.name=platform -c user.email=platform@example.com commit -qm "platform 1.0.0"
git tag v1.0.0
echo "published $repo at v1.0.0"
