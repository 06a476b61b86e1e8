/* traind's dashboard: a page of its own served by the daemon, speaking API v1 with a session
 * cookie (POST /v1/session) and the CSRF token it returns. Pages: Jobs, Job (live charts from the
 * job's Server-Sent Events, drawn with Debian's dygraphs), Submit, Nodes; Experiments and
 * Experiment are experiments.js's. The DOM is built with
 * el() from text nodes only, never from HTML strings, so no job name or log line can inject
 * markup; the Content-Security-Policy forbids inline script besides. */
"use strict";

// the session's CSRF token: every request made with the cookie carries it. Kept in
// sessionStorage, which belongs to this page's origin and port alone (cookies do not)
let csrf = sessionStorage.getItem("traind-csrf") || "";
let left = false; // the page changed: an async step that finds this true stops
let cleanups = []; // what the current page started: timers, streams, fetches

const $main = () => document.getElementById("main");

// A placement node's GPUs, process by process ("0,1 | 2,3"), or "–" without any.
function gpusOf(node) {
  const each = (node.processes || []).map((p) => p.devices).filter((d) => d);
  return each.length ? each.join(" | ") : node.devices || "–";
}

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k === "class") e.className = v;
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function show(...nodes) {
  const m = $main();
  m.replaceChildren(...nodes);
}

class ApiError extends Error {
  constructor(status, body) {
    const e = (body && body.error) || {};
    super(e.message || `HTTP ${status}`);
    this.status = status;
    this.code = e.code;
    this.field = e.field;
  }
}

async function api(method, path, body) {
  const headers = { "X-CSRF-Token": csrf };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const r = await fetch(path, {
    method, headers, credentials: "same-origin",
    body: body === undefined ? undefined : typeof body === "string" ? body : JSON.stringify(body),
  });
  const text = await r.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (_) { data = null; }
  if (r.status === 401 && path !== "/v1/session") { signIn("Your session ended: sign in again."); }
  if (!r.ok) throw new ApiError(r.status, data);
  return data;
}

