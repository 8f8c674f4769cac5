#!/bin/bash
# Runs one ZooKeeper server in the foreground: the java process replaces this
# script, so flotilla supervises (and signals) the server itself.
#
# Needs, rendered by flotilla: conf/zoo.cfg and conf/myid (copied to data/myid,
# where ZooKeeper reads it; data/ is the instance's own). Logs go to
# logs/zookeeper.N.log (rotated, see conf/logging.properties); only warnings
# and errors reach stderr, which flotilla also keeps under logs/.
#
# ZK_HEAP (default 256m) sets the maximum heap.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/zk-env.sh"
cd "$ZK_DIR"

if [[ ! -f conf/zoo.cfg ]]; then
    echo "zk-start: $ZK_DIR/conf/zoo.cfg is missing (flotilla renders it)" >&2
    exit 1
fi
if [[ ! -s conf/myid ]]; then
    echo "zk-start: $ZK_DIR/conf/myid is missing or empty (flotilla renders it)" >&2
    exit 1
fi
mkdir -p data
cp conf/myid data/myid
mkdir -p logs

exec "$ZK_JAVA" \
    -Xms32m -Xmx"${ZK_HEAP:-256m}" -XX:+UseSerialGC \
    -XX:+ExitOnOutOfMemoryError -XX:-UsePerfData \
    -Djava.net.preferIPv4Stack=true \
    -Dzookeeper.log.dir="$ZK_DIR/logs" \
    -Djava.util.logging.config.file="$ZK_DIR/conf/logging.properties" \
    -cp "$ZK_CLASSPATH" \
    org.apache.zookeeper.server.quorum.QuorumPeerMain "$ZK_DIR/conf/zoo.cfg"
