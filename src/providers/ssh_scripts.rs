//! The shell scripts the `static` driver runs on its hosts (by `sh -c`,
//! after [`LIB`] and `d=<remote_dir>`), and the files it writes there.

/// Shell-quotes `s` (POSIX single quotes).
pub(in crate::providers) fn sq(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// Shell functions every script starts with. `agents [DATA_DIR]`: the pids
/// of `flotilla agent` processes in this network namespace (with
/// `--data-dir DATA_DIR`); the scripts never hold that text literally, so
/// their own shells never match. `state`: `running` or `stopping`.
pub(super) const LIB: &str = r#"set -u
a=agent
agents() {
  me=$(readlink /proc/$$/ns/net)
  for f in $(grep -lsaF flotilla /proc/[0-9]*/cmdline); do
    p=${f#/proc/}; p=${p%/cmdline}
    [ "$p" != "$$" ] || continue
    c=$(tr '\000' ' ' 2>/dev/null <"$f") || continue
    case "$c" in *"flotilla $a "*) ;; *) continue ;; esac
    if [ $# -gt 0 ]; then case "$c" in *" --data-dir $1 "*) ;; *) continue ;; esac; fi
    [ "$(readlink "/proc/$p/ns/net" 2>/dev/null)" != "$me" ] || echo "$p"
  done
  return 0
}
# `safe`: $d and each of its parents is no symbolic link, owned by root
# and writable by nobody else (who could else plant a symlink in it).
safe() {
  _p=$d
  while :; do
    if [ -L "${_p:-/}" ]; then echo "refused: ${_p:-/} is a symbolic link" >&2; return 1; fi
    if [ -e "${_p:-/}" ]; then
      _s=$(stat -c '%u %a' "${_p:-/}") || return 1
      if [ "${_s%% *}" != 0 ] || [ $((0${_s#* } & 022)) -ne 0 ]; then
        echo "refused: ${_p:-/} is owned by uid ${_s%% *} with mode ${_s#* } (must be root's and writable by no one else)" >&2
        return 1
      fi
    fi
    [ -n "$_p" ] || return 0
    _p=${_p%/*}
  done
}
# `unit_ok NAME`: a unit name of ours, flotilla-agent-[A-Za-z0-9_.-]+.service.
unit_ok() {
  case "$1" in
    *[!A-Za-z0-9_.-]*) ;;
    flotilla-agent-?*.service) return 0 ;;
  esac
  echo "refused: $1 is not a unit name of flotilla's" >&2; return 1
}
# `fresh FILE...`: none of them exists (nor as a dangling symlink).
fresh() {
  for _f in "$@"; do
    if [ -e "$_f" ] || [ -L "$_f" ]; then echo "refused: $_f exists already" >&2; return 1; fi
  done
}
state() {
  if [ -e "$d/agent.unit" ]; then
    if systemctl is-active --quiet "$(cat "$d/agent.unit")"; then echo running; else echo stopping; fi
  elif [ -n "$(agents "$d/agent")" ]; then echo running
  else echo stopping; fi
}
"#;

/// What a host holds (`key=value` lines): `conn` ($SSH_CONNECTION), cores,
/// memory, and what makes it taken: `tags`; or refused: `unsafe` (the
/// reason), `files`, `unit`, `agent`.
pub(super) const PROBE: &str = r#"echo "conn=${1:-}"
echo "cores=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null)"
echo "mem_kb=$(sed -n 's/^MemTotal:[[:space:]]*\([0-9]*\) kB$/\1/p' /proc/meminfo)"
[ ! -e "$d/tags.json" ] || echo tags=1
if ! why=$(safe 2>&1); then echo "unsafe=$why"
elif [ -d "$d" ] && [ -n "$(ls -A "$d" 2>/dev/null)" ]; then echo files=1; fi
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then echo systemd=1; fi
for u in /etc/systemd/system/flotilla-agent-*.service; do [ ! -e "$u" ] || echo "unit=${u##*/}"; done
for p in $(agents); do echo "agent=$p"; done
"#;

/// Claims the host: `id` made exclusively (no clobbering: `taken` when
/// another master's is there), then `tags.json` (from stdin) linked in
/// place, then `bin/`. Exit 7: the host refuses (`safe`), nothing made.
pub(super) const CLAIM: &str = r#"set -e
umask 022
safe || exit 7
[ -d "$d" ] || mkdir -p "$d"
safe || exit 7
chmod 0711 "$d"
umask 077
set -C
if [ -e "$d/id" ] || [ -L "$d/id" ]; then echo taken; exit 0; fi
if ! (printf '%s\n' "$n" >"$d/id") 2>/dev/null; then
  if [ -e "$d/id" ] || [ -L "$d/id" ]; then echo taken; exit 0; fi
  echo "cannot write $d/id" >&2; exit 1
fi
t="$d/tags.json.$n"
fresh "$t"
cat >"$t"
if ! ln "$t" "$d/tags.json" 2>/dev/null; then rm -f "$t" "$d/id"; echo taken; exit 0; fi
rm -f "$t"
mkdir -m 0755 "$d/bin"
echo claimed
"#;

pub(super) const INSTALL: &str = r#"set -e
trap 'rm -f "$src"' EXIT
safe
[ ! -L "$d/bin" ] && [ ! -L "$d/bin/flotilla" ] || { echo "refused: $d/bin holds a symbolic link" >&2; exit 1; }
if [ "$src" = "$d/bin/flotilla.part" ]; then chmod 0755 "$src"; mv -f "$src" "$d/bin/flotilla"
else install -m 0755 "$src" "$d/bin/flotilla"; fi
got=$(sha256sum "$d/bin/flotilla" | cut -d' ' -f1)
if [ "$got" != "$want" ]; then
  rm -f "$d/bin/flotilla"; echo "the copy's sha256 is $got, the agent binary's $want" >&2; exit 4
fi
echo verified
"#;

/// The token file, from stdin, never readable by others.
pub(super) const ENV: &str = r#"set -e
safe
umask 077
set -C
rm -f "$d/agent.env.tmp"
fresh "$d/agent.env"
cat >"$d/agent.env.tmp"
mv "$d/agent.env.tmp" "$d/agent.env"
"#;

/// Starts the agent: the unit file or supervisor script comes on stdin.
pub(super) const START_SYSTEMD: &str = r#"set -e
safe
set -C
unit_ok "$u"
fresh "$d/agent.unit" "/etc/systemd/system/$u"
(umask 077; printf '%s\n' "$u" >"$d/agent.unit")
(umask 022; cat >"/etc/systemd/system/$u")
systemctl daemon-reload
systemctl enable --now "$u" 2>&1
sleep 1
if [ "$(state)" != running ]; then
  echo "the agent does not run a second after its start:" >&2; journalctl -u "$u" -n 20 --no-pager >&2 || true; exit 6
fi
echo started
"#;

pub(super) const START_PROCESS: &str = r#"set -e
safe
cd /
umask 077
set -C
fresh "$d/bin/run-agent" "$d/agent.log" "$d/agent.pid"
cat >"$d/bin/run-agent"
chmod 0700 "$d/bin/run-agent"
setsid nohup "$d/bin/run-agent" >>"$d/agent.log" 2>&1 </dev/null &
sleep 1
if [ "$(state)" != running ]; then
  echo "the agent does not run a second after its start; the end of $d/agent.log:" >&2; tail -n 20 "$d/agent.log" >&2; exit 6
fi
echo started
"#;

/// Stops node `$n`'s agent (SIGTERM, 20 s, SIGKILL) and removes `$d`,
/// `tags.json` then `id` last: `gone`, `other` (the host holds another
/// node) or `removed`. `$part`: the copy in a non-root user's home, if any.
/// Exit 7: the host refuses (`safe`, or a unit name not ours).
pub(super) const REMOVE: &str = r#"[ -z "$part" ] || rm -f -- "$part"
safe || exit 7
[ -d "$d" ] || { echo gone; exit 0; }
rm -f "$d/tags.json.$n"
have=$(cat "$d/id" 2>/dev/null || true)
if [ ! -e "$d/tags.json" ] && [ -z "$have" ]; then echo gone; exit 0; fi
[ "$have" = "$n" ] || { echo other; exit 0; }
if [ -e "$d/agent.unit" ]; then
  u=$(cat "$d/agent.unit")
  unit_ok "$u" || exit 7
  systemctl disable --now "$u" >/dev/null 2>&1 || systemctl stop "$u" || true
  rm -f "/etc/systemd/system/$u"
  systemctl daemon-reload || true
fi
sup=
if [ -e "$d/agent.pid" ]; then
  p=$(cat "$d/agent.pid")
  case "$(tr '\000' ' ' 2>/dev/null <"/proc/$p/cmdline")" in *"$d/bin/run-agent "*) sup=$p ;; esac
fi
[ -z "$sup" ] || kill -TERM "$sup" 2>/dev/null || true
for p in $(agents "$d/agent"); do kill -TERM "$p" 2>/dev/null || true; done
i=0
while [ $i -lt 80 ]; do
  left=$(agents "$d/agent")
  if [ -n "$sup" ] && kill -0 "$sup" 2>/dev/null; then left="$left $sup"; fi
  [ -n "$left" ] || break
  sleep 0.25; i=$((i+1))
done
if [ $i -ge 80 ]; then
  [ -z "$sup" ] || kill -KILL -- "-$sup" 2>/dev/null || kill -KILL "$sup" 2>/dev/null || true
  for p in $(agents "$d/agent"); do kill -KILL "$p" 2>/dev/null || true; done
  sleep 1
  if [ -n "$(agents "$d/agent")" ]; then echo "the agent outlived SIGKILL" >&2; exit 5; fi
fi
for e in "$d"/* "$d"/.[!.]* "$d"/..?*; do
  case "$e" in "$d/tags.json"|"$d/id") continue ;; esac
  if [ -e "$e" ] || [ -L "$e" ]; then rm -rf --one-file-system "$e" || exit 1; fi
done
rm -f "$d/tags.json" && rm -f "$d/id" && rmdir "$d" && echo removed
"#;

pub(super) const LIST: &str = r#"[ -e "$d/tags.json" ] || { echo absent; exit 0; }
echo "id=$(cat "$d/id" 2>/dev/null)"
echo "state=$(state)"
echo "tags=$(tr -d '\n' <"$d/tags.json" 2>/dev/null)"
"#;

pub(super) fn indent(s: &str) -> String {
    s.trim_end().lines().map(|l| format!("    {l}")).collect::<Vec<_>>().join("\n")
}

/// The script that runs the agent again whenever it exits (no systemd).
pub(in crate::providers) fn supervisor(node: &str, d: &str, args: &str) -> String {
    let (env, pid, bin) =
        (sq(&format!("{d}/agent.env")), sq(&format!("{d}/agent.pid")), sq(&format!("{d}/bin/flotilla")));
    format!(
        r#"#!/bin/sh
# Runs the flotilla agent of node {node} again whenever it exits
# (written by flotilla's static driver; SIGTERM stops both).
set -a
. {env}
set +a
echo $$ >{pid}
stop=
child=
trap 'stop=1; [ -z "$child" ] || kill -TERM "$child" 2>/dev/null' TERM INT
while [ -z "$stop" ]; do
  {bin} {args} &
  child=$!
  while kill -0 "$child" 2>/dev/null; do wait "$child"; done
  child=
  [ -n "$stop" ] || sleep 2
done
"#
    )
}

pub(in crate::providers) fn unit_file(node: &str, d: &str, args: &str) -> String {
    format!(
        "[Unit]\nDescription=flotilla agent of node {node}\nWants=network-online.target\n\
         After=network-online.target\n\n[Service]\nEnvironmentFile={d}/agent.env\n\
         ExecStart={d}/bin/flotilla {args}\nRestart=always\nRestartSec=2\n\n[Install]\n\
         WantedBy=multi-user.target\n"
    )
}
