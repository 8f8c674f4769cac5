#!/usr/bin/env bash
# Installs what building and testing flotilla needs on a Debian machine:
# libclang (RocksDB's bindgen), a C++ compiler, python3 (the example
# package), Java and Debian's zookeeper (the real ensemble of the
# integration tests, packaged by examples/components/zookeeper/build.sh),
# curl, and for the dashboard's browser test Debian's chromium, Node.js and
# npm's playwright-core (pinned in tests/browser/package-lock.json);
# iproute2 and nsenter for the network-partition test; openssh-server and
# openssh-client for the static (SSH) driver's tests; PyPI's moto[server]
# (a real EC2 Query API on loopback) for the ec2 driver's tests; etcd
# (server, etcdctl) and protoc for the HA store on etcd.
# Safe to run again; does nothing when all is there.
set -euo pipefail

need=()
dpkg -s libclang-dev >/dev/null 2>&1 || need+=(libclang-dev)
command -v g++ >/dev/null 2>&1 || need+=(g++)
command -v python3 >/dev/null 2>&1 || need+=(python3)
command -v java >/dev/null 2>&1 || need+=(default-jre-headless)
dpkg -s zookeeper >/dev/null 2>&1 || need+=(zookeeper)
command -v curl >/dev/null 2>&1 || need+=(curl)
[ -x /usr/bin/chromium ] || need+=(chromium)
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
# The partition test makes network namespaces and veth pairs (iproute2)
# and runs an agent in one (nsenter, util-linux).
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v nsenter >/dev/null 2>&1 || need+=(util-linux)
# The static driver's tests run Debian's sshd in namespaces and bootstrap
# hosts with the OpenSSH client (ssh, scp, ssh-keygen).
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ssh >/dev/null 2>&1 && command -v scp >/dev/null 2>&1 || need+=(openssh-client)
# The HA store (issue 25): Debian's etcd 3.4 members for the tests and
# `flotilla dev --ha`, and protoc for the etcd-client crate's build.
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || need+=(etcd-client)
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
command -v cargo >/dev/null 2>&1 || { echo "setup: cargo (Rust) is required: https://rustup.rs" >&2; exit 1; }
browser="$(dirname "$0")/../tests/browser"
if [ ! -d "$browser/node_modules/playwright-core" ]; then
  echo "setup: installing playwright-core for the dashboard test (npm ci)" >&2
  (cd "$browser" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi

# --- schemathesis, for the API-description test (issue 8 item 6) -----------
# tests/integration/openapi.rs runs PyPI's schemathesis (the `schemathesis`
# command) against `flotilla dev`; the version is pinned here and in the test.
if ! command -v schemathesis >/dev/null 2>&1; then
  if ! python3 -m pip --version >/dev/null 2>&1; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-pip >/dev/null
  fi
  echo "setup: installing schemathesis 4.32.5 (pip)" >&2
  # Debian's own python3 refuses pip installs outside a venv (PEP 668) unless told.
  python3 -m pip install --quiet 'schemathesis==4.32.5' \
    || python3 -m pip install --quiet --break-system-packages 'schemathesis==4.32.5'
fi

# --- moto, for the ec2 driver's tests (issue 24) ----------------------------
# tests/integration/pools/ec2.rs runs `python3 -m moto.server`; pinned here.
if ! python3 -c 'import moto.server' >/dev/null 2>&1; then
  echo "setup: installing moto[server] 5.1.0 (pip)" >&2
  python3 -m pip install --quiet 'moto[server]==5.1.0' \
    || python3 -m pip install --quiet --break-system-packages 'moto[server]==5.1.0'
fi
