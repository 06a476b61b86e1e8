/* traind's dashboard, the experiments' pages (app.js has the rest, and the helpers used here:
 * el, api, show, stateBadge, when, every, cleanups, left, csrf, COLORS, legend). Experiments
 * lists them; Experiment shows one live from its Server-Sent Events: its trials as a table
 * (sortable, filtered by state), every trial's metric on one chart (the best drawn thick), and
 * for each searched path the trials' best metric against that path's value. A trial's points
 * come from its job's metrics (GET /v1/jobs/ID/metrics?since=STEP), fetched again while it
 * runs. */
"use strict";

const EXP_STATES = ["running", "paused", "succeeded", "failed", "cancelled"];
const TRIAL_STATES = ["pending", "submitting", "queued", "running", "restarting", "paused",
  "succeeded", "failed", "cancelled"];

function bestText(b) { return b ? `${(+b.value).toPrecision(5)} (trial ${b.trial})` : "–"; }
function valueText(v) { return typeof v === "number" ? +v.toPrecision(6) : JSON.stringify(v); }
function hparamsText(h) {
  return Object.entries(h || {}).map(([k, v]) => `${k}=${valueText(v)}`).join("  ");
}

function experimentsPage() {
  const body = el("tbody", { id: "experiments-body" });
  const error = el("div", { class: "error", hidden: true, role: "alert" });
  show(el("h1", {}, "Experiments"), error, el("table", { id: "experiments" },
    el("thead", {}, el("tr", {}, ["ID", "Name", "State", "Search", "Trials", "Running", "Metric",
      "Best", "Created"].map((h) => el("th", {}, h)))), body));
  every(2000, async () => {
    try {
      const r = await api("GET", "/v1/experiments");
      error.hidden = true;
      body.replaceChildren(...r.experiments.map((x) => {
        const c = x.counts, done = c.succeeded + c.failed + c.cancelled;
        return el("tr", { "data-experiment": x.id },
          el("td", {}, el("a", { href: `#/experiment/${x.id}` }, x.id)),
          el("td", {}, el("a", { href: `#/experiment/${x.id}` }, x.name)),
          el("td", {}, stateBadge(x.state)), el("td", {}, x.searcher.type),
          el("td", { class: "num" }, `${done} / ${x.trials_total}`),
          el("td", { class: "num" }, c.running), el("td", {}, `${x.searcher.mode} ${x.searcher.metric}`),
          el("td", {}, bestText(x.best)), el("td", {}, when(x.created_at)));
      }));
      if (!r.experiments.length)
        body.append(el("tr", {}, el("td", { colspan: 9, class: "muted" }, "No experiments: " +
          "POST /v1/experiments, or trainctl exp create FILE.")));
    } catch (e) {
      if (e.status !== 401) { error.hidden = false; error.textContent = e.message; }
    }
  });
}

/* The trials table, sorted by a column (the best metric first by default) and filtered. */
function trialsTable(x, sortBy, filter) {
  const sign = x.searcher.mode === "max" ? -1 : 1;
  const key = {
    trial: (t) => t.trial, state: (t) => TRIAL_STATES.indexOf(t.state), steps: (t) => t.steps,
    latest: (t) => (t.latest ? sign * t.latest.value : Infinity),
    best: (t) => (t.best ? sign * t.best.value : Infinity),
  }[sortBy] || ((t) => t.trial);
  const rows = x.trials.filter((t) => !filter || t.state === filter)
    .sort((a, b) => key(a) - key(b) || a.trial - b.trial);
  const bestTrial = x.best ? x.best.trial : -1;
  return rows.map((t) => el("tr", { "data-trial": t.trial, class: t.trial === bestTrial ? "best" : null },
    el("td", { class: "num" }, t.trial),
    el("td", {}, t.job ? el("a", { href: `#/job/${t.job}` }, t.job) : "–"),
    el("td", {}, stateBadge(t.state)),
    el("td", { class: "num" }, stepsText(t)),
    el("td", { class: "num" }, t.latest ? (+t.latest.value).toPrecision(5) : "–"),
    el("td", { class: "num" }, t.best ? (+t.best.value).toPrecision(5) : "–"),
    el("td", { class: "wrap" }, hparamsText(t.hparams)),
    el("td", { class: "wrap muted" }, t.reason || "")));
}