function stateBadge(state) { return el("span", { class: `state ${state}` }, state); }
function fmt(x, digits = 4) { return typeof x === "number" ? x.toFixed(digits) : "–"; }
function when(iso) { return iso ? iso.replace("T", " ").replace(/\.\d+Z$/, "") : "–"; }
function duration(job) { // started to finished (or now): "2 h 05 min", "3 min 20 s", "12 s"
  if (!job.started_at) return "–";
  const end = job.finished_at ? Date.parse(job.finished_at) : Date.now();
  const s = Math.max(0, Math.round((end - Date.parse(job.started_at)) / 1000));
  if (s >= 3600) return `${Math.floor(s / 3600)} h ${String(Math.floor(s / 60) % 60).padStart(2, "0")} min`;
  if (s >= 60) return `${Math.floor(s / 60)} min ${String(s % 60).padStart(2, "0")} s`;
  return `${s} s`;
}
function bytes(n) {
  if (typeof n !== "number") return "–";
  const u = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1000 && i < 4) { n /= 1000; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${u[i]}`;
}

function leave() {
  left = true;
  for (const f of cleanups) { try { f(); } catch (_) { /* already gone */ } }
  cleanups = [];
}

function every(ms, f) {
  f();
  const t = setInterval(f, ms);
  cleanups.push(() => clearInterval(t));
}

/* ---- sign in / out ------------------------------------------------------------------------- */

function signIn(message) {
  leave();
  csrf = "";
  sessionStorage.removeItem("traind-csrf");
  document.getElementById("nav").hidden = true;
  const input = el("input", { id: "token", type: "password", autocomplete: "current-password",
                              "aria-label": "API token", required: true });
  const error = el("div", { class: "error", role: "alert", hidden: !message }, message || "");
  const form = el("form", { class: "card signin", id: "signin-form", onsubmit: async (ev) => {
    ev.preventDefault();
    try {
      const r = await api("POST", "/v1/session", { token: input.value.trim() });
      csrf = r.csrf;
      sessionStorage.setItem("traind-csrf", csrf);
      if (!location.hash || location.hash === "#/signin") location.hash = "#/jobs";
      route();
    } catch (e) {
      error.hidden = false;
      error.textContent = e.message;
    }
  } },
  el("h1", {}, "Sign in to traind"),
  el("p", { class: "muted" }, "Paste the API token: the daemon wrote it to STATE_DIR/token " +
     "(~/.local/state/traind/token, or /var/lib/traind/token for a system daemon)."),
  el("label", { for: "token" }, "API token"), input, error,
  el("button", { class: "primary", type: "submit", id: "signin" }, "Sign in"));
  show(form);
  input.focus();
}

async function signOut() {
  try { await api("DELETE", "/v1/session"); } catch (_) { /* signed out anyway */ }
  signIn("Signed out.");
}

/* ---- Jobs ------------------------------------------------------------------------------------ */

const STATES = ["queued", "running", "restarting", "paused", "succeeded", "failed", "cancelled"];

function jobsPage() {
  const filter = el("select", { id: "state-filter", "aria-label": "Filter by state" },
    el("option", { value: "" }, "every state"), STATES.map((s) => el("option", { value: s }, s)));
  const body = el("tbody", { id: "jobs-body" });
  const error = el("div", { class: "error", hidden: true, role: "alert" });
  const table = el("table", { id: "jobs" },
    el("thead", {}, el("tr", {}, ["ID", "Name", "State", "Kind", "Processes", "Step", "Loss",
                                  "val_acc", "Submitted", "Duration"].map((h) => el("th", {}, h)))), body);
  const picked = new Set(); // jobs ticked for comparison
  const compare = el("a", { id: "compare", href: "#/jobs", hidden: true }, "Compare");
  function showCompare() {
    compare.hidden = picked.size < 2;
    compare.href = `#/compare/${[...picked].sort((a, b) => a - b).join(",")}`;
    compare.textContent = `Compare ${picked.size} jobs`;
  }
  show(el("h1", {}, "Jobs"), el("div", { class: "toolbar" }, el("label", { for: "state-filter" },
       "Show"), filter, el("a", { href: "#/submit" }, "Submit a job"), compare), error, table);
  async function refresh() {
    try {
      const q = filter.value ? `&state=${filter.value}` : "";
      const r = await api("GET", `/v1/jobs?limit=100${q}`);
      error.hidden = true;
      body.replaceChildren(...r.jobs.map((j) => {
        const t = (j.latest && j.latest.train) || {};
        const e = (j.latest && (j.latest.eval || j.latest.done)) || {}; // (a summary's val_acc alone)
        const pick = el("input", { type: "checkbox", class: "pick", "aria-label": `Compare job ${j.id}`,
                                   checked: picked.has(j.id) });
        pick.addEventListener("change", () => { pick.checked ? picked.add(j.id) : picked.delete(j.id); showCompare(); });
        return el("tr", { "data-job": j.id },
          el("td", {}, pick, " ", el("a", { href: `#/job/${j.id}` }, j.id)),
          el("td", {}, el("a", { href: `#/job/${j.id}` }, j.name)), el("td", {}, stateBadge(j.state)),
          el("td", {}, j.kind), el("td", {}, `${j.nnodes} × ${j.nproc}`),
          el("td", { class: "num" }, t.step ?? "–"), el("td", { class: "num" }, fmt(t.loss)),
          el("td", { class: "num" }, fmt(e.val_acc)), el("td", {}, when(j.created_at)),
          el("td", { class: "num" }, duration(j)));
      }));
      if (!r.jobs.length) body.append(el("tr", {}, el("td", { colspan: 10, class: "muted" }, "No jobs.")));
    } catch (e) {
      if (e.status !== 401) { error.hidden = false; error.textContent = e.message; }
    }
  }
  filter.addEventListener("change", refresh);
  every(2000, refresh); // states change while the page is open
}

/* ---- Job --------------------------------------------------------------------------------------- */

/* The series colours, in app.css too (.legend .s0 ...): the page's CSP refuses the inline styles
 * dygraphs writes into its legend, so the legend names each series by class. */
const COLORS = ["#2457c5", "#c2410c", "#177245", "#7c3aed", "#b42318", "#0e7490"];

