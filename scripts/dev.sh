#!/usr/bin/env bash
# Runs `flotilla dev`: a master and three agents on loopback, the example
# packages loaded. Extra arguments go to `flotilla dev` (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/flotilla-target}"
exec cargo run --quiet -- dev "$@"
