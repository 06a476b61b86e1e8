#!/usr/bin/python3
"""Helpers of bench/load.sh (standard library only):

  submit  the jobs the load runs on: some that end at once (so a page of GET /v1/jobs is full)
          and long-running command jobs printing a train metric line every INTERVAL ms
  follow  N event-stream followers spread over those jobs, in one thread (epoll); once every
          stream has ended it reads each job's whole event log again and compares it with what
          every follower got: no gap, no duplicate, nothing missing, the same bytes
  fill    adds finished jobs (with attempts and events) straight into a stopped daemon's state.db
  page    GET /v1/jobs?limit=50&offset=K latency over random offsets, one keep-alive connection

Figures go to a file as "key value" lines (read back by load.sh); what went wrong goes to stderr.
"""
import argparse
import array
import http.client
import json
import math
import os
import random
import re
import selectors
import socket
import sqlite3
import sys
import threading
import time
import urllib.parse
import zlib


def fail(msg):
    print(f"load.py: {msg}", file=sys.stderr)
    sys.exit(1)


def write_figures(path, figures):
    with open(path, "a") as f:
        for k, v in figures.items():
            f.write(f"{k} {v}\n")


def percentile(sorted_values, p):
    """Nearest-rank percentile of an already sorted sequence (0 when empty)."""
    if not sorted_values:
        return 0.0
    k = math.ceil(p / 100.0 * len(sorted_values)) - 1
    return sorted_values[max(0, min(len(sorted_values) - 1, k))]


class Api:
    """Plain JSON calls on one keep-alive connection (set-up and checks, not the measured load)."""

    def __init__(self, url, token):
        u = urllib.parse.urlparse(url)
        self.host, self.port = u.hostname, u.port
        self.headers = {"Authorization": "Bearer " + token, "Content-Type": "application/json"}
        self.conn = None

    def call(self, method, path, body=None):
        for attempt in range(2):  # a keep-alive connection the daemon closed: once more
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
            try:
                self.conn.request(method, path, json.dumps(body) if body is not None else None,
                                  self.headers)
                r = self.conn.getresponse()
                data = r.read()
                return r.status, json.loads(data) if data else None
            except (ConnectionError, http.client.HTTPException):
                self.conn.close()
                self.conn = None
                if attempt:
                    raise


# ---- submit ------------------------------------------------------------------------------------

# The long-running job: a train line every interval, on a schedule shared by all jobs (step =
# (now - T0) / interval), so the wrk script can ask /metrics for "the last steps" without asking
# the daemon; it ends when the stop file appears, or after max_s whatever happens (nothing of the
# bench may outlive it). "t" is when it printed the line, in seconds since T0 (followers measure
# delivery latency with it): the daemon renders a job's latest metric with 10 significant digits,
# which a Unix time in microseconds would not survive.
JOB_CODE = r"""
import os, sys, time
stop = os.environ["LOAD_STOP"]
t0 = float(os.environ["LOAD_T0"])
iv = float(os.environ["LOAD_INTERVAL_MS"]) / 1000.0
deadline = time.time() + float(os.environ["LOAD_MAX_S"])
step = int((time.time() - t0) / iv)
out = sys.stdout
while not os.path.exists(stop) and time.time() < deadline:
    step += 1
    now = time.time()
    out.write('{"event":"train","step":%d,"loss":%.6f,"t":%.6f}\n' % (step, 2.0 / (1.0 + step * iv), now - t0))
    out.flush()
    pause = t0 + (step + 1) * iv - time.time()
    if pause > 0:
        time.sleep(pause)
"""


def wait_until(what, timeout, fn):
    end = time.time() + timeout
    while time.time() < end:
        if fn():
            return
        time.sleep(0.1)
    fail(f"timed out after {timeout:.0f} s waiting for {what}")


