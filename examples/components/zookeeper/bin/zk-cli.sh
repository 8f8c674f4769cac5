#!/bin/bash
# ZooKeeper's command-line client (ZooKeeperMain). Without -server it talks
# to this instance's own server (the client address in conf/zoo.cfg).
#
#   bin/zk-cli.sh -server 127.0.0.11:2181 create /flotilla hello   # prints "Created /flotilla"
#   bin/zk-cli.sh -server 127.0.0.12:2181 get /flotilla            # prints "hello"
#   bin/zk-cli.sh ls /
#
# With a command it runs that one command and exits: 0 on success, 1 on
# failure (no such node, node exists, no connection within -timeout, default
# 10000 ms). Its stdout is the command's output only: the client's connection
# banner ("Connecting to", "WATCHER::", "WatchedEvent ...") is dropped, and
# client logging is warnings only, on stderr. Without a command it is the
# interactive shell (no line editing: Debian ships no jline 2).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/zk-env.sh"

# ZooKeeperMain's options come first; the first other word starts the command.
server_given=false command_given=false
i=1
while ((i <= $#)); do
    case ${!i} in
        -server) server_given=true; i=$((i + 2)) ;;
        -timeout | -client-configuration) i=$((i + 2)) ;;
        -r | -waitforconnection) i=$((i + 1)) ;;
        *) command_given=true; break ;;
    esac
done

# Defaults first: ZooKeeperMain keeps the last value of an option.
args=(-timeout 10000)
if ! $server_given; then
    if [[ -z $ZK_HOST || -z $ZK_PORT ]]; then
        echo "zk-cli: give -server host:port (no client address in $ZK_DIR/conf/zoo.cfg)" >&2
        exit 2
    fi
    args+=(-server "$ZK_HOST:$ZK_PORT")
fi

java_cmd=(
    "$ZK_JAVA" -Xmx64m -XX:+UseSerialGC -XX:-UsePerfData -XX:TieredStopAtLevel=1
    -Djava.net.preferIPv4Stack=true
    -Djava.util.logging.config.file="$ZK_DIR/conf/logging-cli.properties"
    -cp "$ZK_CLASSPATH" org.apache.zookeeper.ZooKeeperMain
)

if ! $command_given; then
    exec "${java_cmd[@]}" "${args[@]}" "$@"
fi

# -waitforconnection: the banner is printed before the command runs, so it is
# exactly the lines up to the first SyncConnected event. If that never comes
# (no connection), everything is passed through.
set +e
"${java_cmd[@]}" "${args[@]}" -waitforconnection "$@" | awk '
    started { print; next }
    /^WatchedEvent state:SyncConnected type:None path:null$/ { started = 1; n = 0; next }
    { held[++n] = $0 }
    END { if (!started) for (i = 1; i <= n; i++) print held[i] }
'
exit "${PIPESTATUS[0]}"