function legend(data) { // dygraphs' legendFormatter: classes, no style attributes
  const shown = (data.series || []).map((s, i) => [s, i]).filter(([s]) => s.isVisible);
  const name = ([s, i]) => `<span class="s${i % COLORS.length}">${s.labelHTML}</span>`;
  if (data.x === undefined) return shown.map(name).join("&nbsp; "); // nothing hovered: the names
  const values = shown.filter(([s]) => s.yHTML !== undefined).map((p) => `${name(p)}: ${p[0].yHTML}`);
  return [`step ${data.xHTML}`, ...values].join("&nbsp; ");
}

/* What is no metric to compare. */
const NOT_CHARTED = new Set(["step", "epoch", "epochs", "total_steps", "world", "time", "wall_time"]);

/* Fields of a train or eval line that have charts of their own, or are not metrics to chart. */
const NOT_EXTRA = new Set(["event", "step", "epoch", "epochs", "total_steps", "loss", "lr",
  "samples_per_s", "step_ms", "val_loss", "val_acc", "world", "time", "wall_time", "ranks"]);

function chart(id, title, labels, ylabel) {
  const box = el("div", { class: "chart", id, "data-points": "0" },
    el("p", { class: "muted" }, "No points yet.")); // (the chart replaces it)
  const card = el("div", { class: "card" }, el("div", { class: "chart-title" }, title), box);
  return { card, box, labels, ylabel, data: [], graph: null };
}

