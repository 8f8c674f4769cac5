#!/bin/bash
# Builds the flotilla package of ZooKeeper from Debian's `zookeeper` package.
#
#   examples/components/zookeeper/build.sh <version> <out.tar.gz>
#
# e.g. `build.sh 3.8.0 /tmp/zookeeper-3.8.0.tar.gz`, and for upgrade tests a
# second package that differs only in its version (component.toml and the
# PACKAGE_VERSION marker): `build.sh 3.8.0-2 /tmp/zookeeper-3.8.0-2.tar.gz`.
#
# The tarball's root holds component.toml, PACKAGE_VERSION, bin/, conf/ and
# lib/ (the jars the server and the CLI need, copied out of /usr/share/java).
# Same inputs, same bytes: names sorted, owner root, mtime 0, gzip -n.
set -euo pipefail

die() {
    echo "build.sh: $*" >&2
    exit 1
}

[[ $# -eq 2 ]] || die "usage: build.sh <version> <out.tar.gz>"
version=$1
out=$2
# flotilla's rule for package versions.
[[ $version =~ ^[A-Za-z0-9_+-][A-Za-z0-9._+-]{0,63}$ ]] ||
    die "invalid version '$version': 1 to 64 of [A-Za-z0-9._+-], not starting with '.'"
[[ $out == *.tar.gz ]] || die "the output must end in .tar.gz, got '$out'"
out_dir=$(dirname -- "$out")
[[ -d $out_dir ]] || die "no directory $out_dir for the output"
out=$(cd "$out_dir" && pwd)/$(basename -- "$out")

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# The Debian packages the jars come from (zookeeper pulls in the others).
for pkg in zookeeper libzookeeper-java; do
    status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
    [[ $status == installed ]] ||
        die "Debian package '$pkg' is not installed; install it with: apt-get install zookeeper"
done
command -v python3 >/dev/null || die "python3 is needed (to rewrite a jar's manifest)"

# Jar name in the package <- file in /usr/share/java. Found by running the
# server (3-member ensemble) and the CLI with nothing else on the class path:
#   zookeeper, zookeeper-jute   the server and client
#   slf4j-api + slf4j-jdk14     logging through java.util.logging (conf/logging*.properties)
#   metrics-core                ServerMetrics' percentile counters (server start)
#   snappy-java                 referenced when naming a snapshot file, even
#                               uncompressed (NoClassDefFoundError at start without it)
#   commons-cli                 the CLI's command parsing
# Not needed with this config: netty (NIO is the default transport, no TLS),
# jetty/jackson (admin server disabled), commons-io (oracle quorum), jline
# (CLI line editing).
jars=(zookeeper zookeeper-jute slf4j-api slf4j-jdk14 metrics-core snappy-java commons-cli)

stage=$(mktemp -d "${TMPDIR:-/tmp}/zookeeper-package.XXXXXX")
trap 'rm -rf -- "$stage" "$out.tmp"' EXIT
mkdir -p "$stage/bin" "$stage/conf" "$stage/lib"

for jar in "${jars[@]}"; do
    src=/usr/share/java/$jar.jar
    [[ -e $src ]] || die "$src is missing (is the Debian package that ships it installed?)"
    cp -L -- "$src" "$stage/lib/$jar.jar"
done

# Debian's jars carry a manifest Class-Path of absolute /usr/share/java paths;
# drop it so the package runs on its own lib/ alone (and a missing jar shows).
python3 - "$stage"/lib/*.jar <<'EOF'
import re, sys, zipfile, os
for path in sys.argv[1:]:
    with zipfile.ZipFile(path) as src:
        try:
            manifest = src.read("META-INF/MANIFEST.MF").decode("utf-8")
        except KeyError:
            continue
        # A header's continuation lines start with one space.
        stripped = re.sub(r"(?m)^Class-Path:.*\r?\n(?: .*\r?\n)*", "", manifest)
        if stripped == manifest:
            continue
        tmp = path + ".tmp"
        with zipfile.ZipFile(tmp, "w") as dst:
            for info in src.infolist():
                data = src.read(info)
                if info.filename == "META-INF/MANIFEST.MF":
                    data = stripped.encode("utf-8")
                dst.writestr(info, data, compress_type=info.compress_type)
    os.replace(tmp, path)
EOF

cp -- "$here"/bin/*.sh "$stage/bin/"
cp -- "$here"/conf/*.properties "$stage/conf/"
echo "$version" >"$stage/PACKAGE_VERSION"

# component.toml with the version of [component] replaced; exactly once.
awk -v v="$version" '
    /^\[/ { section = $0 }
    section == "[component]" && /^version[[:space:]]*=/ { print "version = \"" v "\""; n++; next }
    { print }
    END { if (n != 1) exit 1 }
' "$here/component.toml" >"$stage/component.toml" ||
    die "component.toml: expected exactly one version line under [component]"

chmod 0755 "$stage/bin" "$stage/conf" "$stage/lib" "$stage"/bin/*.sh
chmod 0644 "$stage"/conf/* "$stage"/lib/* "$stage/component.toml" "$stage/PACKAGE_VERSION"
chmod 0644 "$stage/bin/zk-env.sh" # sourced, not run

tar -C "$stage" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 \
    -cf - component.toml PACKAGE_VERSION bin conf lib | gzip -n -9 >"$out.tmp"
mv -f -- "$out.tmp" "$out"
echo "built $out (zookeeper $version, $(du -k "$out" | cut -f1) KiB)"
