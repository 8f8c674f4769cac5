#!/usr/bin/env bash
# Installs what building and testing flotilla needs on a Debian machine:
# libclang (RocksDB's bindgen), a C++ compiler, python3 (the example
# package). Safe to run again; does nothing when all is there.
set -euo pipefail

need=()
dpkg -s libclang-dev >/dev/null 2>&1 || need+=(libclang-dev)
command -v g++ >/dev/null 2>&1 || need+=(g++)
command -v python3 >/dev/null 2>&1 || need+=(python3)
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
command -v cargo >/dev/null 2>&1 || { echo "setup: cargo (Rust) is required: https://rustup.rs" >&2; exit 1; }