function jobPage(id) {
  const head = el("div", { class: "toolbar" });
  const facts = el("dl", { class: "facts", id: "facts" });
  const placement = el("div", { id: "placement" });
  const attempts = el("div", { id: "attempts" });
  const charts = {
    loss: chart("chart-loss", "Loss", ["step", "loss", "val_loss"]),
    acc: chart("chart-acc", "Validation accuracy", ["step", "val_acc"]),
    lr: chart("chart-lr", "Learning rate", ["step", "lr"]),
    sps: chart("chart-sps", "Samples per second", ["step", "samples/s"]),
  };
  const restarts = []; // steps at which the job restarted: marked on every chart
  const chartsBox = el("div", { class: "charts", id: "charts" });
  let nExtra = 0;
  function extras(d) { // any other number the job reports gets a chart of its own, made on sight
    for (const [k, v] of Object.entries(d)) {
      if (NOT_EXTRA.has(k) || typeof v !== "number" || typeof d.step !== "number") continue;
      if (!charts["x:" + k]) {
        if (nExtra >= 24) continue; // a page of charts at most
        const c = chart(`chart-extra-${nExtra++}`, k, ["step", k]);
        c.box.setAttribute("data-metric", k);
        charts["x:" + k] = c;
        chartsBox.append(c.card);
      }
      charts["x:" + k].data.push([d.step, v]);
    }
  }
  // a language model's samples (sample events): the latest three, newest first, as text
  const samplesHead = el("h2", { hidden: true }, "Samples");
  const samples = el("div", { id: "samples", hidden: true });
  const sampleList = [];
  function addSample(d) {
    sampleList.unshift(el("figure", { class: "sample" },
      el("figcaption", {}, `step ${d.step}`), el("pre", {}, d.text)));
    sampleList.length = Math.min(sampleList.length, 3);
    samples.replaceChildren(...sampleList);
    samples.hidden = samplesHead.hidden = false;
  }
  const ckpts = el("tbody", { id: "checkpoints" });
  const rank = el("select", { id: "log-rank", "aria-label": "Rank" });
  const follow = el("input", { type: "checkbox", id: "log-follow", checked: true });
  const log = el("pre", { class: "log", id: "log", tabindex: "0", "aria-label": "Log" });
  const logUrl = () => `/v1/jobs/${id}/logs?rank=${rank.value || 0}&csrf=${csrf}`;
  const saveLog = el("a", { id: "log-download", href: "#", download: `job-${id}-rank.log` }, "Download");
  const find = el("input", { type: "search", id: "log-find", placeholder: "find in the log", "aria-label": "Find in the log" });
  let logAll = ""; // the log as received; shown whole, or only its lines with what find holds
  function showLog() {
    const q = find.value;
    const atEnd = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
    log.textContent = q ? logAll.split("\n").filter((l) => l.includes(q)).join("\n") : logAll;
    if (atEnd || q) log.scrollTop = log.scrollHeight;
  }
  find.addEventListener("input", showLog);
  const error = el("div", { class: "error", hidden: true, role: "alert", id: "job-error" });
  show(el("div", { class: "toolbar" }, el("a", { href: "#/jobs" }, "← Jobs")), head, error,
    el("div", { class: "grid2" }, el("div", { class: "card" }, facts, attempts), placement),
    el("h2", {}, "Metrics"), chartsBox, samplesHead, samples,
    el("h2", {}, "Log"), el("div", { class: "toolbar" }, el("label", { for: "log-rank" }, "Rank"),
       rank, el("label", {}, follow, " follow"), find, saveLog), log,
    el("h2", {}, "Checkpoints"),
    el("div", { class: "scroll" }, el("table", {}, el("thead", {}, el("tr", {},
       ["Step", "Size", "Written", "Files"].map((h) => el("th", {}, h)))), ckpts)));

  chartsBox.append(...Object.values(charts).map((c) => c.card));
  let job = null, lastStep = 0, pending = false, loading = false, again = false, failedShown = false;
  let ckptTimer = null;
  cleanups.push(() => clearTimeout(ckptTimer));
  function draw() {
    pending = false;
    for (const c of Object.values(charts)) {
      if (!c.data.length || typeof Dygraph === "undefined") continue;
      const opts = { file: c.data, labels: c.labels, connectSeparatedPoints: true, legend: "always",
        colors: COLORS, legendFormatter: legend,
        drawPoints: c.data.length < 50, pointSize: 2.5, // one evaluation is a point, not nothing
        // one step only (a single evaluation): a window around it, not a point on the axis
        dateWindow: c.data.every((r) => r[0] === c.data[0][0]) ? [c.data[0][0] - 1, c.data[0][0] + 1] : null,
        axes: { y: { axisLabelFormatter: (v) => +v.toPrecision(6) } }, // no "0.05 0.05 0.05"
        underlayCallback: (ctx, area, g) => { // a dashed line where each restart happened
          ctx.save(); ctx.strokeStyle = "#b42318"; ctx.setLineDash([4, 3]);
          for (const s of restarts) {
            const x = g.toDomXCoord(s);
            ctx.beginPath(); ctx.moveTo(x, area.y); ctx.lineTo(x, area.y + area.h); ctx.stroke();
          }
          ctx.restore();
        } };
      if (!c.graph) c.graph = new Dygraph(c.box, c.data, opts);
      else c.graph.updateOptions(opts);
      c.box.setAttribute("data-points", String(c.data.length));
    }
  }
  function later() { if (!pending) { pending = true; requestAnimationFrame(draw); } }

  function onEvent(name, d) {
    if (typeof d.step === "number") lastStep = d.step;
    if (name === "train" || name === "eval") extras(d); // a SummaryWriter's tags, a pattern's groups
    if (name === "train") { // (a job prints what it likes: only numbers are plotted)
      const latest = document.getElementById("latest-step");
      if (latest) latest.textContent = d.step;
      if (typeof d.loss === "number") charts.loss.data.push([d.step, d.loss, null]);
      if (typeof d.lr === "number") charts.lr.data.push([d.step, d.lr]);
      if (typeof d.samples_per_s === "number") charts.sps.data.push([d.step, d.samples_per_s]);
    } else if (name === "eval") {
      if (typeof d.val_loss === "number") charts.loss.data.push([d.step, null, d.val_loss]);
      if (typeof d.val_acc === "number") charts.acc.data.push([d.step, d.val_acc]);
    } else if (name === "sample" && typeof d.text === "string") {
      addSample(d);
    } else if (name === "restart") {
      restarts.push(d.resume_from && typeof d.resume_from.step === "number" ? d.resume_from.step : lastStep);
    } else if (name === "checkpoint") { // (a replay brings many at once: one reload for them)
      clearTimeout(ckptTimer);
      ckptTimer = setTimeout(loadCheckpoints, 300);
    }
    if (name === "state" || name === "restart" || name === "placement") loadJob();
    later();
  }

  const cancel = el("button", { class: "danger", id: "cancel", type: "button", disabled: true,
    onclick: async () => {
      if (!confirm(`Cancel job ${id} (${job.name})? Its processes are stopped on every node.`)) return;
      try { await api("POST", `/v1/jobs/${id}/cancel`); loadJob(); }
      catch (e) { error.hidden = false; error.textContent = e.message; }
    } }, "Cancel job");

  const clone = el("button", { id: "clone", type: "button", onclick: async () => {
    try { // its spec, to change and submit again (the Submit page picks it up)
      const spec = await api("GET", `/v1/jobs/${id}/spec`);
      sessionStorage.setItem("traind-clone", JSON.stringify({ from: id, spec }));
      location.hash = "#/submit";
    } catch (e) { error.hidden = false; error.textContent = e.message; }
  } }, "Clone");

  async function loadJob() { // one at a time, the latest wins: replays bring many events
    if (loading) { again = true; return; }
    loading = true;
    try {
      job = await api("GET", `/v1/jobs/${id}`);
    } catch (e) {
      if (e.status !== 401) { error.hidden = false; error.textContent = e.message; }
      return;
    } finally {
      loading = false;
      if (again && !left) { again = false; setTimeout(loadJob, 0); }
    }
    if (left) return;
    const final = ["succeeded", "failed", "cancelled"].includes(job.state);
    cancel.disabled = final; // the same button throughout: a click never lands on a replaced one
    head.replaceChildren(el("h1", {}, `Job ${job.id}: ${job.name}`), stateBadge(job.state), cancel, clone);
    head.querySelector(".state").id = "job-state";
    const t = (job.latest && job.latest.train) || {};
    facts.replaceChildren(
      el("dt", {}, "Kind"), el("dd", {}, job.kind),
      el("dt", {}, "Processes"), el("dd", {}, `${job.nnodes} node(s) × ${job.nproc}`),
      el("dt", {}, "Submitted"), el("dd", {}, when(job.created_at)),
      el("dt", {}, "Started"), el("dd", {}, when(job.started_at)),
      el("dt", {}, "Finished"), el("dd", {}, when(job.finished_at)),
      el("dt", {}, "Latest step"), el("dd", { id: "latest-step" }, t.step ?? "–"),
      el("dt", {}, "Restarts"), el("dd", {}, `${job.restarts} of ${job.max_restarts}`),
      el("dt", {}, "Reason"), el("dd", { id: "job-reason" }, job.reason || "–"));
    attempts.replaceChildren(el("h2", {}, "Attempts"), el("ol", { start: 0 }, job.attempts.map((a) =>
      el("li", {}, `${when(a.started_at)} → ${when(a.finished_at)}`, a.reason ? `: ${a.reason}` : ""))));
    const p = job.placement;
    placement.replaceChildren(el("div", { class: "card" }, el("h2", {}, "Placement"),
      p ? el("table", {}, el("thead", {}, el("tr", {}, ["Node", "Node rank", "Ranks", "GPUs", "State"]
            .map((h) => el("th", {}, h)))),
          el("tbody", {}, p.nodes.map((n) => el("tr", {}, el("td", {}, n.node),
            el("td", {}, n.node_rank), el("td", {}, n.ranks.join(", ")), el("td", {}, gpusOf(n)),
            el("td", {}, n.state || "–")))))
        : el("p", { class: "muted" }, "No placement recorded."),
      p ? el("p", { class: "muted" }, `Rendezvous at ${p.master_addr}:${p.master_port}`) : null));
    // a job that starts one process a node (launch "self") has one log a node, under its first rank
    const step = job.launch === "self" ? job.nproc : 1;
    const logged = Array.from({ length: job.nnodes * job.nproc / step }, (_, i) => i * step);
    if (rank.options.length !== logged.length) {
      rank.replaceChildren(...logged.map((r) => el("option", { value: r }, step > 1 ? `node ${r / step} (ranks ${r}–${r + step - 1})` : `rank ${r}`)));
      if (!logStarted) startLog();
    }
    // a failed job's log shows the rank that failed, once: its reason names it ("rank 3 (...")
    const failed = job.state === "failed" && !failedShown && /\brank (\d+) \(/.exec(job.reason || "");
    if (failed && logged.includes(+failed[1] - (+failed[1] % step))) {
      failedShown = true;
      rank.value = String(+failed[1] - (+failed[1] % step));
      startLog();
    }
    if (final) loadCheckpoints();
  }

  async function loadCheckpoints() {
    try {
      const list = await api("GET", `/v1/jobs/${id}/checkpoints`);
      ckpts.replaceChildren(...list.slice().reverse().map((c) => el("tr", {},
        el("td", { class: "num" }, c.step), el("td", { class: "num" }, bytes(c.size)),
        el("td", {}, when(c.created_at)),
        el("td", { class: "wrap" }, c.files.length ? c.files.map((f) => [el("a", { href: `${f.url}?csrf=${csrf}`, download: "" }, f.name), " "])
                                    : el("span", { class: "muted" }, "removed (checkpoint.keep)")))));
      if (!list.length) ckpts.append(el("tr", {}, el("td", { colspan: 4, class: "muted" }, "None yet.")));
    } catch (_) { /* shown by the job's own error */ }
  }

  let logStarted = false, logAbort = null;
  async function startLog() {
    if (left) return; // (loadJob may resolve after the page changed)
    logStarted = true;
    if (logAbort) logAbort.abort();
    const abort = new AbortController();
    logAbort = abort;
    log.textContent = "";
    logAll = "";
    const q = `rank=${rank.value || 0}${follow.checked ? "&follow=1" : ""}`;
    saveLog.href = logUrl();
    try {
      const r = await fetch(`/v1/jobs/${id}/logs?${q}`, { credentials: "same-origin", signal: abort.signal,
                                                        headers: { "X-CSRF-Token": csrf } });
      if (!r.ok) { log.textContent = `(${r.status}) ${await r.text()}`; return; }
      const reader = r.body.getReader(), dec = new TextDecoder();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        const chunk = dec.decode(value, { stream: true });
        logAll += chunk;
        if (logAll.length > 4e6) { logAll = logAll.slice(-3e6); showLog(); } // the last 3 MB: Download has all
        else if (find.value) showLog();
        else { // (as it comes, without redrawing what is there)
          const atEnd = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
          log.append(chunk);
          if (atEnd) log.scrollTop = log.scrollHeight;
        }
      }
    } catch (_) { /* aborted: another rank was chosen, or the page left */ }
  }
  rank.addEventListener("change", startLog);
  rank.addEventListener("change", () => { saveLog.href = logUrl(); });
  follow.addEventListener("change", startLog);
  cleanups.push(() => { if (logAbort) logAbort.abort(); });

  // the event stream replays the job from its start, then follows it; EventSource reconnects
  // with Last-Event-ID by itself
  const es = new EventSource(`/v1/jobs/${id}/events?csrf=${csrf}`, { withCredentials: true });
  // EventSource gives up for good on an error reply (the daemon restarted: the session is gone)
  es.onerror = async () => {
    if (es.readyState !== EventSource.CLOSED || left) return;
    try { await api("GET", "/v1/session"); error.hidden = false;
          error.textContent = "The job's event stream ended; reload the page to follow it again."; }
    catch (_) { /* api() has shown the sign-in page */ }
  };
  for (const name of ["train", "eval", "sample", "checkpoint", "restart", "state", "placement", "done"])
    es.addEventListener(name, (ev) => {
      let d = {};
      try { d = JSON.parse(ev.data); } catch (_) { /* a command's odd line */ }
      onEvent(name, d);
      if (name === "state" && ["succeeded", "failed", "cancelled"].includes(d.state)) es.close();
    });
  cleanups.push(() => es.close());
  // what no event announces (a node's part going from starting to running, its GPUs, the
  // disk it uses): the job again every 5 s while it is not over
  every(5000, () => {
    if (!job || !["succeeded", "failed", "cancelled"].includes(job.state)) loadJob();
  });
  loadCheckpoints();
}