def cmd_submit(a):
    api = Api(a.url, a.token)
    short = []
    for i in range(a.short):
        st, job = api.call("POST", "/v1/jobs", {"name": f"load-short-{i}", "command": ["/bin/true"]})
        if st != 201:
            fail(f"POST /v1/jobs (short job) -> {st} {job}")
        short.append(job["id"])

    def short_done():
        st, page = api.call("GET", "/v1/jobs?state=queued,running&limit=500")
        return st == 200 and not any(j["id"] in short for j in page["jobs"])
    wait_until("the short jobs to end", 120, short_done)
    env = {"LOAD_STOP": a.stop, "LOAD_T0": repr(a.t0), "LOAD_INTERVAL_MS": str(a.interval_ms),
           "LOAD_MAX_S": str(a.max_s)}
    ids = []
    for i in range(a.jobs):
        spec = {"name": f"load-{i}", "command": ["/usr/bin/python3", "-c", JOB_CODE], "env": env,
                "resources": {"nproc": 1, "time_limit_s": a.max_s + 60}}
        st, job = api.call("POST", "/v1/jobs", spec)
        if st != 201:
            fail(f"POST /v1/jobs -> {st} {job}")
        ids.append(job["id"])

    def all_training():
        for i in ids:
            st, job = api.call("GET", f"/v1/jobs/{i}")
            if st != 200 or job["state"] != "running" or not job["latest"]["train"]:
                if st == 200 and job["state"] in ("failed", "cancelled", "succeeded"):
                    fail(f"job {i} ended before the load: {job['state']}: {job['reason']}")
                return False
        return True
    wait_until("every long job to print its first metric", 120, all_training)
    print(" ".join(map(str, ids)))


# ---- follow ------------------------------------------------------------------------------------

ID_LINE = re.compile(rb"^id: (\d+)$")
T_FIELD = b'"t":'


