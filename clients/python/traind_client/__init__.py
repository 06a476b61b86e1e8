"""A Python client for traind's HTTP API v1 (api/README.md), standard library only.

    from traind_client import Client
    c = Client("http://127.0.0.1:8470", token)            # or Client.local()
    c = Client("https://gpu1:8470", token, cafile="ca.pem")  # a daemon with --tls-cert
    job = c.submit(spec, nproc=2)
    for ev in job.events():                                # SSE; resumes after a dropped stream
        print(ev.event, ev.data)
    print(job.wait(), job.metrics()[-1])
    job.download(job.checkpoints()[-1]["step"], "model.safetensors")
    exp = c.create_experiment({"job": spec,                # a hyperparameter search
                               "space": {"train.optimizer.lr": {"grid": [0.01, 0.1]}},
                               "searcher": {"type": "grid", "metric": "val_acc", "mode": "max"}})
    print(exp.wait(), exp.best["hparams"], exp.download_best("."))

API errors raise APIError, which carries the HTTP status and the daemon's code, message and
field (the JSON path at fault).
"""
from __future__ import annotations

import http.client
import json
import os
import ssl
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, Iterator

__all__ = ["APIError", "Client", "Event", "Experiment", "Job"]

FINAL_STATES = ("succeeded", "failed", "cancelled")