/* ---- Submit ------------------------------------------------------------------------------------ */

const EXAMPLES = ["fmnist-lenet"];

function submitPage() {
  const text = el("textarea", { class: "spec", id: "spec", spellcheck: "false", "aria-label": "Job spec (JSON)" });
  const error = el("div", { class: "error", hidden: true, role: "alert", id: "submit-error" });
  const file = el("input", { type: "file", accept: ".json,application/json", id: "spec-file" });
  const example = el("select", { id: "example", "aria-label": "Start from an example" },
    el("option", { value: "" }, "start from an example…"), EXAMPLES.map((n) => el("option", { value: n }, n)));
  file.addEventListener("change", () => {
    const f = file.files[0];
    if (f) f.text().then((t) => { text.value = t; });
  });
  example.addEventListener("change", async () => {
    if (!example.value) return;
    const r = await fetch(`/ui/examples/${example.value}.json`);
    text.value = await r.text();
  });
  const go = el("button", { class: "primary", type: "submit", id: "submit" }, "Submit");
  const nodes = el("input", { type: "number", min: "1", max: "4096", id: "spec-nodes", placeholder: "as the spec", class: "count" });
  const procs = el("input", { type: "number", min: "1", max: "4096", id: "spec-procs", placeholder: "as the spec", class: "count" });
  const form = el("form", { onsubmit: async (ev) => {
    ev.preventDefault();
    error.hidden = true;
    let body;
    try { body = JSON.parse(text.value); } catch (e) {
      error.hidden = false;
      error.replaceChildren("The spec is not JSON: ", e.message);
      return;
    }
    if (body && typeof body === "object" && (nodes.value || procs.value)) { // as trainctl's --nnodes/--nproc
      const r = body.resources = body.resources && typeof body.resources === "object" ? body.resources : {};
      const across = +nodes.value > 1 || r.nnodes > 1 || "nproc_per_node" in r;
      if (nodes.value) r.nnodes = +nodes.value;
      if (procs.value) {
        delete r.nproc; delete r.nproc_per_node;
        r[across ? "nproc_per_node" : "nproc"] = +procs.value;
      } else if (across && "nproc" in r) { r.nproc_per_node = r.nproc; delete r.nproc; }
    }
    try {
      const job = await api("POST", "/v1/jobs", body);
      location.hash = `#/job/${job.id}`;
    } catch (e) {
      error.hidden = false;
      // the field at fault, by its JSON path, then what is wrong with it
      // (the daemon's message starts with the path itself: said once)
      const msg = e.field && e.message.startsWith(`${e.field}: `) ? e.message.slice(e.field.length + 2) : e.message;
      error.replaceChildren(...(e.field ? ["At ", el("code", { id: "error-field" }, e.field), ": "] : []), msg);
    }
  } }, el("div", { class: "toolbar" }, example, el("label", { for: "spec-file" }, "or upload"), file),
  text, error, el("div", { class: "toolbar" }, el("label", { for: "spec-nodes" }, "Nodes"), nodes,
    el("label", { for: "spec-procs" }, "Processes per node"), procs, go));
  const cloned = JSON.parse(sessionStorage.getItem("traind-clone") || "null");
  sessionStorage.removeItem("traind-clone");
  if (cloned) text.value = JSON.stringify(cloned.spec, null, 2);
  show(el("h1", {}, "Submit a job"),
    el("p", { class: "muted", id: "submit-note" }, cloned
      ? `A copy of job ${cloned.from}: change what you like and submit it.`
      : "A job spec as traind-worker takes it, or a command job; see api/README.md."), form);
}

