#!/usr/bin/env bash
# Runs every test: unit tests and the integration tests, which start a real
# master and real agents and run real processes. Needs root for the cgroup
# and run-as tests (CI runs as root).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/flotilla-target}"
exec cargo test --all-targets "$@"