class APIError(Exception):
    """An error answer of the API: status (400, 404, ...), code ("invalid_spec", ...), message,
    field (the JSON path at fault, or None)."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None):
        super().__init__(f"HTTP {status} {code}: {message}" + (f" (at {field})" if field else ""))
        self.status, self.code, self.message, self.field = status, code, message, field


@dataclass
class Event:
    """One Server-Sent Event of a job: its id (per job, +1 each), its name and its JSON data."""
    id: int
    event: str
    data: Any


class Client:
    """A traind daemon at url (http://HOST:PORT, or https://HOST:PORT for one started with
    --tls-cert), with its API token. cafile: the CA certificates (PEM) its certificate must
    chain to, instead of the system's; the host name is checked either way."""

    def __init__(self, url: str, token: str, timeout: float = 60.0, cafile: str | None = None):
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"url {url!r}: expected http://HOST:PORT or https://HOST:PORT")
        if cafile is not None and u.scheme != "https":
            raise ValueError(f"cafile {cafile!r} is for an https:// url, not {url!r}")
        self.host, self.port = u.hostname, u.port or (443 if u.scheme == "https" else 80)
        self.token, self.timeout = token, timeout
        self.tls = (ssl.create_default_context(cafile=cafile) if u.scheme == "https" else None)

    @classmethod
    def local(cls, url: str | None = None, state_dir: str | None = None,
              timeout: float = 60.0) -> "Client":
        """The daemon trainctl would talk to, found as trainctl finds it: the url given, else
        $TRAIND_URL, else "url" in the client config file ($XDG_CONFIG_HOME/traind/client.json,
        else ~/.config/traind/client.json), else http://127.0.0.1:8470; the token from
        $TRAIND_TOKEN, else the config's "token" or "token_file", else the local daemon's state
        directory (state_dir, or ~/.local/state/traind, or /var/lib/traind); the CA from
        $TRAIND_CACERT or the config's "cacert" for an https:// url."""
        config_dir = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
        config_path = os.path.join(config_dir, "traind", "client.json")
        config: dict[str, Any] = {}
        if os.path.exists(config_path):
            with open(config_path) as f:
                try:
                    config = json.load(f)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{config_path}: {e}") from None
            if not isinstance(config, dict):
                raise ValueError(f"{config_path}: expected a JSON object")
        url = url or os.environ.get("TRAIND_URL") or config.get("url") or "http://127.0.0.1:8470"
        if "://" not in url:
            url = "http://" + url
        cafile = os.environ.get("TRAIND_CACERT") or config.get("cacert") or None
        if not url.startswith("https://"):
            cafile = None
        token = os.environ.get("TRAIND_TOKEN") or config.get("token")
        if not token:
            tried = []
            files = [config["token_file"]] if config.get("token_file") else []
            if state_dir is not None:
                files.append(os.path.join(state_dir, "token"))
            elif not files:
                files += [os.path.join(os.environ.get("XDG_STATE_HOME") or
                                       os.path.expanduser("~/.local/state"), "traind", "token"),
                          "/var/lib/traind/token"]
            for path in files:
                try:
                    with open(path) as f:
                        token = f.readline().strip()
                except OSError as e:
                    tried.append(f"{path} ({e.strerror})")
                    continue
                if token:
                    break
                tried.append(f"{path} (empty)")
            if not token:
                raise ValueError("no API token: set TRAIND_TOKEN, or \"token\" in "
                                 f"{config_path}; looked in {'; '.join(tried)}")
        return cls(url.rstrip("/"), token, timeout=timeout, cafile=cafile)

    # -- plumbing

    def _open(self, method: str, path: str, body: Any = None,
              headers: dict[str, str] | None = None, timeout: float | None = None):
        """(connection, response); the caller reads the response and closes the connection."""
        t = timeout if timeout is not None else self.timeout
        conn = (http.client.HTTPSConnection(self.host, self.port, timeout=t, context=self.tls)
                if self.tls is not None else http.client.HTTPConnection(self.host, self.port,
                                                                       timeout=t))
        h = {"Authorization": f"Bearer {self.token}"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            h["Content-Type"] = "application/json"
        h.update(headers or {})
        try:
            conn.request(method, path, data, h)
            resp = conn.getresponse()
        except BaseException:
            conn.close()
            raise
        if resp.status >= 400:
            raw = resp.read()
            conn.close()
            raise _api_error(resp.status, raw)
        return conn, resp

    def _json(self, method: str, path: str, body: Any = None) -> Any:
        conn, resp = self._open(method, path, body)
        try:
            raw = resp.read()
        finally:
            conn.close()
        return json.loads(raw) if raw else None

    # -- the API

    def submit(self, spec: dict, **resources: Any) -> "Job":
        """Submits a job (a train spec, or a command job's object); keyword arguments go to its
        `resources` (nproc=2, time_limit_s=600, ...)."""
        spec = dict(spec)
        if resources:
            spec["resources"] = {**spec.get("resources", {}), **resources}
        return Job(self, self._json("POST", "/v1/jobs", spec))

    def job(self, job_id: int) -> "Job":
        return Job(self, self._json("GET", f"/v1/jobs/{int(job_id)}"))

    def jobs(self, state: str | list[str] | None = None, limit: int = 50,
             offset: int = 0) -> list["Job"]:
        """Jobs newest first; state: one state or several."""
        q = {"limit": limit, "offset": offset}
        if state:
            q["state"] = state if isinstance(state, str) else ",".join(state)
        listing = self._json("GET", "/v1/jobs?" + urllib.parse.urlencode(q))
        return [Job(self, j) for j in listing["jobs"]]

    def create_experiment(self, body: dict) -> "Experiment":
        """Creates an experiment, a hyperparameter search whose trials are jobs: body is
        {"name", "job": a job as submit takes it, "space": {path: {"grid": [...]} | {"choice":
        [...]} | {"uniform": [lo, hi]} | {"log_uniform": [lo, hi]} | {"int": [lo, hi]}},
        "searcher": {"type": "grid" | "random", "metric", "mode": "min" | "max", "max_trials"},
        "max_concurrent", "seed", "priority"} (api/README.md, "Experiments")."""
        return Experiment(self, self._json("POST", "/v1/experiments", body))

    def experiments(self) -> list["Experiment"]:
        """Experiments newest first, as the list gives them: without their trials (`trials`
        and `best` read the whole experiment when asked)."""
        listing = self._json("GET", "/v1/experiments")
        return [Experiment(self, e) for e in listing["experiments"]]

    def experiment(self, experiment_id: int) -> "Experiment":
        return Experiment(self, self._json("GET", f"/v1/experiments/{int(experiment_id)}"))

    def nodes(self) -> list[dict]:
        """The cluster's nodes as the master sees them (GET /v1/nodes)."""
        return self._json("GET", "/v1/nodes")["nodes"]

    def version(self) -> dict:
        return self._json("GET", "/v1/version")


class Job:
    """A job: its id and its last known JSON (data); refresh() reads it again."""

    def __init__(self, client: Client, data: dict):
        self.client, self.data = client, data
        self.id: int = data["id"]

    @property
    def state(self) -> str:
        return self.data["state"]

    def __repr__(self) -> str:
        return f"Job({self.id}, {self.data.get('name')!r}, {self.state})"

    def refresh(self) -> "Job":
        self.data = self.client._json("GET", f"/v1/jobs/{self.id}")
        return self

    def events(self, after: int | None = None, retries: int = 5) -> Iterator[Event]:
        """The job's events from its start (or after id `after`) until its final state. When
        the stream drops (a daemon restart, a network blip), it reconnects with Last-Event-ID:
        nothing is missed or repeated; it gives up after `retries` failed reconnections in a
        row."""
        last, failures = after, 0
        while True:
            headers = {"Accept": "text/event-stream"}
            if last is not None:
                headers["Last-Event-ID"] = str(last)
            try:
                conn, resp = self.client._open("GET", f"/v1/jobs/{self.id}/events",
                                               headers=headers)
            except ssl.SSLCertVerificationError:
                raise  # a certificate that does not verify will not on the next try either
            except (OSError, http.client.HTTPException):
                failures += 1
                if failures > retries:
                    raise
                time.sleep(min(0.2 * 2 ** failures, 5))
                continue
            try:
                for ev in _read_sse(resp):
                    failures = 0
                    last = ev.id
                    yield ev
                    if ev.event == "state" and ev.data.get("state") in FINAL_STATES:
                        return
            except (OSError, http.client.HTTPException):
                pass  # dropped mid-stream: reconnect from the last id
            finally:
                conn.close()
            # the stream ended without a final state: the daemon went away; reconnect
            failures += 1
            if failures > retries:
                raise ConnectionError(f"job {self.id}: the event stream ended {failures} times "
                                      f"without a final state")
            time.sleep(min(0.2 * 2 ** failures, 5))

    def wait(self, timeout: float | None = None) -> str:
        """Follows the job to its final state and returns it (TimeoutError after timeout s)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for ev in self.events():
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {self.id} still {ev.event} after {timeout} s")
            if ev.event == "state" and ev.data.get("state") in FINAL_STATES:
                break
        self.refresh()
        return self.state

    def metrics(self, since: int | None = None) -> list[dict]:
        """Rank 0's metric events (train, eval, done, a command's own) with step > since."""
        q = "" if since is None else f"?since={int(since)}"
        return self.client._json("GET", f"/v1/jobs/{self.id}/metrics{q}")

    def logs(self, rank: int = 0, follow: bool = False) -> str | Iterator[str]:
        """Rank R's log as text; with follow=True an iterator over its lines until the job
        ends."""
        path = f"/v1/jobs/{self.id}/logs?rank={int(rank)}" + ("&follow=1" if follow else "")
        conn, resp = self.client._open("GET", path)
        if not follow:
            try:
                return resp.read().decode(errors="replace")
            finally:
                conn.close()

        def lines() -> Iterator[str]:
            try:
                while True:
                    line = resp.readline()
                    if not line:
                        return
                    yield line.decode(errors="replace").rstrip("\n")
            finally:
                conn.close()
        return lines()

    def checkpoints(self) -> list[dict]:
        return self.client._json("GET", f"/v1/jobs/{self.id}/checkpoints")

    def download(self, step: int, path: str, file: str = "model.safetensors") -> str:
        """Downloads one file of checkpoint `step` to path (a partial file there is resumed
        with Range) and checks its size; returns path."""
        have = os.path.getsize(path) if os.path.exists(path) else 0
        headers = {"Range": f"bytes={have}-"} if have else {}
        url = f"/v1/jobs/{self.id}/checkpoints/{int(step)}/{urllib.parse.quote(file)}"
        try:
            conn, resp = self.client._open("GET", url, headers=headers)
        except APIError as e:
            if e.status != 416:
                raise
            have, conn, resp = 0, *self.client._open("GET", url)  # larger than the file: anew
        try:
            if resp.status == 206:
                total = int(resp.getheader("Content-Range").rsplit("/", 1)[1])
                mode = "ab"
            else:
                total, mode, have = int(resp.getheader("Content-Length")), "wb", 0
            with open(path, mode) as f:
                while chunk := resp.read(1 << 16):
                    f.write(chunk)
        finally:
            conn.close()
        size = os.path.getsize(path)
        if size != total:
            raise IOError(f"{path}: {size} bytes after the download, expected {total}")
        return path

    def cancel(self) -> "Job":
        """Stops the job; returns when none of its processes is left."""
        self.data = self.client._json("POST", f"/v1/jobs/{self.id}/cancel")
        return self

    def delete(self) -> None:
        """Removes a finished job with its files."""
        conn, resp = self.client._open("DELETE", f"/v1/jobs/{self.id}")
        resp.read()
        conn.close()


class Experiment:
    """An experiment: its id and its last known JSON (data); refresh() reads it again. The API
    has an event stream for experiments (GET /v1/experiments/ID/events); wait() polls, which
    needs no thread."""

    def __init__(self, client: Client, data: dict):
        self.client, self.data = client, data
        self.id: int = data["id"]

    @property
    def state(self) -> str:
        """running (or paused, by pause()), then succeeded (some trial reported the metric),
        failed or cancelled."""
        return self.data["state"]

    @property
    def trials(self) -> list[dict]:
        """Each trial: {"trial", "hparams": {path: value}, "state", "job" (an id, or None before
        it is made), "latest" and "best" ({"step", "value"} of the metric, or None), "steps",
        "reason"}, by number; under ASHA also "rung" and "rung_values", under PBT "generation",
        "stop_at" and "exploits" (api/README.md, "Experiments")."""
        if "trials" not in self.data:  # a summary from Client.experiments()
            self.refresh()
        return self.data["trials"]

    @property
    def best(self) -> dict | None:
        """The best trial, {"trial", "job", "hparams", "value", "step", "checkpoint": {"step",
        "url", "archive_url"} or None}, or None while no trial has reported the metric."""
        if "trials" not in self.data:
            self.refresh()
        return self.data["best"]

    def __repr__(self) -> str:
        return f"Experiment({self.id}, {self.data.get('name')!r}, {self.state})"

    def refresh(self) -> "Experiment":
        self.data = self.client._json("GET", f"/v1/experiments/{self.id}")
        return self

    def wait(self, timeout: float | None = None, poll_s: float = 1.0) -> str:
        """Polls the experiment every poll_s seconds until it has ended and returns its state
        (TimeoutError after timeout s). A paused experiment has not ended: it waits on."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.refresh().state in ("running", "paused"):
            if deadline is not None and time.monotonic() + poll_s > deadline:
                raise TimeoutError(f"experiment {self.id} still running after {timeout} s")
            time.sleep(poll_s)
        return self.state

    def cancel(self) -> "Experiment":
        """Stops making trials and stops the unfinished ones. Returns at once: the experiment
        stays running until they have ended, then is cancelled (wait() for it)."""
        self.data = self.client._json("POST", f"/v1/experiments/{self.id}/cancel")
        return self

    def pause(self) -> "Experiment":
        """No trial is made or promoted; the unfinished ones are paused (a running one stops, to
        go on from its latest checkpoint), holding no slot, until resume(). Kept across daemon
        restarts."""
        self.data = self.client._json("POST", f"/v1/experiments/{self.id}/pause")
        return self

    def resume(self) -> "Experiment":
        """A paused experiment goes on: its paused trials first, then its searcher."""
        self.data = self.client._json("POST", f"/v1/experiments/{self.id}/resume")
        return self

    def delete(self) -> None:
        """Removes an ended experiment with its trials' jobs and their files."""
        conn, resp = self.client._open("DELETE", f"/v1/experiments/{self.id}")
        resp.read()
        conn.close()

    def download_best(self, dest_dir: str = ".") -> str:
        """Downloads the best trial's checkpoint as a tar archive to
        dest_dir/exp-ID-best-step-S.tar (dest_dir made if missing) and returns its path. The
        archive is written under a temporary name and renamed once whole. LookupError when
        there is no best trial yet or its job registered no checkpoint."""
        best = self.refresh().best
        if best is None:
            raise LookupError(f"experiment {self.id} has no best trial yet: no trial has "
                              f"reported {self.data['searcher']['metric']}")
        ck = best["checkpoint"]
        if ck is None:
            raise LookupError(f"trial {best['trial']} (job {best['job']}), the best of experiment "
                              f"{self.id}, has no checkpoint: its job registered none")
        os.makedirs(dest_dir, exist_ok=True)
        path = os.path.join(dest_dir, f"exp-{self.id}-best-step-{ck['step']}.tar")
        part = path + ".part"
        conn, resp = self.client._open("GET", ck["archive_url"])
        try:
            with open(part, "wb") as f:
                while chunk := resp.read(1 << 16):  # a cut-short archive raises IncompleteRead
                    f.write(chunk)
        except BaseException:
            if os.path.exists(part):
                os.unlink(part)
            raise
        finally:
            conn.close()
        os.replace(part, path)
        return path


def _api_error(status: int, raw: bytes) -> APIError:
    try:
        e = json.loads(raw)["error"]
        return APIError(status, e.get("code", "?"), e.get("message", ""), e.get("field"))
    except (ValueError, KeyError, TypeError):
        return APIError(status, "http_error", raw[:500].decode(errors="replace"))


def _read_sse(resp) -> Iterator[Event]:
    """Server-Sent Event records from a response: id, event and (JSON) data lines, a blank line
    ending each; comment lines (":") are keep-alives."""
    ev_id, name, data = None, "message", []
    while True:
        raw = resp.readline()
        if not raw:
            return
        line = raw.decode(errors="replace").rstrip("\r\n")
        if not line:
            if data:
                yield Event(int(ev_id) if ev_id is not None else -1, name,
                            json.loads("\n".join(data)))
            ev_id, name, data = None, "message", []
        elif line.startswith(":"):
            continue
        else:
            key, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if key == "id":
                ev_id = value
            elif key == "event":
                name = value
            elif key == "data":
                data.append(value)
