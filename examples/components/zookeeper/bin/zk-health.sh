#!/bin/bash
# Health check: exits 0 only when the server answers the `srvr` four-letter
# word with a `Mode:` line (leader, follower, observer or standalone), i.e.
# it is in a quorum and serving clients. A server that is up but still
# electing answers "not currently serving requests" and fails the check.
#
# Usage: zk-health.sh [host port]   (default: the client address in conf/zoo.cfg)
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/zk-env.sh"
host=${1:-$ZK_HOST}
port=${2:-$ZK_PORT}
if [[ -z $host || -z $port ]]; then
    echo "zk-health: no client address (conf/zoo.cfg has no clientPortAddress/clientPort)" >&2
    exit 2
fi

# bash's /dev/tcp; the server closes the connection after its answer.
reply=$(timeout 3 bash -c 'exec 3<>"/dev/tcp/$0/$1" && printf srvr >&3 && cat <&3' "$host" "$port" 2>/dev/null)
mode=$(sed -n 's/^Mode: //p' <<<"$reply")
case $mode in
    leader | follower | observer | standalone)
        echo "$host:$port $mode"
        exit 0
        ;;
    "")
        echo "zk-health: $host:$port is not serving${reply:+: $(head -n 1 <<<"$reply")}" >&2
        exit 1
        ;;
    *)
        echo "zk-health: $host:$port is in mode $mode" >&2
        exit 1
        ;;
esac