class Stream:
    """One GET /v1/jobs/{id}/events response, parsed as it arrives: HTTP head, chunked framing,
    then SSE records. Each record's id is checked against the previous one (ids go up by one) and
    its bytes go into a running CRC, so two readers of one job can be compared without keeping
    the events."""

    __slots__ = ("job", "sock", "raw", "head_done", "status", "chunked", "need", "sse", "last",
                 "first", "count", "gaps", "dups", "crc", "ended", "error", "body", "lat",
                 "lat_from", "t0")

    def __init__(self, job, lat=None, lat_from=float("inf"), t0=0.0):
        self.job = job
        self.sock = None
        self.raw = bytearray()
        self.head_done = False
        self.status = 0
        self.chunked = False
        self.need = None  # bytes of the current chunk still to come (None: its size line next)
        self.sse = bytearray()
        self.last = 0
        self.first = None
        self.count = self.gaps = self.dups = 0
        self.crc = 0
        self.ended = False  # the response's end was seen (the zero chunk, or the close)
        self.error = None
        self.body = b""
        self.lat = lat  # array('d') of delivery latencies (s), or None: not measured
        self.lat_from = lat_from
        self.t0 = t0

    def request(self, host, port, token):
        return (f"GET /v1/jobs/{self.job}/events HTTP/1.1\r\nHost: {host}:{port}\r\n"
                f"Authorization: Bearer {token}\r\nAccept: text/event-stream\r\n\r\n").encode()

    def feed(self, data):
        """Takes bytes as received; b"" is the connection's end."""
        if not data:
            if not self.head_done:
                self.error = self.error or "connection closed before the response's head"
            elif self.status != 200:
                self.error = f"HTTP {self.status}: {bytes(self.raw)[:200]!r}"
            elif self.chunked and not self.ended:
                self.error = "connection closed before the end of the stream"
            elif not self.chunked:
                self.records(self.raw)
                self.raw.clear()
            self.ended = True
            return
        self.raw += data
        if not self.head_done:
            end = self.raw.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.raw[:end]).decode("latin-1").split("\r\n")
            del self.raw[:end + 4]
            self.head_done = True
            parts = head[0].split(" ", 2)
            self.status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else -1
            for line in head[1:]:
                k, _, v = line.partition(":")
                if k.strip().lower() == "transfer-encoding" and "chunked" in v.lower():
                    self.chunked = True
        if self.status != 200:  # an error has a length and keeps the connection: done with it
            self.error = f"HTTP {self.status}: {bytes(self.raw)[:200]!r}"
            self.ended = True
            return
        if not self.chunked:
            return
        pos, raw = 0, self.raw
        while not self.ended:
            if self.need is None:
                nl = raw.find(b"\r\n", pos)
                if nl < 0:
                    break
                size = int(bytes(raw[pos:nl]).split(b";")[0], 16)
                pos = nl + 2
                if size == 0:
                    self.ended = True
                    break
                self.need = size
            else:
                if len(raw) - pos < self.need + 2:
                    break
                self.sse += raw[pos:pos + self.need]
                if raw[pos + self.need:pos + self.need + 2] != b"\r\n":
                    self.error = "bad chunked framing"
                    self.ended = True
                pos += self.need + 2
                self.need = None
        del raw[:pos]
        if self.sse:
            cut = self.sse.rfind(b"\n\n")
            if cut >= 0:
                self.records(self.sse[:cut + 2])
                del self.sse[:cut + 2]

    def records(self, block):
        now = time.time()
        for rec in bytes(block).split(b"\n\n"):
            if not rec or rec.startswith(b":"):
                continue  # a keep-alive comment, not an event
            nl = rec.find(b"\n")
            m = ID_LINE.match(rec[:nl] if nl >= 0 else rec)
            if not m:
                self.error = self.error or f"a record without an id: {rec[:80]!r}"
                continue
            i = int(m.group(1))
            if self.first is None:
                self.first = i
            if i == self.last + 1:
                pass
            elif i <= self.last:
                self.dups += 1
            else:
                self.gaps += i - self.last - 1
            self.last = max(self.last, i)
            self.count += 1
            self.crc = zlib.crc32(rec, self.crc)
            if self.lat is not None:
                t = rec.rfind(T_FIELD)
                if t >= 0:
                    sent = self.t0 + float(rec[t + len(T_FIELD):rec.index(b"}", t)])
                    if sent >= self.lat_from:
                        self.lat.append(now - sent)


def read_whole(host, port, token, job):
    """A job's event log from its first event to its end (the stream closes after the final
    state), on a blocking connection."""
    s = Stream(job)
    sock = socket.create_connection((host, port), timeout=60)
    sock.sendall(s.request(host, port, token))
    while not s.ended:
        s.feed(sock.recv(1 << 18))
    sock.close()
    return s