/* ---- Compare: several jobs' curves on one chart ------------------------------------------------ */

function comparePage(ids) {
  const which = el("select", { id: "compare-metric", "aria-label": "Metric" });
  const box = el("div", { class: "chart", id: "chart-compare", "data-points": "0" });
  const error = el("div", { class: "error", hidden: true, role: "alert" });
  show(el("div", { class: "toolbar" }, el("a", { href: "#/jobs" }, "← Jobs")),
    el("h1", {}, `Jobs ${ids.join(", ")}`), error,
    el("div", { class: "toolbar" }, el("label", { for: "compare-metric" }, "Metric"), which),
    el("div", { class: "card" }, box));
  let series = []; // per job: {name, points: {metric: [[step, value]]}}
  function draw() {
    const metric = which.value, steps = new Map();
    series.forEach((s, i) => (s.points[metric] || []).forEach(([x, y]) => {
      if (!steps.has(x)) steps.set(x, new Array(series.length).fill(null));
      steps.get(x)[i] = y;
    }));
    const data = [...steps.entries()].sort((a, b) => a[0] - b[0]).map(([x, ys]) => [x, ...ys]);
    box.setAttribute("data-points", String(data.length));
    if (!data.length || typeof Dygraph === "undefined") { box.textContent = "No points."; return; }
    box.textContent = "";
    new Dygraph(box, data, { labels: ["step", ...series.map((s) => s.name)], colors: COLORS,
      connectSeparatedPoints: true, legend: "always", legendFormatter: legend,
      drawPoints: data.length < 50, axes: { y: { axisLabelFormatter: (v) => +v.toPrecision(6) } } });
  }
  (async () => {
    try {
      series = await Promise.all(ids.map(async (id) => {
        const [job, metrics] = await Promise.all([api("GET", `/v1/jobs/${id}`), api("GET", `/v1/jobs/${id}/metrics`)]);
        const points = {};
        for (const m of metrics) for (const [k, v] of Object.entries(m))
          if (typeof v === "number" && typeof m.step === "number" && !NOT_CHARTED.has(k))
            (points[k] = points[k] || []).push([m.step, v]);
        return { name: `${job.id} ${job.name}`, points };
      }));
    } catch (e) { error.hidden = false; error.textContent = e.message; return; }
    const names = [...new Set(series.flatMap((s) => Object.keys(s.points)))].sort();
    which.replaceChildren(...names.map((n) => el("option", { value: n }, n)));
    if (names.includes("loss")) which.value = "loss";
    draw();
  })();
  which.addEventListener("change", draw);
}

