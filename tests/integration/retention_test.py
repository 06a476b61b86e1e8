#!/usr/bin/python3
"""Retention under a real traind: finished jobs are removed (their database rows, directory,
metrics and events) past keep_finished_jobs and keep_finished_for_s, running ones never; a
reload (SIGHUP) applies new limits at once; what an interrupted removal left and the old
directories of parts that ran here are cleared at start.

    /usr/bin/python3 tests/integration/retention_test.py TRAIND SOURCE_DIR"""
import json
import os
import re
import signal
import sqlite3
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402
from harness import wait_for  # noqa: E402

# a command job that prints one metric line and ends: something in every table
METRIC = '{"event": "train", "step": 1, "loss": 0.5}'


def quick(name):
    return {"name": name, "command": ["/bin/sh", "-c", f"echo '{METRIC}'"]}


class RetentionTest(harness.DaemonTest):
    def run_job(self, d, name):
        job, _ = d.submit(quick(name))
        events = d.follow(job["id"])
        self.assertEqual(events[-1].data["state"], "succeeded", events[-1].data)
        return job["id"]

    def rows(self, state, job_id):
        """The job's rows in each table of the state database (read beside the daemon: WAL)."""
        db = sqlite3.connect(f"file:{state}/state.db?mode=ro", uri=True)
        try:
            out = {}
            for table, col in (("jobs", "id"), ("events", "job_id"), ("metrics", "job_id"),
                               ("attempts", "job_id")):
                out[table] = db.execute(f"SELECT count(*) FROM {table} WHERE {col}=?",
                                        (job_id,)).fetchone()[0]
            return out
        finally:
            db.close()

    def wait_log(self, d, pattern):
        """The removal is logged once its files are gone, after the job left the API."""
        rx = re.compile(pattern)
        wait_for(lambda: rx.search(d.stderr_tail(100000)), f"a log line matching {pattern}")

    def gone(self, d, job_id):
        return d.request("GET", f"/v1/jobs/{job_id}")[0] == 404

    def expired_total(self, d):
        status, _, body = d.request("GET", "/metrics")
        self.assertEqual(status, 200)
        m = re.search(rb"^traind_jobs_expired_total (\d+)$", body, re.M)
        self.assertIsNotNone(m, "GET /metrics has traind_jobs_expired_total")
        return int(m.group(1))

    def test_count_keeps_the_newest_and_never_a_running_job(self):
        state = self.new_state_dir()
        config = os.path.join(state, "traind.json")
        with open(config, "w") as f:
            json.dump({"keep_finished_jobs": 2, "keep_finished_for_s": 0}, f)
        d = self.start_daemon("--slots", "2", "--config", config, state_dir=state)
        long_job, _ = d.submit({"name": "long", "command": ["sleep", "300"]})
        ids = [self.run_job(d, f"quick-{i}") for i in range(4)]
        before = self.rows(state, ids[-1])
        self.assertTrue(all(before.values()), f"a finished job has rows in every table: {before}")
        # the two oldest go (soon after the fourth finished), the two newest stay
        wait_for(lambda: self.gone(d, ids[0]) and self.gone(d, ids[1]), "the two oldest removed")
        for jid in ids[:2]:
            self.assertFalse(os.path.exists(f"{state}/jobs/{jid}"), f"job {jid}'s directory")
            self.assertEqual(self.rows(state, jid), {t: 0 for t in before}, f"job {jid}'s rows")
            self.assertEqual(d.request("GET", f"/v1/jobs/{jid}/metrics")[0], 404)
        for jid in ids[2:]:
            self.assertEqual(d.request("GET", f"/v1/jobs/{jid}")[0], 200, f"job {jid} is kept")
            self.assertTrue(os.path.isdir(f"{state}/jobs/{jid}"))
            self.assertEqual(self.rows(state, jid), before, f"job {jid}'s rows are whole")
        self.assertEqual(d.json("GET", f"/v1/jobs/{long_job['id']}")[2]["state"], "running",
                         "a running job is not counted, nor removed")
        self.assertEqual(self.expired_total(d), 2)
        # in one sweep or in two, as the janitor's turns fell between the jobs' ends: the log
        # names both jobs and the rule
        self.wait_log(d, rf"retention: removed \d finished jobs? \(ids {ids[0]} to "
                         rf"\d+\): older than the newest 2 \(keep_finished_jobs\)")
        self.wait_log(d, rf"retention: removed \d finished jobs? \(ids \d+ to "
                         rf"{ids[1]}\): older than the newest 2 \(keep_finished_jobs\)")
        listed = [j["id"] for j in d.json("GET", "/v1/jobs")[2]["jobs"]]
        self.assertEqual(sorted(listed), sorted(ids[2:] + [long_job["id"]]))

        # a reload: a count of 1 applies at once, without another job finishing
        with open(config, "w") as f:
            json.dump({"keep_finished_jobs": 1, "keep_finished_for_s": 0}, f)
        os.kill(d.pid, signal.SIGHUP)
        wait_for(lambda: self.gone(d, ids[2]), "the older of the two removed after the reload")
        self.assertEqual(d.request("GET", f"/v1/jobs/{ids[3]}")[0], 200)
        with open(config, "w") as f:
            json.dump({"keep_finished_jobs": 0, "keep_finished_for_s": 1}, f)
        os.kill(d.pid, signal.SIGHUP)
        wait_for(lambda: self.gone(d, ids[3]), "a job finished over a second ago removed once "
                                               "keep_finished_for_s is 1")
        self.assertEqual(d.json("GET", f"/v1/jobs/{long_job['id']}")[2]["state"], "running")
        db = sqlite3.connect(f"file:{state}/state.db?mode=ro", uri=True)
        self.assertEqual(db.execute("PRAGMA integrity_check").fetchone()[0], "ok")
        db.close()

    def test_time_limit_and_leftovers_at_start(self):
        state = self.new_state_dir()
        d = self.start_daemon("--slots", "1", "--keep-finished-for", "0",
                              "--keep-finished-jobs", "0", state_dir=state)
        kept = self.run_job(d, "kept")
        d.stop()
        # what a removal cut short left, an old directory of a part that ran here (no row), and
        # a recent one: the first two go when the daemon starts, the last stays
        for name in (".deleted-77/checkpoints", "900/checkpoints", "901"):
            os.makedirs(f"{state}/jobs/{name}")
        with open(f"{state}/jobs/900/rank-1.log", "w") as f:
            f.write("a part's log\n")
        two_days_ago = time.time() - 2 * 86400
        os.utime(f"{state}/jobs/900", (two_days_ago, two_days_ago))
        d.args = ["--slots", "1", "--keep-finished-for", "86400", "--keep-finished-jobs", "0"]
        d.start()
        wait_for(lambda: not os.path.exists(f"{state}/jobs/.deleted-77"), "the leftover removed")
        wait_for(lambda: not os.path.exists(f"{state}/jobs/900"), "the old part's directory")
        self.wait_log(d, r"retention: removed 1 job directory without a job \(ids 900 to 900\)")
        self.assertTrue(os.path.isdir(f"{state}/jobs/901"), "a recent one stays")
        self.assertEqual(d.request("GET", f"/v1/jobs/{kept}")[0], 200,
                         "finished a moment ago: kept for a day")
        # a job finished more than the limit ago (its finish time moved back in the database
        # while no daemon runs) goes at the next start
        d.stop()
        db = sqlite3.connect(f"{state}/state.db")
        db.execute("UPDATE jobs SET finished_at=? WHERE id=?", (two_days_ago, kept))
        db.commit()
        db.close()
        d.start()
        wait_for(lambda: self.gone(d, kept), "a job finished two days ago removed")
        self.assertFalse(os.path.exists(f"{state}/jobs/{kept}"))
        self.wait_log(d, r"retention: removed 1 finished job \(ids \d+ to \d+\): finished more "
                         r"than 86400 s ago \(keep_finished_for_s\)")


def main():
    harness.TRAIND = os.path.abspath(sys.argv[1])
    harness.SOURCE_DIR = os.path.abspath(sys.argv[2])
    names = sys.argv[3:] or [n for n in dir(RetentionTest)  # not the inherited harness's
                             if n.startswith("test_") and n in RetentionTest.__dict__]
    suite = unittest.TestSuite([RetentionTest(n) for n in names])
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    sys.exit(0 if result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