def cmd_follow(a):
    u = urllib.parse.urlparse(a.url)
    host, port = u.hostname, u.port
    ids = [int(x) for x in a.ids.split()]
    sel = selectors.DefaultSelector()
    lat = array.array("d")
    streams = []
    t_start = time.time()
    connect_errors = 0

    def pump(timeout):
        for key, _ in sel.select(timeout):
            s = key.data
            try:
                data = s.sock.recv(1 << 18)
            except (ConnectionError, OSError) as e:
                s.error = s.error or f"recv: {e}"
                data = b""
            s.feed(data)
            if s.ended:
                sel.unregister(s.sock)
                s.sock.close()

    # connected a batch at a time, reading between batches: the daemon's listen backlog is 128
    for n in range(a.followers):
        # latencies count from the start of the load (a backlog read on connecting is no delay)
        s = Stream(ids[n % len(ids)], lat, float("inf"), a.t0)
        streams.append(s)
        try:
            s.sock = socket.create_connection((host, port), timeout=30)
            s.sock.sendall(s.request(host, port, a.token))
            s.sock.setblocking(False)
            sel.register(s.sock, selectors.EVENT_READ, s)
        except OSError as e:
            s.error, s.ended = f"connect: {e}", True
            connect_errors += 1
        if n % 50 == 49:
            pump(0)
    # ready once every stream has its head (or has failed): the load may start
    deadline = time.time() + 60
    while time.time() < deadline and not all(s.head_done or s.ended for s in streams):
        pump(0.2)
    connected = sum(1 for s in streams if s.status == 200)
    t_ready = time.time()
    for s in streams:
        s.lat_from = t_ready  # what happened during the load, not the catch-up on connecting
    with open(a.ready + ".tmp", "w") as f:
        f.write(f"{connected} {t_ready - t_start:.3f}\n")
    os.rename(a.ready + ".tmp", a.ready)
    print(f"followers: {connected} of {a.followers} streams open in {t_ready - t_start:.1f} s",
          file=sys.stderr)

    # the other half of the delivery latency: how old the newest stored metric of a job is
    # (GET /v1/jobs/{id}, latest.train.t), four times a second until the jobs are told to stop
    ingest = []

    def probe():
        api = Api(a.url, a.token)
        k = 0
        while not os.path.exists(a.stop):
            k += 1
            try:
                st, job = api.call("GET", f"/v1/jobs/{ids[k % len(ids)]}")
            except OSError:
                st = 0
            train = job.get("latest", {}).get("train") if st == 200 else None
            if train and "t" in train:
                ingest.append(time.time() - a.t0 - train["t"])
            time.sleep(0.25)
    prober = threading.Thread(target=probe, daemon=True)
    prober.start()

    deadline = time.time() + a.timeout
    while sel.get_map() and time.time() < deadline:
        pump(1.0)
    for key in list(sel.get_map().values()):
        s = key.data
        s.error = s.error or f"still open {a.timeout:.0f} s after the load (the job never ended?)"
        sel.unregister(s.sock)
        s.sock.close()
    t_end = time.time()
    # how long the last stream took to end once the jobs were told to stop
    drain = t_end - os.path.getmtime(a.stop) if os.path.exists(a.stop) else float("nan")

    # every job's whole log, read again now that it has ended: what each follower must have got
    whole = {}
    for j in ids:
        w = read_whole(host, port, a.token, j)
        if w.error or w.status != 200 or w.first != 1 or w.gaps or w.dups:
            fail(f"job {j}: its whole event log read back wrong: status {w.status}, first id "
                 f"{w.first}, gaps {w.gaps}, duplicates {w.dups}, {w.error}")
        whole[j] = w
    bad = []
    checked = 0
    for n, s in enumerate(streams):
        w = whole[s.job]
        why = s.error
        if not why and s.status != 200:
            why = f"HTTP {s.status}"
        if not why and (s.gaps or s.dups):
            why = f"{s.gaps} ids missing in gaps, {s.dups} duplicates"
        if not why and (s.first != 1 or s.last != w.last or s.count != w.count):
            why = (f"got ids {s.first}..{s.last} ({s.count}), the job has 1..{w.last} "
                   f"({w.count})")
        if not why and s.crc != w.crc:
            why = "the same ids but other bytes than the job's log"
        if why:
            bad.append((n, s.job, why))
        else:
            checked += s.count
    for n, job, why in bad[:20]:
        print(f"follower {n} (job {job}): {why}", file=sys.stderr)
    if len(bad) > 20:
        print(f"... and {len(bad) - 20} more followers failed", file=sys.stderr)
    prober.join(timeout=5)
    ingest.sort()
    lats = sorted(lat)
    counts = [whole[j].count for j in ids]
    write_figures(a.out, {
        "followers": a.followers, "followers_open": connected, "followers_ok": a.followers - len(bad),
        "followers_failed": len(bad), "connect_errors": connect_errors,
        "connect_s": f"{t_ready - t_start:.2f}", "drain_s": f"{drain:.2f}",
        "events_checked": checked, "events_per_job_min": min(counts),
        "events_per_job_max": max(counts), "events_total": sum(counts),
        "deliver_n": len(lats), "deliver_p50_ms": f"{percentile(lats, 50) * 1000:.1f}",
        "deliver_p99_ms": f"{percentile(lats, 99) * 1000:.1f}",
        "deliver_max_ms": f"{(lats[-1] if lats else 0) * 1000:.1f}",
        "ingest_n": len(ingest), "ingest_p50_ms": f"{percentile(ingest, 50) * 1000:.1f}",
        "ingest_p99_ms": f"{percentile(ingest, 99) * 1000:.1f}",
        "ingest_max_ms": f"{(ingest[-1] if ingest else 0) * 1000:.1f}"})
    sys.exit(1 if bad else 0)


