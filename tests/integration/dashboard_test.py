#!/usr/bin/python3
"""The web dashboard in a real browser (Debian's chromium, headless, driven by chromedriver
through python3-selenium) against a real traind: sign-in with the token (a wrong one refused),
a job submitted from the Submit page whose charts grow while it runs and end with as many points
as the metrics API has, rank 0's log in the log viewer, a job cancelled from its page, and the
session's protections (no cookie: 401; a change without the CSRF token, or with a forged one:
403; signing out ends the session; a Content-Security-Policy without inline script), and metric
values a job chose that are not numbers (not plotted; the numbers around them are). Screenshots
of the Jobs and Job pages go to $TRAIND_ARTIFACTS (default: a temporary directory, named in the
output), and the page's first paint is printed.

    /usr/bin/python3 tests/integration/dashboard_test.py TRAIND SOURCE_DIR"""
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402

from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException  # noqa: E402,E501
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support import expected_conditions as EC  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

TIMEOUT = 60
ARTIFACTS = None


def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1366,900",
              "--disable-dev-shm-usage"):
        opts.add_argument(a)
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)


class DashboardTest(harness.DaemonTest):
    def setUp(self):
        self.d = self.start_daemon("--slots", "1", "--grace", "2")
        self.url = f"http://127.0.0.1:{self.d.port}/"
        self.b = browser()
        self.addCleanup(self.b.quit)
        self.wait = WebDriverWait(self.b, TIMEOUT)

    def find(self, css):
        return self.wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, css)))

    def sign_in(self, token):
        box = self.find("#token")
        box.clear()
        box.send_keys(token)
        self.b.find_element(By.ID, "signin").click()

    def until(self, f, what):
        return harness.wait_for(f, what, TIMEOUT)

    def text(self, element_id):
        """An element's text, "" while the page is replacing it (it re-renders as events come)."""
        try:
            return self.b.find_element(By.ID, element_id).text
        except (NoSuchElementException, StaleElementReferenceException):
            return ""

    def points(self, chart="chart-loss"):
        """A chart's points, 0 while the page is not showing it yet or is replacing it (a page
        just navigated to)."""
        try:
            return int(self.b.find_element(By.ID, chart).get_attribute("data-points") or 0)
        except (NoSuchElementException, StaleElementReferenceException):
            return 0

    def test_a_sign_in_submit_charts_logs_cancel(self):
        b, d = self.b, self.d
        b.get(self.url)
        # (the browser records the paint entry a moment after it paints)
        paint = self.until(lambda: b.execute_script(
            "const p = performance.getEntriesByName('first-contentful-paint')[0];"
            "return p ? p.startTime : null;"), "the first contentful paint entry")
        print(f"\n[dashboard] first contentful paint: {paint:.0f} ms", file=sys.stderr)
        self.sign_in("0" * 64)
        alert = self.find("#signin-form .error")
        self.until(lambda: alert.is_displayed() and "not a live API token" in alert.text,
                   "the wrong token refused")
        self.sign_in(d.token)
        self.find("#jobs")

        # submit from the Submit page: a job long enough to watch its charts grow
        b.find_element(By.CSS_SELECTOR, "#nav a[data-page=submit]").click()
        spec = harness.train_spec("from-the-page", epochs=60)
        area = self.find("#spec")
        b.execute_script("arguments[0].value = arguments[1];", area, json.dumps(spec))
        # an error first: shown at its JSON path
        bad = dict(spec, train=dict(spec["train"], batch_size=0))
        b.execute_script("arguments[0].value = arguments[1];", area, json.dumps(bad))
        b.find_element(By.ID, "submit").click()
        self.assertEqual(self.find("#error-field").text, "train.batch_size")
        b.execute_script("arguments[0].value = arguments[1];", area, json.dumps(spec))
        b.find_element(By.ID, "submit").click()
        self.until(lambda: b.current_url.split("#")[-1].startswith("/job/"), "the job's page")
        jid = int(b.current_url.rsplit("/", 1)[1])
        self.find("#job-state")
        self.until(lambda: self.points() > 0 and "running" in self.text("job-state"),
                   "points while running")
        first = self.points()
        self.until(lambda: self.points() > first and
                   self.text("job-state") == "running", "the chart growing")
        b.set_window_size(1366, 1700)  # the whole page: facts, placement, charts, log
        b.save_screenshot(os.path.join(ARTIFACTS, "dashboard-job.png"))
        b.set_window_size(1366, 900)
        self.until(lambda: self.text("job-state") == "succeeded", "the job's end")
        metrics = d.json("GET", f"/v1/jobs/{jid}/metrics")[2]
        trains = [m for m in metrics if m["event"] == "train"]
        self.until(lambda: self.points() == len(trains), "every train point plotted")
        self.assertEqual(self.points("chart-lr"), len(trains))
        log = self.find("#log")
        self.until(lambda: "[traind]" in log.text, "rank 0's log in the viewer")
        self.until(lambda: len(b.find_elements(By.CSS_SELECTOR, "#checkpoints a")) > 0,
                   "checkpoint download links")

        # the Jobs page lists it; its screenshot
        b.find_element(By.CSS_SELECTOR, "#nav a[data-page=jobs]").click()
        self.until(lambda: b.find_elements(By.CSS_SELECTOR, f"#jobs-body tr[data-job='{jid}']"),
                   "the job in the list")
        b.save_screenshot(os.path.join(ARTIFACTS, "dashboard-jobs.png"))

        # cancel from the page, after confirming
        long_id = d.json("POST", "/v1/jobs", harness.train_spec("to-cancel", epochs=100000,
                                                                checkpoint=False))[2]["id"]
        b.get(f"{self.url}#/job/{long_id}")
        self.until(lambda: self.text("job-state") == "running", "running")
        b.find_element(By.ID, "cancel").click()
        self.wait.until(EC.alert_is_present()).accept()
        self.until(lambda: self.text("job-state") == "cancelled", "cancelled")
        self.assertEqual(d.json("GET", f"/v1/jobs/{long_id}")[2]["state"], "cancelled")

        # the nodes page
        b.find_element(By.CSS_SELECTOR, "#nav a[data-page=nodes]").click()
        self.until(lambda: b.find_elements(By.CSS_SELECTOR, "#nodes-body tr"), "the nodes")

    def test_d_metric_values_a_job_chose(self):
        """A job prints what it likes: a loss that is a string, null, a list or an object is
        not plotted, and the numbers around it are."""
        b, d = self.b, self.d
        lines = [{"event": "train", "step": 1, "loss": "abc", "lr": "x"},
                 {"event": "train", "step": 2, "loss": 0.5, "lr": 0.1},
                 {"event": "train", "step": 3, "loss": None},
                 {"event": "train", "step": 4, "loss": [1], "samples_per_s": {"a": 1}},
                 {"event": "eval", "step": 4, "val_loss": "y", "val_acc": [0.5]},
                 {"event": "train", "step": 5, "loss": 0.25}]
        code = "".join(f"print({json.dumps(json.dumps(x))}, flush=True)\n" for x in lines)
        jid = d.json("POST", "/v1/jobs", {"name": "odd-metrics",
                                          "command": ["/usr/bin/python3", "-c", code]})[2]["id"]
        b.get(f"{self.url}#/job/{jid}")
        self.sign_in(d.token)
        self.until(lambda: self.text("job-state") == "succeeded", "the job's end")
        self.until(lambda: self.points() == 2, "the two numeric losses plotted")
        self.assertEqual(self.points("chart-lr"), 1)
        self.assertEqual(self.text("latest-step"), "5")
        b.save_screenshot(os.path.join(ARTIFACTS, "dashboard-odd-metrics.png"))

    def test_e_unmodified_scripts_metrics(self):
        """What a script reports without printing JSON lines: its SummaryWriter tags and the
        groups of a metrics pattern each get a chart; a single evaluation is a drawn point; the
        legend's names keep their colours under the page's CSP (by class); a finished job's
        Cancel button looks disabled; the page has an icon (no /favicon.ico 404)."""
        b, d = self.b, self.d
        code = ("try:\n"
                "    from torch.utils.tensorboard import SummaryWriter\n"
                "except ImportError:  # Debian 12 has no tensorboard package\n"
                "    from summary_writer import SummaryWriter\n"
                "w = SummaryWriter()\n"
                "for s in range(5):\n"
                "    w.add_scalar('Loss/train', 1.0 / (s + 1), s)\n"
                "w.close()\n"
                "for e in range(1, 4):\n"
                "    print(f'Epoch {e} accuracy {0.5 + e / 10:.2f}', flush=True)\n"
                "print('[eval] val_loss 0.75', flush=True)\n")
        spec = {"name": "unmodified", "command": ["/usr/bin/python3", "-c", code],
                "env": {"PYTHONPATH": HERE},
                "metrics": {"patterns": [r"Epoch (?<epoch>\d+) accuracy (?<accuracy>[\d.]+)",
                                         {"regex": r"^\[eval\] val_loss (?<val_loss>[\d.]+)",
                                          "event": "eval"}]}}
        jid = d.json("POST", "/v1/jobs", spec)[2]["id"]
        b.get(f"{self.url}#/job/{jid}")
        self.sign_in(d.token)
        self.until(lambda: self.text("job-state") == "succeeded", "the job's end")

        def chart_of(metric):
            for box in b.find_elements(By.CSS_SELECTOR, "[data-metric]"):
                if box.get_attribute("data-metric") == metric:
                    return box
            return None
        self.until(lambda: chart_of("Loss/train") is not None
                   and int(chart_of("Loss/train").get_attribute("data-points")) == 5,
                   "a chart of the SummaryWriter's tag with its 5 points")
        self.until(lambda: chart_of("accuracy") is not None
                   and int(chart_of("accuracy").get_attribute("data-points")) == 3,
                   "a chart of the pattern's group")
        self.assertIsNone(chart_of("epoch"), "an epoch count is not a metric to chart")
        self.until(lambda: self.points() == 1, "the one val_loss point")
        legend = b.find_element(By.CSS_SELECTOR, "#chart-loss .dygraph-legend span.s1")
        self.assertEqual(legend.text, "val_loss")
        self.assertEqual(legend.value_of_css_property("color"), "rgba(194, 65, 12, 1)",
                         "the legend's colour is the series' own")
        cancel = b.find_element(By.ID, "cancel")
        self.assertFalse(cancel.is_enabled())
        self.assertEqual(cancel.value_of_css_property("opacity"), "0.45")
        icon = b.find_element(By.CSS_SELECTOR, "link[rel=icon]").get_attribute("href")
        self.assertEqual(d.request("GET", "/ui/favicon.svg", token=False)[0], 200, icon)
        b.execute_script("document.getElementById('charts').scrollIntoView()")
        b.save_screenshot(os.path.join(ARTIFACTS, "dashboard-unmodified-script.png"))

    def test_f_keyboard_submit_fields_failed_rank(self):
        """The page by keyboard alone: Tab reaches the navigation with a visible focus ring,
        Enter follows a link; on Submit, the nodes and processes fields set the spec's
        resources, an error names the field once; a failed job's log opens on the failing
        rank, offers a download; Clone brings its spec back to Submit; the Jobs list shows
        each job's duration."""
        b = self.b
        d = self.start_daemon("--slots", "2", "--grace", "2")  # two ranks, one of them failing
        b.get(f"http://127.0.0.1:{d.port}/")
        self.sign_in(d.token)
        self.find("#jobs")
        body = b.find_element(By.TAG_NAME, "body")
        seen = []
        for _ in range(8):
            body.send_keys(Keys.TAB)
            f = b.switch_to.active_element
            seen.append(f.text or f.get_attribute("id"))
            if f.text == "Submit":
                self.assertNotEqual(f.value_of_css_property("outline-style"), "none",
                                    "a visible focus ring")
                f.send_keys(Keys.ENTER)
                break
        self.assertIn("Jobs", seen)
        self.until(lambda: "#/submit" in b.current_url, f"Enter on Submit (focus went {seen})")
        area = self.find("#spec")
        code = '[ "$RANK" = 1 ] && { echo "rank 1 fails" >&2; exit 3; }; echo "rank $RANK ok"'
        spec = {"name": "by-keyboard", "command": ["sh", "-c", code]}
        b.execute_script("arguments[0].value = arguments[1];", area,
                         json.dumps(dict(spec, resources={"nproc": 0})))
        b.find_element(By.ID, "submit").click()
        alert = self.find("#submit-error")
        self.until(lambda: alert.text != "", "the error")
        self.assertEqual(self.find("#error-field").text, "resources.nproc")
        self.assertEqual(alert.text.count("resources.nproc"), 1, alert.text)
        b.execute_script("arguments[0].value = arguments[1];", area, json.dumps(spec))
        b.find_element(By.ID, "spec-procs").send_keys("2")
        b.find_element(By.ID, "submit").click()
        self.until(lambda: self.text("job-state") == "failed", "the job's failure")
        jid = int(b.current_url.rsplit("/", 1)[1])
        self.assertEqual(d.json("GET", f"/v1/jobs/{jid}")[2]["nproc"], 2, "Processes: 2")
        self.until(lambda: b.find_element(By.ID, "log-rank").get_attribute("value") == "1",
                   "the log opens on the failing rank")
        self.until(lambda: "rank 1 fails" in self.text("log"), "rank 1's log")
        link = b.find_element(By.ID, "log-download").get_attribute("href")
        self.assertIn(f"/v1/jobs/{jid}/logs?rank=1", link)
        # Clone: the Submit page with the job's spec, to change and submit again
        b.find_element(By.ID, "clone").click()
        self.until(lambda: "#/submit" in b.current_url, "the Submit page")
        self.assertEqual(json.loads(self.find("#spec").get_attribute("value")),
                         dict(spec, resources={"nproc": 2}))
        self.assertIn(f"A copy of job {jid}", self.text("submit-note"))
        b.find_element(By.CSS_SELECTOR, "#nav a[data-page=jobs]").click()
        row = self.find(f"#jobs-body tr[data-job='{jid}']")
        self.until(lambda: row.find_elements(By.TAG_NAME, "td")[-1].text.endswith(" s"),
                   "a duration")
        b.save_screenshot(os.path.join(ARTIFACTS, "dashboard-jobs-durations.png"))

    def test_g_compare_and_find(self):
        """Two jobs ticked on the Jobs page, compared on one chart (a curve each); the log's
        find box shows only the lines that hold what it is given."""
        b, d = self.b, self.d
        ids = []
        for name, scale in (("first", 1.0), ("second", 2.0)):
            code = ("import json\n"
                    f"for s in range(1, 6): print(json.dumps({{'event': 'train', 'step': s, "
                    f"'loss': {scale} / s}}), flush=True)\n"
                    "print('needle in the log', flush=True)\n")
            jid = d.json("POST", "/v1/jobs", {"name": name,
                                              "command": ["/usr/bin/python3", "-c", code]})[2]["id"]
            ids.append(jid)
            harness.wait_for(lambda: d.json("GET", f"/v1/jobs/{jid}")[2]["state"] ==
                             "succeeded", f"job {jid}", TIMEOUT)
        b.get(self.url)
        self.sign_in(d.token)
        for jid in ids:
            self.find(f"#jobs-body tr[data-job='{jid}'] input.pick").click()
        link = self.find("#compare")
        self.until(lambda: link.is_displayed(), "the Compare link")
        link.click()
        self.until(lambda: self.points("chart-compare") == 5, "5 steps, two jobs")
        self.assertEqual(self.find("#compare-metric").get_attribute("value"), "loss")
        legend = b.find_element(By.CSS_SELECTOR, "#chart-compare .dygraph-legend").text
        self.assertIn(f"{ids[0]} first", legend)
        self.assertIn(f"{ids[1]} second", legend)
        b.save_screenshot(os.path.join(ARTIFACTS, "dashboard-compare.png"))
        b.get(f"{self.url}#/job/{ids[0]}")
        self.until(lambda: "needle" in self.text("log"), "the log")
        self.find("#log-find").send_keys("needle")
        self.until(lambda: self.text("log") == "needle in the log", "only the matching line")

    def test_h_samples(self):
        """A language model's sample events: the latest three under the charts, newest first,
        as text (markup in a sample stays text)."""
        b, d = self.b, self.d
        lines = [{"event": "sample", "step": s, "prompt": "\n",
                  "text": f"ROMEO{s}:\nWhat light <img src=x onerror=alert(1)> breaks?"}
                 for s in (250, 500, 750, 1000)]
        code = "".join(f"print({json.dumps(json.dumps(x))}, flush=True)\n" for x in lines)
        jid = d.json("POST", "/v1/jobs", {"name": "samples",
                                          "command": ["/usr/bin/python3", "-c", code]})[2]["id"]
        b.get(f"{self.url}#/job/{jid}")
        self.sign_in(d.token)
        self.until(lambda: self.text("job-state") == "succeeded", "the job's end")
        self.until(lambda: len(b.find_elements(By.CSS_SELECTOR, "#samples figure")) == 3,
                   "the latest three samples")
        figs = b.find_elements(By.CSS_SELECTOR, "#samples figure")
        self.assertEqual(figs[0].find_element(By.TAG_NAME, "figcaption").text, "step 1000")
        self.assertIn("<img src=x onerror=alert(1)>",
                      figs[0].find_element(By.TAG_NAME, "pre").text, "markup stays text")
        self.assertEqual(b.find_elements(By.CSS_SELECTOR, "#samples img"), [])
        b.execute_script("document.getElementById('samples').scrollIntoView()")
        b.save_screenshot(os.path.join(ARTIFACTS, "dashboard-samples.png"))

    def test_i_experiment_page(self):
        """An experiment's page, live: every trial listed from the start, the chart gaining a
        line a trial as they run, ASHA's paused trials shown as paused, the experiment paused
        and resumed from its buttons, the best trial marked, a scatter for the searched path."""
        b, d = self.b, self.d
        spec = harness.train_spec("lr", epochs=20)  # a second or so a rung: seen paused
        status, _, exp = d.json("POST", "/v1/experiments", {
            "name": "lr-asha", "job": spec, "max_concurrent": 1, "seed": 5,
            "space": {"train.optimizer.lr": {"log_uniform": [0.003, 0.1]}},
            "searcher": {"type": "asha", "metric": "loss", "mode": "min", "max_trials": 4,
                         "max_steps": 480, "reduction_factor": 2, "rungs": 3,
                         "promotion": "rung"}})
        self.assertEqual(status, 201, exp)
        b.get(self.url)
        self.sign_in(d.token)
        self.find("#jobs")
        b.find_element(By.CSS_SELECTOR, "#nav a[data-page=experiments]").click()
        self.find(f"#experiments-body tr[data-experiment='{exp['id']}'] a").click()
        self.find("#exp-state")
        self.until(lambda: "steps 120, 240, 480" in self.text("exp-rungs"), "the rungs' steps")
        rows = lambda: b.find_elements(By.CSS_SELECTOR, "#trials-body tr")  # noqa: E731
        self.until(lambda: len(rows()) == 4, "the four trials listed")
        lines = lambda: int(self.find("#chart-trials").get_attribute("data-lines") or 0)  # noqa: E731
        self.until(lambda: lines() >= 1, "a trial's line")
        self.until(lambda: b.find_elements(By.CSS_SELECTOR, "#trials-body .state.paused"),
                   "a trial paused at its first rung shown as paused")
        self.until(lambda: lines() >= 2, "the chart gaining a line")
        self.find("#exp-pause").click()
        self.until(lambda: self.text("exp-state") == "paused", "the experiment paused")
        self.assertEqual(self.find("#exp-pause").text, "Resume")
        self.find("#exp-pause").click()
        self.until(lambda: self.text("exp-state") in ("running", "succeeded"), "it goes on")
        self.until(lambda: self.text("exp-state") == "succeeded", "the experiment's end")
        self.until(lambda: lines() == 4, "a line a trial")
        self.until(lambda: b.find_elements(By.CSS_SELECTOR, "#trials-body tr.best"),
                   "the best trial marked")
        x = d.json("GET", f"/v1/experiments/{exp['id']}")[2]
        self.assertEqual(sorted(t["rung"] for t in x["trials"]), [0, 0, 1, 2])
        first = b.find_elements(By.CSS_SELECTOR, "#trials-body tr")[0]
        self.assertEqual(first.get_attribute("data-trial"), str(x["best"]["trial"]), "best first")
        self.assertIn("rung 2", first.text)
        scatter = self.find("#scatter-0")
        self.assertEqual(scatter.get_attribute("data-path"), "train.optimizer.lr")
        self.assertEqual(scatter.get_attribute("data-points"), "4")
        b.set_window_size(1366, 1500)
        b.save_screenshot(os.path.join(ARTIFACTS, "dashboard-experiment.png"))

    def test_j_pbt_experiment_page(self):
        """PBT's page: the generations' rule, each trial's generation, and a trial that took
        another's checkpoint saying so."""
        b, d = self.b, self.d
        spec = harness.train_spec("pbt", epochs=2)
        status, _, exp = d.json("POST", "/v1/experiments", {
            "name": "lr-pbt", "job": spec, "max_concurrent": 2, "seed": 5,
            "space": {"train.optimizer.lr": {"log_uniform": [0.003, 0.1]}},
            "searcher": {"type": "pbt", "metric": "loss", "mode": "min", "population": 4,
                         "max_steps": 60, "interval": 20}})
        self.assertEqual(status, 201, exp)
        b.get(self.url)
        self.sign_in(d.token)
        self.find("#jobs")
        b.get(f"{self.url}#/experiment/{exp['id']}")
        self.until(lambda: "every 20 steps to 60" in self.text("exp-generations"),
                   "the generations' rule")
        self.until(lambda: self.text("exp-state") == "succeeded", "the experiment's end")
        rows = lambda: b.find_elements(By.CSS_SELECTOR, "#trials-body tr")  # noqa: E731
        self.until(lambda: len(rows()) == 4 and all("gen 2" in r.text for r in rows()),
                   "every trial in its last generation")
        self.until(lambda: any(" exploit" in r.text for r in rows()),
                   "a trial that took another's checkpoint saying so")
        b.set_window_size(1366, 1200)
        b.save_screenshot(os.path.join(ARTIFACTS, "dashboard-pbt.png"))

    def test_b_session_cookie_and_csrf(self):
        d = self.d
        conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=TIMEOUT)

        def call(method, path, body=None, headers=None):
            conn.request(method, path, body=body, headers=headers or {})
            r = conn.getresponse()
            return r.status, dict((k.lower(), v) for k, v in r.getheaders()), r.read()

        status, hdrs, body = call("GET", "/")
        self.assertEqual(status, 200)
        csp = hdrs["content-security-policy"]
        self.assertIn("script-src 'self'", csp)
        self.assertNotIn("unsafe-inline", csp)
        self.assertIn(b'<script src="/ui/app.js"', body)
        self.assertNotIn(b"<script>", body, "no inline script in the page")
        status, _, _ = call("GET", "/ui/lib/dygraphs/dygraph.min.js")
        self.assertEqual(status, 200, "Debian's dygraphs is served")
        self.assertEqual(call("GET", "/ui/../token")[0], 404)

        status, hdrs, body = call("POST", "/v1/session", json.dumps({"token": d.token}))
        self.assertEqual(status, 200)
        cookie = hdrs["set-cookie"]
        for attr in ("HttpOnly", "SameSite=Strict", "Path=/"):
            self.assertIn(attr, cookie)
        session = cookie.split(";")[0]
        csrf = json.loads(body)["csrf"]
        spec = json.dumps(harness.train_spec("csrf", epochs=1))
        self.assertEqual(call("GET", "/v1/jobs")[0], 401, "no cookie, no token")
        # the cookie alone is worth nothing (browsers send it to every port of the host): reads
        # need the CSRF token too, as a header or, where a browser cannot set one, ?csrf=
        status, _, body = call("GET", "/v1/jobs", headers={"Cookie": session})
        self.assertEqual((status, json.loads(body)["error"]["code"]), (403, "csrf"))
        self.assertEqual(call("GET", "/v1/jobs", headers={"Cookie": session,
                                                          "X-CSRF-Token": csrf})[0], 200)
        self.assertEqual(call("GET", f"/v1/jobs?csrf={csrf}", headers={"Cookie": session})[0], 200)
        status, _, body = call("GET", "/v1/session", headers={"Cookie": session, "X-CSRF-Token": csrf})
        self.assertEqual((status, json.loads(body)), (200, {"signed_in": True}),
                         "the CSRF token is given out at sign-in only")
        status, _, body = call("POST", "/v1/jobs", spec, {"Cookie": session})
        self.assertEqual((status, json.loads(body)["error"]["code"]), (403, "csrf"))
        status, _, _ = call("POST", "/v1/jobs", spec, {"Cookie": session, "X-CSRF-Token": "0" * 64})
        self.assertEqual(status, 403, "a forged CSRF token")
        status, _, _ = call("POST", "/v1/jobs", spec, {"Cookie": session, "X-CSRF-Token": csrf})
        self.assertEqual(status, 201)
        self.assertEqual(call("DELETE", "/v1/session", headers={"Cookie": session})[0], 403)
        self.assertEqual(call("DELETE", "/v1/session",
                              headers={"Cookie": session, "X-CSRF-Token": csrf})[0], 204)
        self.assertEqual(call("GET", "/v1/jobs", headers={"Cookie": session,
                                                          "X-CSRF-Token": csrf})[0], 401,
                         "signed out: the cookie is worth nothing")
        # sign-ins and sign-outs in any order: each session ends exactly when it is signed out
        sessions = []
        for _ in range(3):
            _, hdrs, body = call("POST", "/v1/session", json.dumps({"token": d.token}))
            sessions.append((hdrs["set-cookie"].split(";")[0], json.loads(body)["csrf"]))

        def alive(s):
            return call("GET", "/v1/session", headers={"Cookie": s[0], "X-CSRF-Token": s[1]})[0] == 200
        out = sessions[1]
        self.assertEqual(call("DELETE", "/v1/session",
                              headers={"Cookie": out[0], "X-CSRF-Token": out[1]})[0], 204)
        _, hdrs, body = call("POST", "/v1/session", json.dumps({"token": d.token}))
        sessions.append((hdrs["set-cookie"].split(";")[0], json.loads(body)["csrf"]))
        self.assertEqual([alive(s) for s in sessions], [True, False, True, True])
        self.assertEqual(call("POST", "/v1/session", json.dumps({"token": "x" * 64}))[0], 401)
        conn.close()


