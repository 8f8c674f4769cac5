#!/usr/bin/env bash
# Installs what building and testing flotilla needs on a Debian machine:
# libclang (RocksDB's bindgen), a C++ compiler, python3 (the example
# package), Java and Debian's zookeeper (the real ensemble of the
# integration tests, packaged by examples/components/zookeeper/build.sh).
# Safe to run again; does nothing when all is there.
set -euo pipefail

need=()
dpkg -s libclang-dev >/dev/null 2>&1 || need+=(libclang-dev)
command -v g++ >/dev/null 2>&1 || need+=(g++)
command -v python3 >/dev/null 2>&1 || need+=(python3)
command -v java >/dev/null 2>&1 || need+=(default-jre-headless)
dpkg -s zookeeper >/dev/null 2>&1 || need+=(zookeeper)
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
command -v cargo >/dev/null 2>&1 || { echo "setup: cargo (Rust) is required: https://rustup.rs" >&2; exit 1; }