# ---- fill ---------------------------------------------------------------------------------------

def cmd_fill(a):
    """Clones a finished job of the database (every column, whatever the schema has by now) into
    N finished jobs with an attempt and E events each: a state event at the start, train lines,
    the final state; ids carry on after the highest."""
    db = sqlite3.connect(a.db, isolation_level=None)
    db.execute("PRAGMA synchronous = OFF")
    cols = [r[1] for r in db.execute("PRAGMA table_info(jobs)")]
    acols = [r[1] for r in db.execute("PRAGMA table_info(attempts)")]
    for need in ("id", "name", "state", "created_at", "started_at", "finished_at", "last_seq"):
        if need not in cols:
            fail(f"the jobs table has no column {need} (the schema changed: update load.py)")
    row = db.execute(f"SELECT {', '.join(cols)} FROM jobs WHERE state='succeeded' "
                     "AND kind='command' ORDER BY id DESC LIMIT 1").fetchone()
    if not row:
        fail("no succeeded job in the database to clone")
    tmpl = dict(zip(cols, row))
    arow = db.execute(f"SELECT {', '.join(acols)} FROM attempts WHERE job_id=? ORDER BY attempt "
                      "LIMIT 1", (tmpl["id"],)).fetchone()
    first = db.execute("SELECT COALESCE(MAX(id), 0) FROM jobs").fetchone()[0] + 1
    n_train = max(0, a.events - 3)
    now = time.time() - a.jobs * 2.0  # spread over the past: two seconds a job
    t0 = time.time()
    db.execute("BEGIN")
    jobs_sql = f"INSERT INTO jobs ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
    att_sql = f"INSERT INTO attempts ({', '.join(acols)}) VALUES ({', '.join('?' * len(acols))})"
    ev_sql = "INSERT INTO events (job_id, seq, type, data) VALUES (?,?,?,?)"
    st = '{"state":"%s","reason":null,"exit_code":%s,"attempt":0}'
    batch_j, batch_a, batch_e = [], [], []
    for k in range(a.jobs):
        jid = first + k
        created = now + 2.0 * k
        r = dict(tmpl, id=jid, name=f"load-finished-{jid}", created_at=created,
                 started_at=created + 0.1, finished_at=created + 1.5, last_seq=a.events)
        if "pgid" in r:
            r["pgid"] = 0
        batch_j.append(tuple(r[c] for c in cols))
        if arow:
            ar = dict(zip(acols, arow), job_id=jid, started_at=created + 0.1,
                      finished_at=created + 1.5)
            batch_a.append(tuple(ar[c] for c in acols))
        seq = 1
        batch_e.append((jid, seq, "state", st % ("queued", "null")))
        seq += 1
        batch_e.append((jid, seq, "state", st % ("running", "null")))
        for s in range(1, n_train + 1):
            seq += 1
            batch_e.append((jid, seq, "train", '{"event":"train","step":%d,"loss":%.6f}'
                            % (s * 10, 2.0 / (1 + s))))
        if a.events >= 3:
            seq += 1
            batch_e.append((jid, seq, "state", st % ("succeeded", "0")))
        if len(batch_e) > 200000 or k == a.jobs - 1:
            db.executemany(jobs_sql, batch_j)
            db.executemany(att_sql, batch_a)
            db.executemany(ev_sql, batch_e)
            batch_j, batch_a, batch_e = [], [], []
    db.execute("COMMIT")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    total = db.execute("SELECT COUNT(*) FROM jobs").fetchone()[0]
    events = db.execute("SELECT COUNT(*) FROM events").fetchone()[0]
    db.close()
    write_figures(a.out, {"fill_jobs": a.jobs, "fill_events_per_job": a.events, "db_jobs": total,
                          "db_events": events, "fill_s": f"{time.time() - t0:.1f}",
                          "db_mib": f"{os.path.getsize(a.db) / 1048576:.0f}"})