/* ---- Nodes ------------------------------------------------------------------------------------- */

function nodesPage() {
  const body = el("tbody", { id: "nodes-body" });
  show(el("h1", {}, "Nodes"), el("table", { id: "nodes" }, el("thead", {}, el("tr", {},
    ["Name", "Role", "State", "Address", "Slots used", "GPUs", "Version", "Heartbeat"].map((h) => el("th", {}, h)))), body));
  every(2000, async () => {
    try {
      const r = await api("GET", "/v1/nodes");
      body.replaceChildren(...r.nodes.map((n) => el("tr", {}, el("td", {}, n.name), el("td", {}, n.role),
        el("td", {}, stateBadge(n.state)), el("td", {}, n.address), el("td", {}, `${n.slots.used} / ${n.slots.total}`),
        el("td", {}, n.gpus.length ? n.gpus.map((g) => `${g.index}${g.name ? " " + g.name : ""}` +
          (g.memory_bytes ? ` (${(g.memory_bytes / 2 ** 30).toFixed(0)} GiB)` : "")).join("; ") : "–"),
        el("td", {}, n.version), el("td", {}, `${n.seconds_since_heartbeat.toFixed(1)} s ago`))));
    } catch (_) { /* signed out, or the daemon is away: the next turn tries again */ }
  });
}

