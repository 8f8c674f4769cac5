#!/usr/bin/env python3
"""Supervision soak (issue 23): `flotilla bench` rounds against one master
for --minutes while a killer takes down a random actor or task every
--kill-every seconds through the operator's verb (POST
/api/v1/actors/{kind}/{id}/kill: cluster actors, instance actors (with
their cluster's), node managers, the agent listener, the node watcher, the
leaked sweep; a kind at random, then one of that kind). At the end: every operation
ended, no cluster busy, and `flotilla_live_tasks{kind}` back to its idle
value. A cluster actor killed past its restart intensity is given up (its
cluster `Error`, its operation waiting); the soak then does what an
operator on watch would, `POST /api/v1/actors/cluster/{id}/restart`, before
the next kill and at each cleanup (and counts it). Prints the figures RELIABILITY.md quotes; exits
non-zero when a check fails. Run it through scripts/soak.sh (it builds the binary)."""

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter

KINDS = ("cluster", "instance", "node_manager", "agent_listener", "node_watcher", "leaked_sweep")


class Api:
    def __init__(self, base, token):
        self.base, self.token = base, token

    def call(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                raw = r.read()
                return r.status, raw
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def json(self, path):
        status, raw = self.call("GET", path)
        if status != 200:
            raise RuntimeError(f"GET {path}: {status} {raw[:300]!r}")
        return json.loads(raw)

    def live_tasks(self):
        status, raw = self.call("GET", "/metrics")
        if status != 200:
            raise RuntimeError(f"GET /metrics: {status}")
        out = {}
        for line in raw.decode().splitlines():
            if line.startswith("flotilla_live_tasks{"):
                kind = line.split('kind="', 1)[1].split('"', 1)[0]
                out[kind] = float(line.rsplit(" ", 1)[1])
        return out


def restart_given_up(api, restarted):
    """Restarts every given-up (`failed`) cluster actor, as an operator
    would; its operation resumes from its journal."""
    for a in api.json("/api/v1/actors")["actors"]:
        if a["kind"] == "cluster" and a.get("state") == "failed":
            status, _ = api.call("POST", f"/api/v1/actors/cluster/{a['id']}/restart")
            restarted[status] += 1


def killer(api, every, stop, kills, rng, restarted):
    while not stop.wait(every):
        try:
            # An operator on watch: a given-up cluster actor (killed past
            # its intensity) is restarted before the next kill, so a round
            # does not wait on it until the cleanup.
            restart_given_up(api, restarted)
            actors = [a for a in api.json("/api/v1/actors")["actors"] if a["kind"] in KINDS]
        except Exception as e:  # the master is busy: try at the next tick
            kills["list failed"] += 1
            print(f"soak: cannot list actors: {e}", file=sys.stderr)
            continue
        if not actors:
            continue
        # A kind first, then one of its kind: instance actors (killed with
        # their cluster's, one group) outnumber the rest a hundred to one.
        kind = rng.choice(sorted({a["kind"] for a in actors}))
        a = rng.choice([a for a in actors if a["kind"] == kind])
        status, _ = api.call("POST", f"/api/v1/actors/{a['kind']}/{a['id']}/kill")
        kills[(a["kind"], status)] += 1


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", required=True)
    p.add_argument("--minutes", type=float, default=30)
    p.add_argument("--kill-every", type=float, default=4)
    p.add_argument("--agents", type=int, default=30)
    p.add_argument("--instances", type=int, default=3000)
    p.add_argument("--clusters", type=int, default=6)
    p.add_argument("--seed", type=int, default=23)
    # A bench round exits non-zero when one of its operations failed: under
    # kills that must not happen (a cut command is sent again), so none is
    # allowed by default.
    p.add_argument("--allow-failed-rounds", type=int, default=0)
    args = p.parse_args()
    rng = random.Random(args.seed)
    work = tempfile.mkdtemp(prefix="flotilla-soak-")
    ends, tokf, log = (os.path.join(work, n) for n in ("endpoints.json", "token", "master.log"))
    master = subprocess.Popen(
        [args.bin, "master", "--data-dir", os.path.join(work, "master"), "--http-addr", "127.0.0.1:0",
         "--agent-addr", "127.0.0.1:0", "--endpoints-file", ends, "--init", "--token-file", tokf],
        stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    failures = []
    try:
        for _ in range(600):
            if os.path.exists(ends) and os.path.getsize(ends) > 0:
                break
            if master.poll() is not None:
                sys.exit(f"soak: the master exited at start; see {log}")
            time.sleep(0.1)
        e = json.load(open(ends))
        api = Api(e["api_url"].rsplit("/api/v1", 1)[0], open(tokf).read().strip())
        time.sleep(2)
        idle = api.live_tasks()
        print(f"soak: master up ({e['api_url']}), idle live tasks {idle}")
        kills, stop = Counter(), threading.Event()
        restarted = Counter()
        t = threading.Thread(target=killer, args=(api, args.kill_every, stop, kills, rng, restarted), daemon=True)
        t.start()
        deadline = time.time() + args.minutes * 60
        rounds, exits, failed_rounds = 0, Counter(), []
        while time.time() < deadline:
            rounds += 1
            r = subprocess.run(
                [args.bin, "bench", "--api", api.base, "--agent-addr", e["agent_addr"], "--token", api.token,
                 "--agents", str(args.agents), "--instances", str(args.instances), "--clusters", str(args.clusters),
                 "--clients", "2", "--latency-ms", "20", "--idle-secs", "1", "--prefix", f"soak{rounds}-"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            exits[r.returncode] += 1
            if r.returncode != 0:
                failed_rounds.append(r.stderr.strip()[-400:])
                print(f"soak: round {rounds} exited {r.returncode}: {r.stderr.strip()[-400:]}", file=sys.stderr)
            # A round whose operations failed (a link killed under a step)
            # leaves its clusters: deleted here (force), so the next round
            # starts clean; a delete that does not finish is a failure.
            left = [c["name"] for c in api.json("/api/v1/clusters?limit=1000")["clusters"]]
            for name in left:
                api.call("DELETE", f"/api/v1/clusters/{name}?force=true")
            gone_by = time.time() + 180
            while left and time.time() < gone_by:
                time.sleep(1)
                restart_given_up(api, restarted)
                left = [c["name"] for c in api.json("/api/v1/clusters?limit=1000")["clusters"]]
                for c in api.json("/api/v1/clusters?limit=1000")["clusters"]:
                    if not c.get("operation"):
                        api.call("DELETE", f"/api/v1/clusters/{c['name']}?force=true")
            if left:
                failures.append(f"round {rounds}: clusters {left} not deleted within 180 s")
                break
        stop.set()
        t.join()
        # Quiet now: every operation must end and the live tasks go back.
        settle = time.time() + 120
        while True:
            restart_given_up(api, restarted)
            ops = api.json("/api/v1/operations?limit=1000")["operations"]
            running = [o["id"] for o in ops if o["status"] in ("Running", "Pending")]
            busy = [c["name"] for c in api.json("/api/v1/clusters?limit=1000")["clusters"] if c.get("operation")]
            live = api.live_tasks()
            back = all(live.get(k, 0) <= idle.get(k, 0) for k in live)
            if not running and not busy and back:
                break
            if time.time() > settle:
                failures.append(f"after 120 s: operations running {running[:5]}, busy {busy[:5]}, "
                                f"live tasks {live} (idle {idle})")
                break
            time.sleep(1)
        statuses = Counter(o["status"] for o in ops)
        print(f"soak: {args.minutes} min, {rounds} bench rounds (exit codes {dict(exits)})")
        for f in failed_rounds:
            print(f"soak: a failed round said: {f}")
        if len(failed_rounds) > args.allow_failed_rounds:
            failures.append(f"{len(failed_rounds)} of {rounds} bench rounds failed "
                            f"(--allow-failed-rounds {args.allow_failed_rounds})")
        print(f"soak: kills {sorted((f'{k[0]} {k[1]}' if isinstance(k, tuple) else k, n) for k, n in kills.items())}")
        print(f"soak: given-up cluster actors restarted by the soak (status: count) {dict(restarted)}")
        print(f"soak: operations kept {dict(statuses)}; live tasks at the end {live} (idle {idle})")
        if master.poll() is not None:
            failures.append(f"the master exited ({master.returncode}); see {log}")
    finally:
        if master.poll() is None:
            master.send_signal(signal.SIGTERM)
            try:
                master.wait(30)
            except subprocess.TimeoutExpired:
                master.kill()
                failures.append("the master did not stop within 30 s of SIGTERM")
    for f in failures:
        print(f"soak: FAILED: {f}", file=sys.stderr)
    print(f"soak: master log {log}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