# ---- page ---------------------------------------------------------------------------------------

def cmd_page(a):
    """GET /v1/jobs?limit=50&offset=K over random K (the same offsets twice: the first visit of a
    page renders its jobs, the second finds them rendered) and with a state filter, one request at
    a time, timed from the request's first byte to the response's last."""
    u = urllib.parse.urlparse(a.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    hdr = {"Authorization": "Bearer " + a.token}
    rnd = random.Random(21)
    offsets = [rnd.randrange(0, max(1, a.total - 50)) for _ in range(a.requests)]
    figures = {}
    passes = {"cold": "limit=50&offset=%d", "warm": "limit=50&offset=%d",
              "state": "state=succeeded&limit=50&offset=%d"}
    for name in a.passes.split(","):
        query = passes[name]
        times = []
        for off in offsets:
            t = time.perf_counter()
            conn.request("GET", "/v1/jobs?" + query % off, headers=hdr)
            r = conn.getresponse()
            body = r.read()
            times.append(time.perf_counter() - t)
            if r.status != 200:
                fail(f"GET /v1/jobs?{query % off} -> {r.status} {body[:200]!r}")
            page = json.loads(body)
            if len(page["jobs"]) != 50 or page["next_offset"] != off + 50:
                fail(f"GET /v1/jobs?{query % off}: {len(page['jobs'])} jobs, next_offset "
                     f"{page['next_offset']} (expected 50 and {off + 50})")
        times.sort()
        key = f"{a.tag}_{name}"
        figures[f"{key}_p50_ms"] = f"{percentile(times, 50) * 1000:.2f}"
        figures[f"{key}_p99_ms"] = f"{percentile(times, 99) * 1000:.2f}"
        figures[f"{key}_max_ms"] = f"{times[-1] * 1000:.2f}"
    figures[f"{a.tag}_requests"] = a.requests
    write_figures(a.out, figures)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("submit")
    s.add_argument("url"), s.add_argument("token")
    s.add_argument("--jobs", type=int, required=True)
    s.add_argument("--short", type=int, default=0)
    s.add_argument("--interval-ms", type=float, required=True)
    s.add_argument("--stop", required=True)
    s.add_argument("--t0", type=float, required=True)
    s.add_argument("--max-s", type=int, required=True)
    f = sub.add_parser("follow")
    f.add_argument("url"), f.add_argument("token")
    f.add_argument("--ids", required=True)
    f.add_argument("--followers", type=int, required=True)
    f.add_argument("--ready", required=True)
    f.add_argument("--stop", required=True)
    f.add_argument("--t0", type=float, default=0.0)
    f.add_argument("--out", required=True)
    f.add_argument("--timeout", type=float, required=True)
    d = sub.add_parser("fill")
    d.add_argument("db")
    d.add_argument("--jobs", type=int, required=True)
    d.add_argument("--events", type=int, required=True)
    d.add_argument("--out", required=True)
    g = sub.add_parser("page")
    g.add_argument("url"), g.add_argument("token")
    g.add_argument("--total", type=int, required=True)
    g.add_argument("--requests", type=int, required=True)
    g.add_argument("--passes", default="cold,warm,state")
    g.add_argument("--tag", default="page")
    g.add_argument("--out", required=True)
    a = p.parse_args()
    {"submit": cmd_submit, "follow": cmd_follow, "fill": cmd_fill, "page": cmd_page}[a.cmd](a)


if __name__ == "__main__":
    main()
