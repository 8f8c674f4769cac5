#!/usr/bin/env bash
# The supervision soak (issue 23; RELIABILITY.md quotes its figures):
# `flotilla bench` rounds against one master while a random actor or task
# is killed every few seconds; at the end every operation has ended, no
# cluster is busy, and flotilla_live_tasks is back to its idle value.
# Arguments go to scripts/soak.py (--minutes 30 --kill-every 4 ...).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/flotilla-target}"
# The test profile's build (one profile for tests, clippy and dev runs).
cargo build --quiet --all-targets
# Under the host's triple (.cargo/config.toml builds for it explicitly).
host="$(rustc -vV | sed -n 's/^host: //p')"
exec python3 scripts/soak.py --bin "$CARGO_TARGET_DIR/$host/debug/flotilla" "$@"