class Marionette:
    """Firefox's own remote protocol (Marionette: length-prefixed JSON over TCP), spoken here
    because Debian packages no geckodriver, the bridge selenium would need. Only the four
    commands the test uses."""

    def __init__(self, port):
        deadline = time.monotonic() + TIMEOUT
        while True:
            try:
                self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        self.buf = b""
        self.next_id = 0
        self.read()  # the server's greeting
        self.call("WebDriver:NewSession", {"capabilities": {}})

    def read(self):
        while b":" not in self.buf:
            self.buf += self.sock.recv(65536)
        size, _, rest = self.buf.partition(b":")
        while len(rest) < int(size):
            rest += self.sock.recv(65536)
        self.buf = rest[int(size):]
        return json.loads(rest[:int(size)])

    def call(self, command, params):
        self.next_id += 1
        msg = json.dumps([0, self.next_id, command, params]).encode()
        self.sock.sendall(str(len(msg)).encode() + b":" + msg)
        while True:
            reply = self.read()
            if reply[0] == 1 and reply[1] == self.next_id:
                if reply[2]:
                    raise AssertionError(f"{command}: {reply[2]}")
                return reply[3]

    def script(self, source, *args):
        return self.call("WebDriver:ExecuteScript", {"script": source, "args": list(args)})["value"]