/* ---- routing ----------------------------------------------------------------------------------- */

function route() {
  if (!csrf) return signIn();
  leave();
  left = false;
  document.getElementById("nav").hidden = false;
  const hash = location.hash || "#/jobs";
  const m = hash.match(/^#\/job\/(\d+)$/);
  const cmp = hash.match(/^#\/compare\/([\d,]+)$/);
  const exp = hash.match(/^#\/experiment\/(\d+)$/);
  const page = m || cmp ? "jobs" : exp ? "experiments" : hash.slice(2);
  for (const a of document.querySelectorAll("#nav a"))
    a.toggleAttribute("aria-current", a.dataset.page === page) && a.setAttribute("aria-current", "page");
  if (m) jobPage(Number(m[1]));
  else if (cmp) comparePage(cmp[1].split(",").map(Number).slice(0, 8));
  else if (hash === "#/submit") submitPage();
  else if (hash === "#/nodes") nodesPage();
  else if (exp) experimentPage(Number(exp[1])); // (experiments.js)
  else if (hash === "#/experiments") experimentsPage();
  else jobsPage();
  $main().focus({ preventScroll: true });
}

window.addEventListener("hashchange", route);
document.getElementById("signout").addEventListener("click", signOut);
(async () => {
  if (!csrf) return signIn(); // a new tab: sign in (the token is not kept anywhere)
  try {
    await api("GET", "/v1/session");
    route();
  } catch (_) {
    signIn();
  }
})();
