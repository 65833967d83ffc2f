#!/usr/bin/env bash
# Licences, bans and sources of every crate in Cargo.lock (deny.toml says what is allowed).
# Installs the pinned cargo-deny on first use. Advisories are not checked here: their database
# lives on GitHub, which CI cannot reach (docs/security.md).
set -euo pipefail
cd "$(dirname "$0")/.."
version=0.20.2
if ! cargo deny --version 2>/dev/null | grep -q "$version"; then
    cargo install cargo-deny --version "$version" --locked
fi
cargo deny check licenses bans sources
