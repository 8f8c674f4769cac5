# Sourced by the other bin/ scripts (not run on its own). Sets:
#   ZK_DIR        the instance directory (this script's parent's parent)
#   ZK_JAVA       the java to run: $JAVA_HOME/bin/java if set, else `java` on PATH
#   ZK_CLASSPATH  the package's own jars in lib/; only when lib/ has none
#                 (the unbuilt example folder loaded as-is by `flotilla dev`)
#                 the jars of Debian's zookeeper package under /usr/share/java
#   ZK_HOST, ZK_PORT  the client address from conf/zoo.cfg (empty if absent)

ZK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

if [[ -n ${JAVA_HOME:-} && -x $JAVA_HOME/bin/java ]]; then
    ZK_JAVA=$JAVA_HOME/bin/java
else
    ZK_JAVA=java
fi

if compgen -G "$ZK_DIR/lib/*.jar" >/dev/null; then
    ZK_CLASSPATH="$ZK_DIR/lib/*"
else
    ZK_CLASSPATH=
    for jar in zookeeper zookeeper-jute slf4j-api slf4j-jdk14 metrics-core snappy-java commons-cli; do
        ZK_CLASSPATH+="${ZK_CLASSPATH:+:}/usr/share/java/$jar.jar"
    done
fi

# The last value wins, as in ZooKeeper's own parser.
zk_cfg() {
    sed -n "s/^[[:space:]]*$1[[:space:]]*=[[:space:]]*\([^[:space:]]*\).*/\1/p" "$ZK_DIR/conf/zoo.cfg" 2>/dev/null | tail -n 1
}
ZK_HOST=$(zk_cfg clientPortAddress)
ZK_PORT=$(zk_cfg clientPort)