// a trial's steps, with ASHA's rung or PBT's generation (and how often it took another's checkpoint)
function stepsText(t) {
  if (t.rung !== undefined) return `${t.steps} · rung ${t.rung}`;
  if (t.generation === undefined) return `${t.steps}`;
  const exploits = t.exploits ? ` · ${t.exploits} exploit${t.exploits > 1 ? "s" : ""}` : "";
  return `${t.steps} · gen ${t.generation}${exploits}`;
}

function experimentPage(id) {
  const head = el("div", { class: "toolbar" });
  const facts = el("dl", { class: "facts", id: "exp-facts" });
  const error = el("div", { class: "error", hidden: true, role: "alert" });
  const filter = el("select", { id: "trial-filter", "aria-label": "Show trials in state" },
    el("option", { value: "" }, "every state"), TRIAL_STATES.map((s) => el("option", { value: s }, s)));
  const body = el("tbody", { id: "trials-body" });
  let sortBy = "best";
  const heads = [["trial", "Trial"], ["", "Job"], ["state", "State"], ["steps", "Steps"],
    ["latest", "Latest"], ["best", "Best"], ["", "Hyperparameters"], ["", "Reason"]]
    .map(([k, label]) => el("th", {}, k ? el("button", { class: "link sort", type: "button",
      "data-sort": k, title: `Sort by ${label.toLowerCase()}`,
      onclick: () => { sortBy = k; redraw(); } }, label) : label));
  const progress = el("div", { class: "chart", id: "chart-trials", "data-lines": "0" },
    el("p", { class: "muted" }, "No points yet."));
  const scatters = el("div", { class: "charts", id: "scatters" });
  const cancel = el("button", { class: "danger", id: "exp-cancel", type: "button", disabled: true,
    onclick: async () => {
      if (!confirm(`Cancel experiment ${id}? Its unfinished trials are stopped.`)) return;
      try { await api("POST", `/v1/experiments/${id}/cancel`); load(); }
      catch (e) { error.hidden = false; error.textContent = e.message; }
    } }, "Cancel experiment");
  const pause = el("button", { id: "exp-pause", type: "button", disabled: true,
    onclick: async () => {
      const action = x && x.state === "paused" ? "resume" : "pause";
      try { await api("POST", `/v1/experiments/${id}/${action}`); load(); }
      catch (e) { error.hidden = false; error.textContent = e.message; }
    } }, "Pause");
  show(el("div", { class: "toolbar" }, el("a", { href: "#/experiments" }, "← Experiments")), head,
    error, el("div", { class: "card" }, facts), el("h2", {}, "Trials"),
    el("div", { class: "toolbar" }, el("label", { for: "trial-filter" }, "Show"), filter),
    el("div", { class: "scroll" }, el("table", { id: "trials" }, el("thead", {}, el("tr", {}, heads)), body)),
    el("h2", { id: "progress-title" }, "Metric by step"), el("div", { class: "card" }, progress),
    el("h2", {}, "Best metric against each searched path"), scatters);
  filter.addEventListener("change", () => redraw());

  let x = null, loading = false, again = false;
  const points = new Map(); // trial -> [[step, value]] of the searcher's metric
  const since = new Map();  // trial -> the step its metrics were read to
  const settled = new Set(); // trials whose points were read after they ended
  let pending = false;
  function later() { if (!pending) { pending = true; requestAnimationFrame(redraw); } }

  function drawProgress() {
    const trials = [...points.keys()].sort((a, b) => a - b);
    progress.setAttribute("data-lines", String(trials.length));
    if (!trials.length || typeof Dygraph === "undefined") return;
    const steps = new Map();
    trials.forEach((t, i) => points.get(t).forEach(([s, v]) => {
      if (!steps.has(s)) steps.set(s, new Array(trials.length).fill(null));
      steps.get(s)[i] = v;
    }));
    const data = [...steps.entries()].sort((a, b) => a[0] - b[0]).map(([s, vs]) => [s, ...vs]);
    const labels = ["step", ...trials.map((t) => `trial ${t}`)];
    const series = {};
    if (x.best) series[`trial ${x.best.trial}`] = { strokeWidth: 3.5 };
    progress.textContent = "";
    new Dygraph(progress, data, { labels, colors: trials.map((_, i) => COLORS[i % COLORS.length]),
      series, connectSeparatedPoints: true, legend: "always", legendFormatter: legend,
      strokeWidth: 1.2, drawPoints: data.length < 50, ylabel: x.searcher.metric,
      axes: { y: { axisLabelFormatter: (v) => +v.toPrecision(6) } } });
  }

  function drawScatters() {
    const done = x.trials.filter((t) => t.best);
    const paths = Object.keys(x.space || {}).sort();
    scatters.replaceChildren(...paths.map((p, i) => {
      const kind = Object.keys(x.space[p])[0];
      const values = (x.space[p][kind] || []);
      const numeric = done.every((t) => typeof t.hparams[p] === "number");
      const box = el("div", { class: "chart", id: `scatter-${i}`, "data-path": p,
        "data-points": String(done.length) });
      const card = el("div", { class: "card" }, el("div", { class: "chart-title" },
        `${p}${numeric ? "" : " (values in the order given)"}`), box);
      if (!done.length || typeof Dygraph === "undefined") { box.textContent = "No trial has ended yet."; return card; }
      const xOf = (t) => numeric ? t.hparams[p] : values.findIndex((v) => JSON.stringify(v) === JSON.stringify(t.hparams[p]));
      const data = done.map((t) => [xOf(t), t.best.value]).sort((a, b) => a[0] - b[0]);
      const xs = data.map((r) => r[0]);
      // values that span decades (learning rates) on a log axis
      const logX = numeric && xs[0] > 0 && xs[xs.length - 1] / xs[0] >= 20;
      requestAnimationFrame(() => new Dygraph(box, data, { labels: [p, x.searcher.metric],
        drawPoints: true, strokeWidth: 0, pointSize: 4, colors: [COLORS[0]], legend: "follow",
        xRangePad: 14, yRangePad: 14, // (a log axis pads itself badly: a window of its own)
        dateWindow: logX ? [xs[0] / 1.6, xs[xs.length - 1] * 1.6] : null,
        axes: { x: { logscale: logX,
          axisLabelFormatter: (v) => numeric ? +(+v).toPrecision(4) : valueText(values[Math.round(v)] ?? "") },
          y: { axisLabelFormatter: (v) => +v.toPrecision(6) } } }));
      return card;
    }));
  }

  function redraw() {
    pending = false;
    for (const b of document.querySelectorAll("#trials th button.sort"))
      b.setAttribute("aria-pressed", String(b.dataset.sort === sortBy));
    if (!x) return;
    body.replaceChildren(...trialsTable(x, sortBy, filter.value));
    drawProgress();
  }

  async function loadPoints(t) { // a trial's new metric lines (its last step read again)
    try {
      const from = since.has(t.trial) ? since.get(t.trial) - 1 : -1;
      const ms = await api("GET", `/v1/jobs/${t.job}/metrics?since=${from}`);
      const list = (points.get(t.trial) || []).filter(([s]) => s <= from);
      let last = from;
      for (const m of ms) {
        if (typeof m.step !== "number") continue;
        last = Math.max(last, m.step);
        const v = m[x.searcher.metric];
        if (typeof v === "number") list.push([m.step, v]);
      }
      points.set(t.trial, list);
      since.set(t.trial, last + 1);
      later();
    } catch (_) { /* the job went, or the session: the next turn tries again */ }
  }

  async function load() { // one at a time, the latest wins
    if (loading) { again = true; return; }
    loading = true;
    try {
      x = await api("GET", `/v1/experiments/${id}`);
    } catch (e) {
      if (e.status !== 401) { error.hidden = false; error.textContent = e.message; }
      return;
    } finally {
      loading = false;
      if (again && !left) { again = false; setTimeout(load, 0); }
    }
    if (left) return;
    const live = x.state === "running" || x.state === "paused";
    cancel.disabled = pause.disabled = !live;
    pause.textContent = x.state === "paused" ? "Resume" : "Pause";
    pause.title = x.state === "paused" ? "Its paused trials go on, then its searcher"
      : "Its trials pause (a running one goes on later from its latest checkpoint), holding no slot";
    head.replaceChildren(el("h1", {}, `Experiment ${x.id}: ${x.name}`), stateBadge(x.state), pause,
      cancel);
    head.querySelector(".state").id = "exp-state";
    const c = x.counts;
    facts.replaceChildren(
      el("dt", {}, "Search"), el("dd", {}, `${x.searcher.type}, ${x.trials_total} trials, ` +
        `at most ${x.max_concurrent} at a time, seed ${x.seed}`),
      ...(x.searcher.rung_steps ? [el("dt", {}, "Rungs"), el("dd", { id: "exp-rungs" },
        `steps ${x.searcher.rung_steps.join(", ")}: the top 1/${x.searcher.reduction_factor} of ` +
        `a rung go on (promotion ${x.searcher.promotion})`)] : []),
      ...(x.searcher.interval ? [el("dt", {}, "Generations"), el("dd", { id: "exp-generations" },
        `every ${x.searcher.interval} steps to ${x.searcher.max_steps}: the bottom ` +
        `${x.searcher.quantile * 100}% take a top trial's checkpoint, its values × ` +
        `${x.searcher.perturb.join(" or ")}`)] : []),
      el("dt", {}, "Metric"), el("dd", {}, `${x.searcher.metric} (${x.searcher.mode})`),
      el("dt", {}, "Trials"), el("dd", { id: "exp-counts" }, TRIAL_STATES.filter((s) => c[s])
        .map((s) => `${c[s]} ${s}`).join(", ") || "none yet"),
      el("dt", {}, "Best"), el("dd", { id: "exp-best" }, x.best ? el("span", {},
        `${(+x.best.value).toPrecision(6)} at step ${x.best.step}: trial ${x.best.trial} (`,
        el("a", { href: `#/job/${x.best.job}` }, `job ${x.best.job}`), `) ${hparamsText(x.best.hparams)}`) : "–"),
      el("dt", {}, "Created"), el("dd", {}, when(x.created_at)),
      el("dt", {}, "Reason"), el("dd", {}, x.reason || "–"));
    document.getElementById("progress-title").textContent = `${x.searcher.metric} by step, a line a trial`;
    for (const t of x.trials) {
      if (!t.job || settled.has(t.trial)) continue;
      if (["succeeded", "failed", "cancelled"].includes(t.state)) settled.add(t.trial);
      loadPoints(t);
    }
    drawScatters();
    redraw();
  }

  const es = new EventSource(`/v1/experiments/${id}/events?csrf=${csrf}`, { withCredentials: true });
  for (const name of ["trial", "promoted", "stopped", "exploited", "paused", "resumed", "best",
    "state"])
    es.addEventListener(name, () => { load(); if (name === "state") es.close(); });
  cleanups.push(() => es.close());
  every(3000, () => { if (x && x.state === "running") load(); }); // running trials' new points
  // (a paused experiment's trials print nothing: its events say when it goes on)
}
