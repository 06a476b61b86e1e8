#!/usr/bin/python3
"""GET /metrics against a real traind: Prometheus's own checker (promtool check metrics) accepts
it, and its values are the API's: jobs by state and the queue, a running job's step, loss and
throughput, the node's slots and GPUs, requests by route and status, open event streams, the
database's size. Without the token it is refused like any route.

    /usr/bin/python3 tests/integration/prometheus_test.py TRAIND SOURCE_DIR"""
import http.client
import os
import re
import subprocess
import sys
import unittest

from prometheus_client.parser import text_string_to_metric_families

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402


def samples(text):
    """{(name, frozenset(labels)): value} of every sample."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(got, metric, **labels):
    return got.get((metric, frozenset(labels.items())))


class PrometheusTest(harness.DaemonTest):
    def scrape(self, d):
        status, headers, body = d.request("GET", "/metrics")
        self.assertEqual(status, 200, body)
        self.assertTrue(headers["content-type"].startswith("text/plain; version=0.0.4"))
        text = body.decode()
        check = subprocess.run(["promtool", "check", "metrics"], input=text, text=True,
                               capture_output=True)
        self.assertEqual(check.returncode, 0, check.stdout + check.stderr + text)
        return text, samples(text)

    def test_metrics_match_the_api(self):
        d = self.start_daemon("--gpus", "0,1,2")
        gate = os.path.join(d.state_dir, "gate")
        # a job that prints one train line and waits; a second that waits for the first's GPUs
        line = ('{"event": "train", "step": 42, "loss": 0.125, "samples_per_s": 900.5}')
        hold = ["/bin/sh", "-c", f"echo '{line}'; while [ ! -e \"$0\" ]; do sleep 0.05; done",
                gate]
        status, _, a = d.json("POST", "/v1/jobs", {"name": 'a "quoted" name', "command": hold,
                                                   "resources": {"nproc": 2}})
        self.assertEqual(status, 201, a)
        status, _, b = d.json("POST", "/v1/jobs", {"name": "b", "command": hold,
                                                   "resources": {"nproc": 2}})
        self.assertEqual(status, 201, b)
        self.assertEqual(d.request("GET", "/v1/jobs/999")[0], 404)
        # a method a client made up is counted as "other", never as a label of its own
        self.assertEqual(d.request("FROB", "/v1/jobs")[0], 405)
        stream = d.events(a["id"])
        self.addCleanup(stream.close)
        stream.until(lambda e: e.event == "train", "job a's train line")

        text, got = self.scrape(d)
        jobs = d.json("GET", "/v1/jobs")[2]["jobs"]
        for state in ("queued", "running", "succeeded", "failed", "cancelled", "restarting",
                      "paused"):
            self.assertEqual(value(got, "traind_jobs", state=state),
                             len([j for j in jobs if j["state"] == state]), state)
        self.assertEqual(value(got, "traind_queue_length"), 1)
        self.assertGreater(value(got, "traind_queue_oldest_wait_seconds"), 0)
        job = d.json("GET", f"/v1/jobs/{a['id']}")[2]
        labels = {"job": str(a["id"]), "name": 'a "quoted" name'}
        self.assertEqual(value(got, "traind_job_step", **labels), job["latest"]["train"]["step"])
        self.assertEqual(value(got, "traind_job_loss", **labels), job["latest"]["train"]["loss"])
        self.assertEqual(value(got, "traind_job_samples_per_second", **labels), 900.5)
        self.assertGreaterEqual(value(got, "traind_job_last_metric_age_seconds", **labels), 0)
        node = d.json("GET", "/v1/nodes")[2]["nodes"][0]
        self.assertEqual(value(got, "traind_node_slots", node=node["name"]), node["slots"]["total"])
        self.assertEqual(value(got, "traind_node_slots_used", node=node["name"]), 2)
        self.assertEqual(value(got, "traind_node_gpus", node=node["name"]), 3)
        self.assertEqual(value(got, "traind_node_state", node=node["name"], state="ready"), 1)
        self.assertEqual(value(got, "traind_sse_clients"), 1)
        # a request is counted when its last byte has gone, which may be just after the client
        # read it: polled
        want = {("traind_http_requests_total", "/v1/jobs", "POST", "201"): 2,
                ("traind_http_requests_total", "/v1/jobs/{id}", "GET", "404"): 1,
                ("traind_http_requests_total", "/v1/jobs", "other", "405"): 1,
                ("traind_http_request_duration_seconds_count", "/v1/jobs", "POST", None): 2}

        def counted():
            now = self.scrape(d)[1]
            return all(value(now, m, route=r, method=k, **({"code": c} if c else {})) == n
                       for (m, r, k, c), n in want.items())
        harness.wait_for(counted, f"the requests counted: {want}")
        self.assertNotIn("FROB", self.scrape(d)[0])
        db = sum(os.path.getsize(os.path.join(d.state_dir, f))
                 for f in ("state.db", "state.db-wal")
                 if os.path.exists(os.path.join(d.state_dir, f)))
        self.assertGreater(value(got, "traind_database_bytes"), 0)
        self.assertLessEqual(value(got, "traind_database_bytes"), db)

        stream.close()  # the stream's end is counted once the server sees the client gone
        open(gate, "w").close()
        for jid in (a["id"], b["id"]):
            self.assertEqual(d.follow(jid)[-1].data["state"], "succeeded")
        _, got = self.scrape(d)
        self.assertEqual(value(got, "traind_jobs", state="succeeded"), 2)
        self.assertEqual(value(got, "traind_queue_length"), 0)
        self.assertIsNone(value(got, "traind_job_step", **labels), "only running jobs")
        # d.follow's streams ended with their jobs; a's own was closed by the client
        harness.wait_for(lambda: value(self.scrape(d)[1], "traind_sse_clients") == 0,
                         "every event stream to be counted closed")
        status, _, _ = d.request("GET", "/metrics", token=False)
        self.assertEqual(status, 401)


    def test_metrics_listener_without_token(self):
        """metrics_listen: GET /metrics alone on a port of its own, without the token; the API
        port still asks for it, and the metrics port serves nothing else."""
        d = self.start_daemon("--metrics-listen", "127.0.0.1:0")
        rx = re.compile(r"metrics \(GET /metrics, no token\) on http://127\.0\.0\.1:(\d+)/metrics")
        port = harness.wait_for(
            lambda: next((int(m.group(1)) for m in map(rx.search, d.stderr_lines) if m), None),
            "the metrics listener's line")
        self.assertNotEqual(port, d.port)

        def get(method, path):
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=harness.TIMEOUT)
            try:
                c.request(method, path)
                r = c.getresponse()
                return r.status, dict(r.getheaders()), r.read().decode()
            finally:
                c.close()
        status, headers, text = get("GET", "/metrics")
        self.assertEqual(status, 200, text)
        self.assertTrue(headers["Content-Type"].startswith("text/plain; version=0.0.4"))
        check = subprocess.run(["promtool", "check", "metrics"], input=text, text=True,
                               capture_output=True)
        self.assertEqual(check.returncode, 0, check.stdout + check.stderr)
        got = samples(text)
        self.assertEqual(value(got, "traind_jobs", state="queued"), 0, text[:800])
        self.assertEqual(value(got, "traind_queue_length"), 0, text[:800])
        status, _, body = get("GET", "/v1/jobs")
        self.assertEqual(status, 404, body)
        self.assertIn("serves GET /metrics only", body)
        status, headers, _ = get("POST", "/metrics")
        self.assertEqual((status, headers.get("Allow")), (405, "GET, HEAD"))
        self.assertEqual(d.request("GET", "/metrics", token=False)[0], 401,
                         "the API port's /metrics still needs the token")


def main():
    harness.TRAIND = os.path.abspath(sys.argv[1])
    harness.SOURCE_DIR = os.path.abspath(sys.argv[2])
    suite = unittest.TestSuite([PrometheusTest("test_metrics_match_the_api"),
                                PrometheusTest("test_metrics_listener_without_token")])
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    sys.exit(0 if result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