class FirefoxTest(harness.DaemonTest):
    def test_c_firefox(self):
        firefox = shutil.which("firefox-esr") or shutil.which("firefox")
        if not firefox:
            self.skipTest("no firefox-esr (deploy/install-deps.sh installs it)")
        d = self.start_daemon("--slots", "1")
        profile = self.new_state_dir()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with open(os.path.join(profile, "user.js"), "w") as f:
            f.write(f'user_pref("marionette.port", {port});\n')
        proc = subprocess.Popen([firefox, "--headless", "--marionette", "--no-remote",
                                 "--profile", profile, "about:blank"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=dict(os.environ, HOME=profile, MOZ_CRASHREPORTER_DISABLE="1"))
        self.addCleanup(lambda: (proc.kill(), proc.wait()))
        m = Marionette(port)
        jid = d.json("POST", "/v1/jobs", harness.train_spec("firefox", epochs=3))[2]["id"]
        m.call("WebDriver:Navigate", {"url": f"http://127.0.0.1:{d.port}/#/job/{jid}"})

        def until(source, what):
            harness.wait_for(lambda: m.script(source), f"Firefox: {what}", TIMEOUT)
        until("return !!document.getElementById('token')", "the sign-in form")
        m.script("document.getElementById('token').value = arguments[0];"
                 "document.getElementById('signin').click();", d.token)
        until("const s = document.getElementById('job-state');"
              "return s && s.textContent === 'succeeded';", "the job page, to the job's end")
        trains = [x for x in d.json("GET", f"/v1/jobs/{jid}/metrics")[2] if x["event"] == "train"]
        until("const c = document.getElementById('chart-loss');"
              f"return c && c.getAttribute('data-points') === '{len(trains)}';",
              "every train point plotted")
        until("return document.getElementById('log').textContent.includes('[traind]')",
              "rank 0's log")


def main():
    global ARTIFACTS
    harness.TRAIND = os.path.abspath(sys.argv[1])
    harness.SOURCE_DIR = os.path.abspath(sys.argv[2])
    ARTIFACTS = os.environ.get("TRAIND_ARTIFACTS") or tempfile.mkdtemp(prefix="traind-dashboard-")
    os.makedirs(ARTIFACTS, exist_ok=True)
    print(f"[dashboard] screenshots in {ARTIFACTS}", file=sys.stderr)
    only = sys.argv[3:]  # test names to run (none: all)
    suite = unittest.TestSuite(DashboardTest(n) for n in
                               ("test_a_sign_in_submit_charts_logs_cancel",
                                "test_b_session_cookie_and_csrf",
                                "test_d_metric_values_a_job_chose",
                                "test_e_unmodified_scripts_metrics",
                                "test_f_keyboard_submit_fields_failed_rank",
                                "test_g_compare_and_find",
                                "test_h_samples",
                                "test_i_experiment_page",
                                "test_j_pbt_experiment_page") if not only or n in only)
    if not only or "test_c_firefox" in only:
        suite.addTest(FirefoxTest("test_c_firefox"))
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    sys.exit(0 if result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
