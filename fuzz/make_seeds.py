#!/usr/bin/env python3
"""Seeds for the tar_policy fuzz target: gzipped tarballs built to the tar
advisories' proofs of concept, plus a sane package, written to
fuzz/seeds/tar_policy/. The fuzzer starts from these and mutates them.

- RUSTSEC-2018-0002: entries that escape through `..` and through links.
- RUSTSEC-2021-0080: a symlink to a directory outside, then entries under it.
- RUSTSEC-2026-0067: a symlink, then a directory entry of the same name (a
  chmod that would follow the link).
- RUSTSEC-2026-0068: a PAX `size` that disagrees with the header's size
  (one reader sees another archive than the next).
"""
import io
import os
import sys
import tarfile

SPEC = b"""[component]
name = "seed"
version = "1.0.0"

[[roles]]
name = "main"
start = ["bin/start.sh"]
"""


def member(tar, name, data=b"", mode=0o644, kind=tarfile.REGTYPE, link="", pax=None):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.linkname = link
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    if pax:
        info.pax_headers = pax
    tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def archive(path, build, fmt=tarfile.GNU_FORMAT):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz", format=fmt) as tar:
        member(tar, "component.toml", SPEC)
        member(tar, "bin/start.sh", b"#!/bin/sh\nexec sleep 1000\n", 0o755)
        build(tar)
    with open(path, "wb") as f:
        f.write(raw.getvalue())


def main(out):
    os.makedirs(out, exist_ok=True)
    seeds = {
        "sane": lambda t: None,
        "2018-0002-dotdot": lambda t: member(t, "../../escape", b"x"),
        "2018-0002-absolute": lambda t: member(t, "/tmp/escape", b"x"),
        "2018-0002-symlink-write": lambda t: (
            member(t, "out", kind=tarfile.SYMTYPE, link="/tmp"),
            member(t, "out/escape", b"x"),
        ),
        "2018-0002-hardlink": lambda t: member(t, "hard", kind=tarfile.LNKTYPE, link="/etc/passwd"),
        "2021-0080-link-dir": lambda t: (
            member(t, "d", kind=tarfile.SYMTYPE, link="../../outside"),
            member(t, "d/sub/", kind=tarfile.DIRTYPE, mode=0o755),
        ),
        "2026-0067-symlink-then-dir": lambda t: (
            member(t, "conf", kind=tarfile.SYMTYPE, link="/etc"),
            member(t, "conf", kind=tarfile.DIRTYPE, mode=0o777),
        ),
        # Aimed at the target's canaries: /tmp/flotilla-fuzz-canary, and
        # canary/ two levels above the staging dir.
        "canary-absolute-link-write": lambda t: (
            member(t, "out", kind=tarfile.SYMTYPE, link="/tmp/flotilla-fuzz-canary/sub"),
            member(t, "out/escape", b"x"),
        ),
        "canary-relative-link-write": lambda t: (
            member(t, "out", kind=tarfile.SYMTYPE, link="../../canary/sub"),
            member(t, "out/escape", b"x"),
        ),
        "canary-hardlink": lambda t: (
            member(t, "hard", kind=tarfile.LNKTYPE, link="/tmp/flotilla-fuzz-canary/keep"),
            member(t, "hard", b"overwritten"),
        ),
        "canary-dotdot": lambda t: member(t, "../../canary/escape", b"x"),
        "device": lambda t: member(t, "dev", kind=tarfile.CHRTYPE),
        "setuid": lambda t: member(t, "bin/suid", b"x", mode=0o4755),
    }
    for name, build in seeds.items():
        archive(os.path.join(out, name + ".tar.gz"), build)
    # RUSTSEC-2026-0068: a PAX size header that disagrees with the ustar size.
    archive(
        os.path.join(out, "2026-0068-pax-size.tar.gz"),
        lambda t: member(t, "smuggled", b"abcd", pax={"size": "2048"}),
        fmt=tarfile.PAX_FORMAT,
    )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "seeds", "tar_policy"))
