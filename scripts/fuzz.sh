#!/usr/bin/env bash
# Fuzzes every target of fuzz/ for a bounded time (FUZZ_SECONDS each, 15
# by default), starting from the seeds (fuzz/make_seeds.py: the tar
# advisories' proofs of concept) and from every crash kept in
# fuzz/regressions/<target>/, which libFuzzer runs first: a crash found
# once fails every later run until it is fixed. A new crash is copied
# there by this script, so it is kept as a regression test.
#
# The fuzz build has its own target dir (coverage flags on every crate).
# RocksDB's C++ (~35 minutes on 2 cores) is not compiled a second time: the
# fuzz build links the static library the test build made (`librocksdb-sys`
# honours ROCKSDB_LIB_DIR with ROCKSDB_STATIC; same Cargo.lock, so the same
# RocksDB and headers). No fuzz target reaches RocksDB; only the link needs
# it. Without a test build (run scripts/test.sh first) it compiles its own.
set -euo pipefail
tests_target="${CARGO_TARGET_DIR:-$HOME/.cache/flotilla-target}"
cd "$(dirname "$0")/../fuzz"
export CARGO_TARGET_DIR="${FLOTILLA_FUZZ_TARGET_DIR:-$HOME/.cache/flotilla-fuzz-target}"
if [ -z "${ROCKSDB_LIB_DIR:-}" ]; then
  # Under the host's triple (.cargo/config.toml), or directly (older builds).
  lib="$(ls -t "$tests_target"/*/debug/build/librocksdb-sys-*/out/librocksdb.a \
    "$tests_target"/debug/build/librocksdb-sys-*/out/librocksdb.a 2>/dev/null | head -n 1 || true)"
  if [ -n "$lib" ]; then
    export ROCKSDB_LIB_DIR="$(dirname "$lib")" ROCKSDB_STATIC=1
    echo "fuzz: linking the test build's RocksDB ($lib)"
  else
    echo "fuzz: no test build of RocksDB under $tests_target; compiling it (~35 min)"
  fi
fi
# cargo-fuzz builds with nightly-only flags (-Z sanitizer options).
rustup run nightly rustc --version >/dev/null 2>&1 || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked --version 0.13.2
seconds="${FUZZ_SECONDS:-15}"
python3 make_seeds.py seeds/tar_policy
mkdir -p seeds/component_toml
for spec in ../examples/components/*/component.toml; do
  cp "$spec" "seeds/component_toml/$(basename "$(dirname "$spec")").toml"
done
# Templates that, unbounded, take the master's memory (issue 22, item 3):
# the renderer must refuse each within its budget.
cp hostile_templates/*.toml seeds/component_toml/
# Build and run with the same flags, or the run rebuilds. 16 codegen units
# (cargo-fuzz's default is 1 in release) and fuzz/Cargo.toml's -O1: see there.
flags=(--sanitizer none --codegen-units 16)
cargo +nightly fuzz build "${flags[@]}"
status=0
for target in frame_decoder tar_policy component_toml api_bodies beneath; do
  mkdir -p "corpus/$target" "regressions/$target" "seeds/$target" "artifacts/$target"
  echo "fuzz: $target for ${seconds}s"
  if ! cargo +nightly fuzz run "${flags[@]}" "$target" "corpus/$target" "seeds/$target" "regressions/$target" -- \
      -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1; then
    echo "fuzz: $target FAILED; the input is kept in fuzz/regressions/$target" >&2
    cp -n artifacts/"$target"/* "regressions/$target/" 2>/dev/null || true
    status=1
  fi
done
exit "$status"
