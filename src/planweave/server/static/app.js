// planweave dashboard: plain JavaScript, no build step, nothing loaded from elsewhere.
//
// Data flow: the runs list comes from GET /runs and stays current through the global event stream (GET /events,
// followed from the list's X-Journal-Position). A selected run's state (GET /runs/{id}) and plan graph
// (GET /runs/{id}/plan) are re-read when its event stream (GET /runs/{id}/events) says something happened; the
// timeline and the errors are built from the events themselves. Clicking a step opens its panel
// (GET /runs/{id}/steps/{step}: inputs, output, attempts, errors), re-read when an event of that step arrives. Streams are read with fetch() so that they can
// carry the Authorization header (EventSource cannot), and resume with Last-Event-ID after a disconnect.
"use strict";

(() => {
  const TOKEN_KEY = "planweave.token";
  const SVG_NS = "http://www.w3.org/2000/svg";
  const $ = (id) => document.getElementById(id);

  let token = localStorage.getItem(TOKEN_KEY) || "";
  let globalStream = null;
  let runs = new Map();
  let runsRefresh = null;
  let view = null; // the selected run: see selectRun()
  let ticker = null;

  // -- small helpers --------------------------------------------------------------------------------------------
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined) continue;
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = v;
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v);
    }
    for (const child of children) if (child !== null && child !== undefined) node.append(child);
    return node;
  }

  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined) continue;
      if (k === "text") node.textContent = v;
      else node.setAttribute(k, String(v));
    }
    for (const child of children) if (child) node.append(child);
    return node;
  }

  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
  const isEpoch = (t) => typeof t === "number" && t > 1e9;
  const nowFor = (t) => (isEpoch(t) ? Date.now() / 1000 : null);

  function formatDuration(seconds) {
    if (seconds === null || seconds === undefined || !isFinite(seconds)) return "—";
    if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
    if (seconds < 60) return `${seconds.toFixed(seconds < 10 ? 2 : 1)} s`;
    const m = Math.floor(seconds / 60);
    if (m < 60) return `${m} min ${Math.round(seconds % 60)} s`;
    return `${Math.floor(m / 60)} h ${m % 60} min`;
  }

  function formatCost(value) {
    if (value === null || value === undefined) return "—";
    return value >= 0.01 || value === 0 ? `$${value.toFixed(2)}` : `$${value.toFixed(5)}`;
  }

  const formatTokens = (value) => (value === null || value === undefined ? "—" : value.toLocaleString());

  function formatInstant(t) {
    if (!isEpoch(t)) return t === null || t === undefined ? "—" : `t=${t.toFixed(2)}`;
    return new Date(t * 1000).toLocaleString();
  }

  function runDuration(run) {
    if (run.makespan_s !== null && run.makespan_s !== undefined) return run.makespan_s;
    const now = nowFor(run.started_at);
    return now !== null && run.status === "running" ? now - run.started_at : null;
  }

  function countsText(counts) {
    const parts = Object.entries(counts || {}).map(([status, n]) => `${n} ${status}`);
    return parts.length ? parts.join(" · ") : "—";
  }

  // Runs a function at most once per `ms`, and once more after the last call: live updates without a storm.
  function throttle(fn, ms) {
    let timer = null;
    let again = false;
    let running = false;
    const fire = async () => {
      timer = null;
      if (running) { again = true; return; }
      running = true;
      try { await fn(); } catch (err) { console.error(err); }
      running = false;
      if (again) { again = false; timer = setTimeout(fire, ms); }
    };
    return () => { if (timer === null) timer = setTimeout(fire, ms); else again = true; };
  }

  // -- the API --------------------------------------------------------------------------------------------------
  class Unauthorized extends Error {}

  async function api(path, options = {}) {
    const headers = { Authorization: `Bearer ${token}`, ...(options.headers || {}) };
    if (options.body !== undefined) headers["Content-Type"] = "application/json";
    const resp = await fetch(path, { ...options, headers, cache: "no-store" });
    if (resp.status === 401) {
      showLogin("The token was not accepted.");
      throw new Unauthorized("401");
    }
    let body = null;
    try { body = await resp.json(); } catch (err) { body = null; }
    if (!resp.ok) {
      const error = new Error((body && body.detail) || `${resp.status} ${resp.statusText}`);
      error.status = resp.status;
      error.body = body;
      throw error;
    }
    return { body, headers: resp.headers };
  }

  // An event stream read with fetch: calls onEvent(kind, data, id) per event and resumes after the last id on
  // reconnect. When the server ends it, it is reopened unless done() says it is over (a run after run_finished).
  function openStream(path, lastId, onEvent, done = () => false) {
    const controller = new AbortController();
    let stopped = false;
    let last = lastId || 0;
    (async () => {
      let backoff = 500;
      while (!stopped) {
        try {
          const headers = { Authorization: `Bearer ${token}`, Accept: "text/event-stream" };
          if (last) headers["Last-Event-ID"] = String(last);
          const resp = await fetch(path, { headers, signal: controller.signal, cache: "no-store" });
          if (resp.status === 401) { showLogin("The token was not accepted."); return; }
          if (!resp.ok || !resp.body) throw new Error(`${path}: ${resp.status}`);
          setConnected(true);
          backoff = 500;
          const reader = resp.body.getReader();
          const decoder = new TextDecoder();
          let buffer = "";
          for (;;) {
            const { value, done } = await reader.read();
            if (done) break;
            buffer += decoder.decode(value, { stream: true }).replace(/\r/g, "");
            let end;
            while ((end = buffer.indexOf("\n\n")) >= 0) {
              const frame = buffer.slice(0, end);
              buffer = buffer.slice(end + 2);
              const parsed = parseFrame(frame);
              if (parsed) {
                if (parsed.id) last = Number(parsed.id);
                onEvent(parsed.event, parsed.data, last);
              }
            }
          }
          if (done()) return; // ended by the server because there is nothing more to say
          setConnected(false);
        } catch (err) {
          if (stopped) return;
          setConnected(false);
        }
        await sleep(backoff);
        backoff = Math.min(backoff * 2, 10000);
      }
    })();
    return {
      close() { stopped = true; controller.abort(); },
      get lastId() { return last; },
    };
  }

  function parseFrame(frame) {
    let id = null;
    let event = "message";
    const data = [];
    for (const line of frame.split("\n")) {
      if (!line || line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? "" : line.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "id") id = value;
      else if (field === "event") event = value;
      else if (field === "data") data.push(value);
    }
    if (!data.length) return null;
    try { return { id, event, data: JSON.parse(data.join("\n")) }; } catch (err) { return null; }
  }

  function setConnected(live) {
    const badge = $("connection");
    badge.textContent = live ? "live" : "reconnecting…";
    badge.classList.toggle("live", live);
  }

  // -- login ----------------------------------------------------------------------------------------------------
  function showLogin(message) {
    stopAll();
    localStorage.removeItem(TOKEN_KEY);
    token = "";
    $("main").hidden = true;
    $("logout").hidden = true;
    $("login").hidden = false;
    $("login-error").textContent = message || "";
    $("token-input").focus();
  }

  function stopAll() {
    if (globalStream) globalStream.close();
    globalStream = null;
    if (view && view.stream) view.stream.close();
    view = null;
    if (ticker) clearInterval(ticker);
    ticker = null;
    if (workersTimer) clearInterval(workersTimer);
    workersTimer = null;
  }

  async function start() {
    $("login").hidden = true;
    $("main").hidden = false;
    $("logout").hidden = false;
    try {
      await loadRuns();
    } catch (err) {
      if (!(err instanceof Unauthorized)) $("login-error").textContent = String(err.message || err);
      return;
    }
    ticker = setInterval(tick, 1000); // only redraws what depends on the clock (running durations, open bars)
    loadWorkers();
    route();
  }

  // -- the workers of a queue (serve --queue) ----------------------------------------------------------------------
  // GET /workers: which worker runs what, and the age of each lease. Leases age with time, not with events, so the
  // panel is re-read every few seconds; a server without a queue answers 404 and the panel stays hidden.
  let workersTimer = null;

  async function loadWorkers() {
    let body;
    try {
      ({ body } = await api("/workers"));
    } catch (err) {
      if (err.status === 404 && workersTimer) clearInterval(workersTimer);
      if (err.status === 404) workersTimer = null;
      return;
    }
    if (!workersTimer) workersTimer = setInterval(loadWorkers, 2000);
    renderWorkers(body);
  }

  function renderWorkers(body) {
    $("workers").hidden = false;
    const counts = Object.entries(body.runs || {}).map(([k, v]) => `${k} ${v}`).join(" · ");
    $("workers-queue").textContent = counts ? `queue: ${counts}` : "queue: empty";
    const list = $("workers-list");
    list.replaceChildren(...body.workers.map((w) => el("li", { class: w.alive ? "worker" : "worker stale" },
      el("span", { class: "worker-name", text: w.name }),
      el("span", { class: "muted", text: ` ${w.alive ? "alive" : "not renewing"} · ${w.runs.length} run(s)` }),
      el("ul", {}, ...w.runs.map((r) => el("li", {},
        el("a", { href: `#/runs/${encodeURIComponent(r.run_id)}`, text: r.run_id }),
        el("span", { class: "muted", text: ` epoch ${r.epoch} · lease ${formatDuration(r.expires_in_s)} left` })))))));
    if (!body.workers.length) list.replaceChildren(el("li", { class: "muted", text: "no workers running" }));
  }

  // -- the runs list --------------------------------------------------------------------------------------------
  // GET /runs pages (newest first, read from run summaries): the list shows RUNS_PAGE runs, more on request.
  const RUNS_PAGE = 50;
  let runsCursor = null;

  function runsPath(limit, cursor) {
    const query = new URLSearchParams({ limit: String(limit) });
    const status = $("runs-status").value;
    if (status) query.set("status", status);
    if (cursor !== null) query.set("cursor", cursor);
    return `/runs?${query}`;
  }

  async function loadRuns() {
    const { body, headers } = await api(runsPath(RUNS_PAGE, null));
    runs = new Map(body.map((run) => [run.run_id, run]));
    runsCursor = headers.get("X-Next-Cursor");
    renderRuns();
    if (!globalStream) {
      const position = Number(headers.get("X-Journal-Position") || 0);
      runsRefresh = throttle(refreshRuns, 500);
      globalStream = openStream("/events", position, () => { runsRefresh(); if (onMemoryPage()) memoryRefresh(); });
    }
  }

  async function refreshRuns() {
    // As many runs as are shown (older pages the user opened stay), from the newest.
    const { body, headers } = await api(runsPath(Math.max(RUNS_PAGE, runs.size), null));
    runs = new Map(body.map((run) => [run.run_id, run]));
    runsCursor = headers.get("X-Next-Cursor");
    renderRuns();
  }

  async function moreRuns() {
    if (runsCursor === null) return;
    const { body, headers } = await api(runsPath(RUNS_PAGE, runsCursor));
    for (const run of body) runs.set(run.run_id, run);
    runsCursor = headers.get("X-Next-Cursor");
    renderRuns();
  }

  function renderRuns() {
    const tbody = $("runs").querySelector("tbody");
    const rows = [...runs.values()].map((run) => {
      const row = el("tr", { class: "run-row", "data-run": run.run_id, onclick: () => navigate(run.run_id) },
        el("td", { class: "id", title: run.plan ? `${run.run_id} (${run.plan})` : run.run_id, text: run.run_id }),
        el("td", {}, el("span", { class: `badge status-${run.status}`, text: run.status }),
          Object.keys(run.waiting || {}).length
            ? el("span", { class: "badge status-waiting_approval waiting-badge", title: Object.keys(run.waiting).join(", "),
              text: `${Object.keys(run.waiting).length} waiting` })
            : null),
        el("td", { class: "duration", text: formatDuration(runDuration(run)) }),
        el("td", { text: formatCost(run.cost_usd) }));
      if (view && view.id === run.run_id) row.classList.add("selected");
      return row;
    });
    tbody.replaceChildren(...rows);
    $("runs-empty").hidden = runs.size > 0;
    $("runs-more").hidden = runsCursor === null;
  }

  // -- routing --------------------------------------------------------------------------------------------------
  function navigate(runId) {
    location.hash = `#/runs/${encodeURIComponent(runId)}`;
  }

  function route() {
    $("memory").hidden = !onMemoryPage();
    if (onMemoryPage()) {
      if (view && view.stream) view.stream.close();
      view = null;
      $("run").hidden = true;
      $("no-run").hidden = true;
      renderRuns();
      loadMemory();
      return;
    }
    const match = location.hash.match(/^#\/runs\/(.+)$/);
    const runId = match ? decodeURIComponent(match[1]) : null;
    if (runId && (!view || view.id !== runId)) selectRun(runId);
    if (!runId) { $("run").hidden = true; $("no-run").hidden = false; }
  }

  // -- memory (#/memory) ------------------------------------------------------------------------------------------
  // GET /memory: the lessons and skills across runs, with the run each came from (a link to its page) and how often
  // a planner was given it. Re-read when the page opens, on Refresh, and when the journal moves (a run ended).
  const onMemoryPage = () => location.hash === "#/memory";
  const memoryRefresh = throttle(() => loadMemory(), 1000);

  async function loadMemory() {
    const status = $("memory-status").value;
    let body;
    try {
      ({ body } = await api(status ? `/memory?status=${encodeURIComponent(status)}` : "/memory"));
    } catch (err) {
      if (err instanceof Unauthorized) return;
      $("memory-error").textContent = String(err.message || err);
      $("memory-error").hidden = false;
      $("memory-entries").querySelector("tbody").replaceChildren();
      $("memory-empty").hidden = true;
      return;
    }
    $("memory-error").hidden = true;
    renderMemory(body);
  }

  function renderMemory(entries) {
    const rows = entries.map((e) => {
      const run = e.provenance && e.provenance.run_id;
      const steps = (e.provenance && e.provenance.step_ids) || [];
      const text = e.text.length > 80 ? `${e.text.slice(0, 77)}...` : e.text;
      return el("tr", { "data-entry": String(e.id), title: e.note || null },
        el("td", { class: "id", text: String(e.id) }),
        el("td", { text: e.kind }),
        el("td", { class: "name", text: e.name }),
        el("td", { text: String(e.version) }),
        el("td", {}, el("span", { class: `badge memory-${e.status}`, text: e.status })),
        el("td", { class: "uses", text: String(e.uses) }),
        el("td", { class: "provenance" },
          run ? el("a", { href: `#/runs/${encodeURIComponent(run)}`, text: run }) : el("span", { class: "muted", text: "—" })),
        el("td", { class: "steps muted", text: steps.join(", ") || "—" }),
        el("td", { text: formatInstant(e.created_at) }),
        el("td", { class: "text", title: e.text, text }));
    });
    $("memory-entries").querySelector("tbody").replaceChildren(...rows);
    $("memory-empty").hidden = entries.length > 0;
  }

  // -- one run --------------------------------------------------------------------------------------------------
  function selectRun(runId) {
    if (view && view.stream) view.stream.close();
    view = {
      id: runId,
      summary: null,
      plan: null,
      version: null, // null: follow the current version
      attempts: new Map(), // step -> [{attempt, start, end, outcome}]
      finishedAt: new Map(), // step -> when its last outcome (succeeded, failed, cancelled after it started) came
      errors: [],
      startedAt: null,
      lastAt: null,
      finished: false,
      stream: null,
      step: null, // the step whose panel is open
    };
    const current = view;
    current.stepRefresh = throttle(() => refreshStep(current), 200);
    // Each refresh re-reads the run's state and graph: slower for big plans, so that they stay cheap.
    current.refresh = throttle(() => refreshRun(current), 250);
    current.redraw = throttle(async () => { if (view === current) renderTimeline(); }, 100);
    $("no-run").hidden = true;
    $("run").hidden = false;
    $("run-title").textContent = runId;
    $("run-plan").textContent = "";
    $("errors").replaceChildren(el("p", { class: "muted", text: "None." }));
    $("dag").replaceChildren();
    $("gantt").replaceChildren();
    $("step-panel").hidden = true;
    $("waiting").hidden = true;
    $("forecast").hidden = true;
    $("waiting-list").replaceChildren();
    delete $("waiting-list").dataset.key;
    renderRuns();
    refreshRun(current);
    current.stream = openStream(`/runs/${encodeURIComponent(runId)}/events`, 0, (kind, event) => {
      if (view !== current) return;
      if (kind === "run_finished") current.finished = true;
      else if (kind === "run_created" || kind === "run_resumed") current.finished = false;
      applyEvent(current, kind, event);
      current.refresh();
      current.redraw();
      if (current.step && (event.step === current.step || kind === "run_finished")) current.stepRefresh();
    }, () => current.finished || view !== current);
  }

  function closeOpenAttempts(current, at, outcome, only) {
    for (const [step, attempts] of current.attempts) {
      if (only && !only.includes(step)) continue;
      const last = attempts[attempts.length - 1];
      if (last && last.end === null) { last.end = at; last.outcome = outcome; }
    }
  }

  function applyEvent(current, kind, event) {
    const at = event.at;
    current.lastAt = at;
    const data = event.data || {};
    const step = event.step;
    switch (kind) {
      case "run_created":
        current.startedAt = at;
        break;
      case "step_started": {
        if (!current.attempts.has(step)) current.attempts.set(step, []);
        current.attempts.get(step).push({ attempt: data.attempt, start: at, end: null, outcome: "running" });
        break;
      }
      case "speculation_started": {
        // A speculative attempt (docs/speculation.md): drawn dashed; nothing of it is a result until adopted.
        if (!current.attempts.has(step)) current.attempts.set(step, []);
        current.attempts.get(step).push({ attempt: "speculative", start: at, end: null, outcome: "speculative" });
        break;
      }
      case "speculation_adopted": {
        // After the adopting step_started: that attempt began when the speculative one did. A draft attempt
        // (planning/draft.py) may be adopted under another id (data.draft_step): its open bar folds onto the step.
        const source = data.draft_step || step;
        if (source !== step && current.attempts.has(source)) {
          const rest = current.attempts.get(source).filter((a) => a.outcome !== "speculative" || a.end !== null);
          if (rest.length) current.attempts.set(source, rest); else current.attempts.delete(source);
        }
        const attempts = current.attempts.get(step) || [];
        const kept = attempts.filter((a) => a.outcome !== "speculative" || a.end !== null);
        const last = kept[kept.length - 1];
        if (last) { last.start = data.started_at; last.speculative = true; }
        current.attempts.set(step, kept);
        break;
      }
      case "speculation_discarded":
        for (const a of current.attempts.get(step) || []) {
          if (a.outcome === "speculative" && a.end === null) { a.end = at; a.outcome = "discarded"; }
        }
        break;
      case "step_succeeded":
        closeOpenAttempts(current, at, "succeeded", [step]);
        current.finishedAt.set(step, at);
        break;
      case "step_failed":
        closeOpenAttempts(current, at, "failed", [step]);
        current.finishedAt.set(step, at);
        current.errors.push({ at, step, attempt: data.attempt, kind: data.kind, text: data.error || "failed",
          final: data.final !== false, retryIn: data.retry_in });
        renderErrors(current);
        break;
      case "step_cancelled":
        closeOpenAttempts(current, at, "cancelled", [step]);
        if (current.attempts.has(step)) current.finishedAt.set(step, at); // a step cancelled before it ran took no time
        break;
      case "run_cancelled":
        closeOpenAttempts(current, at, "cancelled");
        break;
      case "run_resumed":
        closeOpenAttempts(current, at, "interrupted");
        break;
      case "plan_version":
        closeOpenAttempts(current, at, "cancelled", data.cancelled || []);
        break;
      case "escalation": {
        // a model cascade's move names its monitor and the tiers it moved between
        const monitor = data.monitor ? ` (${data.monitor})` : "";
        const moved = data.from_tier ? `${data.from_tier} -> ${data.to_tier}: ` : "";
        current.errors.push({ at, step, kind: `escalation: ${data.rung}${monitor}`, text: moved + (data.reason || ""),
                              escalation: true });
        renderErrors(current);
        break;
      }
      case "forecast":
        current.forecast = data;
        renderForecast(data);
        break;
      case "run_finished":
        closeOpenAttempts(current, at, "interrupted");
        if (data.error) {
          current.errors.push({ at, step: null, kind: `run ${data.status}`, text: data.error, final: true });
          renderErrors(current);
        }
        break;
      default:
        break;
    }
  }

  // The run's last forecast (a "forecast" event): probability bars for its deadline, its budget, success and all of
  // them together, the makespan percentiles, and a histogram of the simulated makespans with axes and the deadline.
  // A probability the forecast cannot know (p_success, p_all with no history: null) reads "unknown", never 0 or 100%.
  function renderForecast(data) {
    $("forecast").hidden = false;
    $("forecast-runs").textContent = `(${data.runs} simulated runs, at ${formatDuration(data.elapsed || 0)})`;
    const limited = data.p_deadline !== null && data.p_deadline !== undefined
      || data.p_budget !== null && data.p_budget !== undefined;
    const bars = [
      ["forecast-deadline", data.p_deadline, "p_deadline" in data && data.p_deadline !== null],
      ["forecast-budget", data.p_budget, "p_budget" in data && data.p_budget !== null],
      ["forecast-success", data.p_success, "p_success" in data],
      ["forecast-all", data.p_all, "p_all" in data && limited],
    ];
    for (const [id, p, shown] of bars) {
      const bar = $(id);
      bar.hidden = !shown;
      if (!shown) continue;
      const unknown = p === null || p === undefined;
      bar.dataset.p = unknown ? "unknown" : String(p);
      bar.classList.toggle("unknown", unknown);
      bar.classList.toggle("low", !unknown && p < 0.5);
      bar.querySelector(".fill").style.width = unknown ? "0%" : `${Math.round(p * 100)}%`;
      bar.querySelector(".value").textContent = unknown ? "unknown (no history)" : `${Math.round(p * 100)}%`;
      bar.querySelector(".value").title = unknown
        ? "No run of these steps or tools in the journal yet: nothing to estimate success from." : "";
    }
    const m = data.makespan || {};
    $("forecast-makespan").textContent = `makespan p50 ${formatDuration(m.p50)} · p90 ${formatDuration(m.p90)} · ` +
      `p99 ${formatDuration(m.p99)}` + (data.critical_steps && data.critical_steps.length
      ? ` · critical: ${data.critical_steps.join(" → ")}` : "");
    const untimed = data.untimed || [];
    $("forecast-untimed").hidden = !untimed.length;
    $("forecast-untimed").textContent = untimed.length
      ? `untimed (no history, estimate or literal duration; counted as instant): ${untimed.join(", ")}` : "";
    renderHistogram($("forecast-hist"), data.histogram || [], data.deadline);
  }

  // Nice steps for a time axis: 1-2-5 below ten seconds, then whole seconds, minutes and hours.
  const TIME_STEPS = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600,
    900, 1800, 3600, 7200, 10800, 21600, 43200, 86400];

  // A tick's time, in the units formatDuration uses, without its trailing zeros ("2 s", "2.5 s", "1 min 30 s").
  function formatTick(seconds) {
    if (Math.abs(seconds) < 1e-9) return "0";
    if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
    if (seconds < 60) return `${Number(seconds.toFixed(2))} s`;
    const m = Math.floor(seconds / 60 + 1e-9);
    const s = Math.round(seconds - m * 60);
    if (m < 60) return s ? `${m} min ${s} s` : `${m} min`;
    return m % 60 ? `${Math.floor(m / 60)} h ${m % 60} min` : `${Math.floor(m / 60)} h`;
  }

  function renderHistogram(chart, hist, deadline) {
    const width = 460, height = 150;
    const left = 46, right = 16, top = 20, bottom = 34;
    const plotW = width - left - right, plotH = height - top - bottom;
    chart.setAttribute("viewBox", `0 0 ${width} ${height}`);
    chart.setAttribute("width", String(width));
    chart.setAttribute("height", String(height));
    if (!hist.length) { chart.replaceChildren(); return; }
    const most = Math.max(1, ...hist.map((b) => b[1]));
    const first = hist[0][0];
    // Bins are equal-width. A single bin means every simulated run took the same time: a thin bar at that time,
    // with some room on either side (a tenth of it, at least 50 ms).
    const single = hist.length === 1;
    const binW = single ? 0 : hist[1][0] - hist[0][0];
    const room = Math.max(Math.abs(first) * 0.1, 0.05);
    let lo = single ? first - room : first;
    let hi = single ? first + room : first + binW * hist.length;
    const hasDeadline = deadline !== null && deadline !== undefined && isFinite(deadline);
    // The deadline is drawn where it is when it is near the simulated makespans (within their spread again on
    // either side); farther away an arrow at the edge points to it, so that the bars keep their width.
    const spread = hi - lo;
    const near = hasDeadline && deadline >= lo - spread && deadline <= hi + spread;
    if (near) { lo = Math.min(lo, deadline); hi = Math.max(hi, deadline); }
    const pad = (hi - lo) * 0.04;
    lo = Math.max(0, lo - pad);
    hi += pad;
    const x = (t) => left + ((t - lo) / (hi - lo)) * plotW;
    const y = (count) => top + plotH - (count / most) * plotH;
    const parts = [];
    // y axis: how many simulated runs took each makespan
    const yTicks = most >= 4 ? [0, Math.round(most / 2), most] : most >= 2 ? [0, most] : [0, 1];
    for (const c of yTicks) {
      parts.push(svg("line", { class: "grid", x1: left, x2: left + plotW, y1: y(c), y2: y(c) }));
      parts.push(svg("text", { class: "tick y-tick", x: left - 5, y: y(c) + 3, "text-anchor": "end", text: String(c) }));
    }
    parts.push(svg("text", { class: "axis-label y-label", x: 11, y: top + plotH / 2, "text-anchor": "middle",
      transform: `rotate(-90 11 ${top + plotH / 2})`, text: "runs" }));
    // bars
    for (const [start, count] of hist) {
      const tip = single ? `${formatDuration(start)}: all ${count} runs`
        : `${formatDuration(start)} – ${formatDuration(start + binW)}: ${count} runs`;
      parts.push(svg("rect", {
        class: "bin", x: single ? x(start) - 4 : x(start), width: single ? 8 : Math.max(1, x(start + binW) - x(start) - 1),
        y: y(count), height: top + plotH - y(count),
      }, svg("title", { text: tip })));
    }
    // x axis: time from the run's start, at nice steps
    parts.push(svg("line", { class: "axis x-axis", x1: left, x2: left + plotW, y1: top + plotH, y2: top + plotH }));
    parts.push(svg("line", { class: "axis", x1: left, x2: left, y1: top, y2: top + plotH }));
    const step = TIME_STEPS.find((s) => (hi - lo) / s <= 6) || Math.ceil((hi - lo) / 6 / 86400) * 86400;
    const ticks = svg("g", { class: "x-ticks" });
    for (let t = Math.ceil(lo / step - 1e-9) * step; t <= hi + 1e-9; t += step) {
      ticks.append(svg("line", { class: "axis", x1: x(t), x2: x(t), y1: top + plotH, y2: top + plotH + 4 }),
        svg("text", { class: "tick x-tick", x: x(t), y: top + plotH + 15, "text-anchor": "middle", text: formatTick(t) }));
    }
    parts.push(ticks);
    parts.push(svg("text", { class: "axis-label x-label", x: left + plotW / 2, y: height - 3, "text-anchor": "middle",
      text: "simulated makespan (time from the run's start)" }));
    // the deadline, marked and labelled
    if (hasDeadline) {
      const label = `deadline ${formatDuration(deadline)}`;
      if (near) {
        const at = x(deadline);
        const anchor = at > left + plotW * 0.8 ? "end" : at < left + plotW * 0.2 ? "start" : "middle";
        parts.push(svg("line", { class: "deadline", x1: at, x2: at, y1: top - 4, y2: top + plotH }));
        parts.push(svg("text", { class: "deadline-label", x: at, y: top - 7, "text-anchor": anchor, text: label }));
      } else {
        const after = deadline > hi;
        parts.push(svg("text", { class: "deadline-label off-chart", x: after ? left + plotW : left, y: top - 7,
          "text-anchor": after ? "end" : "start", text: after ? `${label} →` : `← ${label}` }));
      }
    }
    chart.replaceChildren(...parts);
  }

  async function refreshRun(current) {
    const base = `/runs/${encodeURIComponent(current.id)}`;
    const planPath = current.version ? `${base}/plan?version=${current.version}` : `${base}/plan`;
    let summary;
    let plan;
    try {
      [summary, plan] = await Promise.all([api(`${base}?outputs=false`), api(planPath)]);
    } catch (err) {
      if (err instanceof Unauthorized || view !== current) return;
      if (err.status === 404 && !current.summary) {
        $("run-error").hidden = false;
        $("run-error").textContent = String(err.message);
      }
      return;
    }
    if (view !== current) return;
    if (plan.body.steps.length > 300 && !current.slowed) {
      current.slowed = true;
      current.refresh = throttle(() => refreshRun(current), 1000);
    }
    current.summary = summary.body;
    current.plan = plan.body;
    $("run-plan").textContent = plan.body.name || plan.body.goal || "";
    renderHeader(current);
    renderVersions(current);
    renderDag(current);
    renderTimeline();
    api(`${base}/subplans`).then(({ body }) => renderSubplans(current, body)).catch(() => {});
  }

  // -- sub-plans: the parent of a child run, and the tree of a run's child runs (docs/subplans.md) ---------------
  function renderSubplans(current, tree) {
    if (view !== current) return;
    const items = [];
    if (tree.parent) {
      items.push(el("p", { class: "subplan-parent" }, "sub-plan of ",
        el("a", { href: `#/runs/${encodeURIComponent(tree.parent.run)}`, text: tree.parent.run }),
        `, step ${tree.parent.step}`));
    }
    if (tree.children.length) {
      const open = current.subplansOpen !== false;
      const details = el("details", { open: open ? "" : null },
        el("summary", { text: `sub-plans (${tree.children.length})` }), subplanList(tree.children));
      details.addEventListener("toggle", () => { current.subplansOpen = details.open; });
      items.push(details);
    }
    const box = $("run-subplans");
    box.hidden = !items.length;
    box.replaceChildren(...items);
  }

  function subplanList(children) {
    return el("ul", { class: "subplan-list" }, ...children.map((child) => el("li", { class: "subplan" },
      el("a", { href: `#/runs/${encodeURIComponent(child.run)}`, text: child.run }), " ",
      el("span", { class: `badge status-${child.status}`, text: child.status }),
      child.answer || child.error
        ? el("span", { class: child.answer ? "subplan-answer" : "subplan-error", text: ` ${child.answer || child.error}` })
        : null,
      child.children.length ? subplanList(child.children) : null)));
  }

  function renderHeader(current) {
    const s = current.summary;
    const badge = $("run-status");
    badge.textContent = s.status;
    badge.className = `badge status-${s.status}`;
    $("run-duration").textContent = formatDuration(runDuration(s));
    const counts = {};
    for (const step of Object.values(s.steps || {})) counts[step.status] = (counts[step.status] || 0) + 1;
    $("run-counts").textContent = countsText(counts);
    $("run-tokens").textContent = formatTokens(s.tokens);
    $("run-cost").textContent = formatCost(s.cost_usd);
    $("run-started").textContent = formatInstant(s.started_at);
    $("run-error").hidden = !s.error;
    $("run-error").textContent = s.error ? `error: ${s.error}` : "";
    $("run-answer").hidden = !s.answer;
    $("run-answer").textContent = s.answer ? s.answer : "";
    renderWaiting(current);
    $("cancel-run").hidden = s.status !== "running";
    // Resume continues interrupted runs; a failed run only has something left to do if some step's outcome is
    // unknown (it was running when the run was interrupted and is not idempotent): resuming retries those.
    const unknown = Object.values(s.steps || {}).some((step) => step.status === "unknown");
    const resume = $("resume-run");
    resume.hidden = !(s.status === "interrupted" || (s.status === "failed" && unknown));
    resume.textContent = s.status === "interrupted" ? "Resume" : "Retry unknown steps";
    resume.dataset.retryUnknown = String(s.status !== "interrupted");
  }

  function renderVersions(current) {
    const plan = current.plan;
    const select = $("version-select");
    const options = plan.versions.map((v) => el("option", {
      value: String(v.version),
      text: `v${v.version}${v.trigger ? ` (${v.trigger})` : ""}${v.version === plan.current_version ? " · current" : ""}`,
    }));
    select.replaceChildren(...options);
    select.value = String(plan.version);
    const items = plan.versions.filter((v) => v.parent !== null && v.parent !== undefined).map((v) => {
      const diff = [["+", v.added], ["kept ", v.kept], ["adopted ", v.adopted], ["−", v.cancelled], ["dropped ", v.dropped]]
        .filter(([, list]) => list && list.length)
        .map(([sign, list]) => `${sign}${list.join(", ")}`)
        .join("; ");
      return el("li", { text: `plan_version v${v.version} from v${v.parent} (${v.trigger || "replan"}) at ${formatInstant(v.spliced_at)}${diff ? `: ${diff}` : ""}` });
    });
    $("versions").replaceChildren(...items);
  }

  // -- the critical path: by estimates while the run goes, as it happened once it ended ----------------------------
  const ENDED = ["succeeded", "failed", "cancelled"];

  // The chain of steps that determined the end of a finished run: from the step that finished last, back through
  // each step's latest-finishing dependency. Steps that never ran (skipped, cancelled while waiting) have no finish
  // time and are never on it. A tie goes to the later step in plan order (a dependent that took no time ends the run).
  function actualCriticalPath(plan, finishedAt) {
    const byId = new Map(plan.steps.map((step) => [step.id, step]));
    const latest = (ids) => {
      let found = null;
      for (const id of ids) {
        const t = finishedAt.get(id);
        if (t !== undefined && (found === null || t >= finishedAt.get(found))) found = id;
      }
      return found;
    };
    const path = [];
    for (let id = latest(plan.steps.map((step) => step.id)); id !== null; id = latest(byId.get(id).deps)) path.push(id);
    return path.reverse();
  }

  // What the DAG and the timeline outline: {steps, actual}. A finished run's path follows its actual durations; a
  // running (or interrupted) run's is the plan's, by estimates (GET /runs/{id}/plan).
  function criticalPath(current) {
    const plan = current.plan;
    if (!plan) return { steps: [], actual: false };
    const ended = current.summary && ENDED.includes(current.summary.status);
    if (ended && current.finishedAt.size) return { steps: actualCriticalPath(plan, current.finishedAt), actual: true };
    return { steps: plan.critical_path || [], actual: false };
  }

  // -- the DAG: layered by topological depth, critical path highlighted -------------------------------------------
  function layout(steps) {
    const depth = new Map();
    for (const step of steps) { // plan order is topological: dependencies come first
      const d = step.deps.length ? Math.max(...step.deps.map((dep) => (depth.get(dep) ?? -1) + 1)) : 0;
      depth.set(step.id, d);
    }
    const layers = [];
    for (const step of steps) {
      const d = depth.get(step.id);
      (layers[d] = layers[d] || []).push(step.id);
    }
    // One barycentre pass: order each layer by the mean row of its dependencies, to untangle edges.
    const row = new Map();
    layers.forEach((layer, i) => {
      if (i > 0) {
        const byId = new Map(steps.map((s) => [s.id, s]));
        const weight = (id) => {
          const deps = byId.get(id).deps.filter((d) => row.has(d));
          return deps.length ? deps.reduce((sum, d) => sum + row.get(d), 0) / deps.length : 0;
        };
        layer.sort((a, b) => weight(a) - weight(b));
      }
      layer.forEach((id, j) => row.set(id, j));
    });
    return { depth, row, layers };
  }

  function renderDag(current) {
    const plan = current.plan;
    const container = $("dag");
    if (!plan.steps.length) { container.replaceChildren(el("p", { class: "muted", text: "No steps yet." })); return; }
    const W = 168, H = 40, GX = 64, GY = 18, PAD = 16;
    const { depth, row, layers } = layout(plan.steps);
    const tallest = Math.max(...layers.map((l) => l.length));
    const width = PAD * 2 + layers.length * W + (layers.length - 1) * GX;
    const height = PAD * 2 + tallest * H + (tallest - 1) * GY;
    const pos = (id) => {
      const layer = layers[depth.get(id)];
      const offset = ((tallest - layer.length) * (H + GY)) / 2;
      return { x: PAD + depth.get(id) * (W + GX), y: PAD + offset + row.get(id) * (H + GY) };
    };
    const path = criticalPath(current);
    const critical = new Set(path.steps);
    const criticalEdges = new Set();
    for (let i = 1; i < path.steps.length; i++) criticalEdges.add(`${path.steps[i - 1]}>${path.steps[i]}`);
    const key = $("critical-key");
    key.textContent = path.actual ? "critical path (as run)" : "critical path (by estimates)";
    key.title = path.actual
      ? "The steps that determined when the run ended: from the last to finish, each one's latest-finishing dependency."
      : "The longest chain of steps by their estimated durations.";
    container.dataset.critical = path.actual ? "actual" : "estimated";
    const root = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": "plan graph" });
    root.append(svg("defs", {},
      svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 8, markerHeight: 8, markerUnits: "userSpaceOnUse", orient: "auto-start-reverse" },
        svg("path", { d: "M 0 0 L 10 5 L 0 10 z", class: "arrow" })),
      svg("marker", { id: "arrow-critical", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 9, markerHeight: 9, markerUnits: "userSpaceOnUse", orient: "auto-start-reverse" },
        svg("path", { d: "M 0 0 L 10 5 L 0 10 z", class: "arrow-critical" }))));
    const edges = svg("g", { class: "edges" });
    const nodes = svg("g", { class: "nodes" });
    for (const step of plan.steps) {
      const to = pos(step.id);
      for (const dep of step.deps) {
        const from = pos(dep);
        const x1 = from.x + W, y1 = from.y + H / 2, x2 = to.x, y2 = to.y + H / 2, mx = (x1 + x2) / 2;
        const isCritical = criticalEdges.has(`${dep}>${step.id}`);
        edges.append(svg("path", {
          d: `M ${x1} ${y1} C ${mx} ${y1}, ${mx} ${y2}, ${x2} ${y2}`,
          class: isCritical ? "edge critical" : "edge",
          "marker-end": isCritical ? "url(#arrow-critical)" : "url(#arrow)",
          "data-from": dep, "data-to": step.id,
        }));
      }
      const label = step.id.length > 22 ? `${step.id.slice(0, 21)}…` : step.id;
      const tip = `${step.id} (${step.tool}): ${step.status}${step.description ? `\n${step.description}` : ""}`;
      nodes.append(svg("g", {
        class: `node status-${step.status}${critical.has(step.id) ? " critical" : ""}${step.id === current.step ? " selected" : ""}`,
        transform: `translate(${to.x},${to.y})`, "data-step": step.id, "data-status": step.status,
      },
      svg("title", { text: tip }),
      svg("rect", { width: W, height: H, rx: 6, ry: 6 }),
      svg("text", { x: 10, y: 17, text: label }),
      svg("text", { x: 10, y: 31, class: "tool", text: `${step.tool} · ${step.status}` })));
    }
    root.append(edges, nodes);
    container.replaceChildren(root);
  }

  // -- steps waiting for a person: approve / reject, or give a value ------------------------------------------------
  const WAITING = ["waiting_approval", "waiting_input"];

  function renderWaiting(current) {
    const steps = Object.entries(current.summary.steps || {}).filter(([, step]) => WAITING.includes(step.status));
    const list = $("waiting-list");
    const key = steps.map(([id, step]) => `${id}:${step.status}`).join(",");
    $("waiting").hidden = steps.length === 0;
    if (list.dataset.key === key) return; // unchanged: keep what the person is typing
    list.dataset.key = key;
    list.replaceChildren(...steps.map(([id, step]) => (step.status === "waiting_approval"
      ? approvalItem(current, id, step) : inputItem(current, id, step))));
  }

  async function reply(current, stepId, kind, body, out) {
    out.textContent = "";
    try {
      await api(`/runs/${encodeURIComponent(current.id)}/steps/${encodeURIComponent(stepId)}/${kind}`,
        { method: "POST", body: JSON.stringify(body) });
    } catch (err) {
      if (err instanceof Unauthorized) return false;
      out.textContent = String(err.message);
      return false;
    }
    current.refresh();
    return true;
  }

  function approvalItem(current, stepId, step) {
    const reason = el("input", { type: "text", class: "reason", placeholder: "reason (optional)", "aria-label": `reason for ${stepId}` });
    const out = el("div", { class: "error-text", role: "alert" });
    const send = (approve) => reply(current, stepId, "approval", { approve, reason: reason.value || null }, out);
    return el("div", { class: "waiting-item", "data-step": stepId, "data-kind": "approval" },
      el("div", { class: "meta", text: `step ${stepId} waits for an approval` }),
      el("div", { class: "prompt", text: step.prompt || `Run step ${stepId}?` }),
      el("div", { class: "controls" },
        el("button", { type: "button", class: "approve", text: "Approve", onclick: () => send(true) }),
        el("button", { type: "button", class: "reject", text: "Reject", onclick: () => send(false) }),
        reason),
      out);
  }

  function inputItem(current, stepId, step) {
    const box = el("textarea", { class: "value", rows: "3", spellcheck: "false", placeholder: "a JSON value, e.g. 3 or \"yes\"", "aria-label": `value for ${stepId}` });
    const out = el("div", { class: "error-text", role: "alert" });
    const schema = el("div", { class: "meta schema" });
    api(`/runs/${encodeURIComponent(current.id)}/steps/${encodeURIComponent(stepId)}`).then(({ body }) => {
      if (body.input_schema) schema.textContent = `schema: ${JSON.stringify(body.input_schema)}`;
    }).catch(() => {});
    const send = () => {
      let value;
      try { value = JSON.parse(box.value); } catch (err) { out.textContent = `not valid JSON: ${err.message}`; return; }
      reply(current, stepId, "input", { value }, out);
    };
    return el("div", { class: "waiting-item", "data-step": stepId, "data-kind": "input" },
      el("div", { class: "meta", text: `step ${stepId} waits for a value` }),
      el("div", { class: "prompt", text: step.prompt || `A value for ${stepId}` }),
      schema,
      el("div", { class: "controls" }, box,
        el("button", { type: "button", class: "send", text: "Send", onclick: send })),
      out);
  }

  // -- one step's panel: inputs, output, attempts, errors ---------------------------------------------------------
  function openStep(current, stepId) {
    current.step = stepId;
    current.fullOutput = false;
    for (const node of document.querySelectorAll("#dag .node")) {
      node.classList.toggle("selected", node.dataset.step === stepId);
    }
    $("step-panel").hidden = false;
    $("step-title").textContent = stepId;
    refreshStep(current);
  }

  function closeStep() {
    if (view) view.step = null;
    $("step-panel").hidden = true;
    for (const node of document.querySelectorAll("#dag .node.selected")) node.classList.remove("selected");
  }

  async function refreshStep(current) {
    const stepId = current.step;
    if (!stepId) return;
    const path = `/runs/${encodeURIComponent(current.id)}/steps/${encodeURIComponent(stepId)}`;
    let detail;
    try {
      ({ body: detail } = await api(current.fullOutput ? `${path}?full=true` : path));
    } catch (err) {
      if (err instanceof Unauthorized || view !== current || current.step !== stepId) return;
      $("step-error").hidden = false;
      $("step-error").textContent = String(err.message);
      return;
    }
    if (view !== current || current.step !== stepId) return;
    renderStep(detail);
  }

  const pretty = (value) => JSON.stringify(value, null, 2);
  const isMarker = (value) => value !== null && typeof value === "object" && value.truncated === true
    && typeof value.bytes === "number" && typeof value.sha256 === "string";

  function renderStep(detail) {
    $("step-title").textContent = detail.step;
    $("step-tool").textContent = detail.tool;
    const badge = $("step-status");
    badge.textContent = detail.status;
    badge.className = `badge status-${detail.status}`;
    $("step-error").hidden = !detail.error;
    $("step-error").textContent = detail.error ? `${detail.error_kind ? `${detail.error_kind}: ` : ""}${detail.error}` : "";
    $("step-args").textContent = pretty(detail.args);
    $("step-args-note").textContent = detail.args_resolved ? "" : "(as written: some references are not resolved yet)";
    const output = detail.output;
    const truncated = isMarker(output);
    if (truncated) {
      $("step-output").textContent = `(${output.bytes.toLocaleString()} bytes, sha256 ${output.sha256})`;
      $("step-output-note").textContent = "(too big to show at once)";
    } else if (detail.status === "succeeded") {
      $("step-output").textContent = pretty(output);
      $("step-output-note").textContent = "";
    } else {
      $("step-output").textContent = `(none: the step is ${detail.status})`;
      $("step-output-note").textContent = "";
    }
    $("step-output-full").hidden = !truncated;
    const rows = (detail.attempts || []).map((a) => el("tr", { "data-attempt": a.attempt },
      el("td", { text: String(a.attempt) }),
      el("td", {}, el("span", { class: `badge status-${a.outcome}`, text: a.outcome })),
      el("td", { text: formatInstant(a.started_at) }),
      el("td", { text: a.finished_at !== null && a.finished_at !== undefined ? formatDuration(a.finished_at - a.started_at) : "—" }),
      el("td", { class: "error", text: a.error ? `${a.error_kind ? `${a.error_kind}: ` : ""}${a.error}` : "" })));
    $("step-attempts").querySelector("tbody").replaceChildren(
      ...(rows.length ? rows : [el("tr", {}, el("td", { colspan: "5", class: "muted", text: "Not started." }))]));
  }

  // -- the timeline of step attempts ----------------------------------------------------------------------------
  function renderTimeline() {
    const current = view;
    if (!current) return;
    const container = $("gantt");
    const order = current.plan ? current.plan.steps.map((s) => s.id) : [];
    for (const step of current.attempts.keys()) if (!order.includes(step)) order.push(step);
    const rows = order.filter((id) => current.attempts.has(id));
    const critical = new Set(criticalPath(current).steps);
    if (!rows.length || current.startedAt === null) {
      container.replaceChildren(el("p", { class: "muted", text: "No step has started yet." }));
      return;
    }
    const running = current.summary && current.summary.status === "running";
    const t0 = current.startedAt;
    let t1 = current.summary && current.summary.finished_at !== null && current.summary.finished_at !== undefined
      ? current.summary.finished_at : current.lastAt;
    const now = nowFor(t0);
    if (running && now !== null) t1 = Math.max(t1, now);
    for (const attempts of current.attempts.values()) for (const a of attempts) if (a.end !== null) t1 = Math.max(t1, a.end);
    const span = Math.max(t1 - t0, 1e-3);
    const LABEL = 150, ROW = 22, PAD = 8, AXIS = 20;
    const width = Math.max(container.clientWidth - 2, 600);
    const plotW = width - LABEL - PAD * 2;
    const height = AXIS + rows.length * ROW + PAD;
    const x = (t) => LABEL + PAD + ((t - t0) / span) * plotW;
    const root = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": "timeline of step attempts" });
    // Ticks at nice times from the run's start (as the forecast's histogram), at most six.
    const every = TIME_STEPS.find((s) => span / s <= 6) || Math.ceil(span / 6 / 86400) * 86400;
    for (let d = 0; d <= span + 1e-9; d += every) {
      const at = x(t0 + d);
      const anchor = d === 0 ? "start" : at > LABEL + PAD + plotW - 30 ? "end" : "middle";
      root.append(svg("line", { x1: at, x2: at, y1: AXIS - 4, y2: height, class: "grid" }));
      root.append(svg("text", { x: at, y: 12, class: "tick", "text-anchor": anchor, text: formatTick(d) }));
    }
    rows.forEach((id, i) => {
      const y = AXIS + i * ROW;
      root.append(svg("text", { x: 4, y: y + 15, class: `row-label${critical.has(id) ? " critical" : ""}`,
        text: id.length > 20 ? `${id.slice(0, 19)}…` : id }));
      for (const a of current.attempts.get(id)) {
        const end = a.end !== null ? a.end : running && now !== null ? now : t1;
        const bar = svg("rect", {
          x: x(a.start), y: y + 4, width: Math.max(x(end) - x(a.start), 2), height: ROW - 8, rx: 3,
          class: `bar outcome-${a.outcome}${a.speculative ? " speculative" : ""}`, "data-step": id,
          "data-critical": critical.has(id) ? "true" : null,
          "data-attempt": a.attempt,
        });
        const how = a.speculative ? " (started speculatively, adopted)" : "";
        bar.append(svg("title", { text: `${id} attempt ${a.attempt}: ${a.outcome}${how}, ${formatDuration(end - a.start)}` }));
        root.append(bar);
      }
    });
    container.replaceChildren(root);
  }

  function renderErrors(current) {
    const list = $("errors");
    if (!current.errors.length) { list.replaceChildren(el("p", { class: "muted", text: "None." })); return; }
    list.replaceChildren(...current.errors.map((e) => {
      const where = e.step ? `step ${e.step}${e.attempt ? ` · attempt ${e.attempt}` : ""}` : "run";
      const retry = e.final === false && e.retryIn !== undefined ? ` · retry in ${formatDuration(e.retryIn)}` : "";
      return el("div", { class: e.escalation ? "error-item escalation" : "error-item" },
        el("div", { class: "meta", text: `${where} · ${e.kind || "error"}${retry} · ${formatInstant(e.at)}` }),
        el("pre", { text: e.text }));
    }));
  }

  function tick() {
    if (view && view.summary && view.summary.status === "running") {
      $("run-duration").textContent = formatDuration(runDuration(view.summary));
      renderTimeline();
    }
    if ([...runs.values()].some((r) => r.status === "running")) renderRuns();
  }

  // -- actions --------------------------------------------------------------------------------------------------
  async function submitRun(event) {
    event.preventDefault();
    const text = $("plan-input").value.trim();
    const out = $("submit-error");
    out.replaceChildren();
    if (!text) { out.textContent = "Write a plan first."; return; }
    let body;
    if (text.startsWith("{")) {
      try { body = { plan: JSON.parse(text) }; } catch (err) { out.textContent = `not valid JSON: ${err.message}`; return; }
    } else {
      body = { plan_yaml: text };
    }
    try {
      const { body: created } = await api("/runs", { method: "POST", body: JSON.stringify(body) });
      await refreshRuns();
      navigate(created.run_id);
    } catch (err) {
      if (err instanceof Unauthorized) return;
      const problems = (err.body && err.body.problems) || [];
      out.replaceChildren(el("p", { text: problems.length ? `${problems.length} problem(s):` : String(err.message) }),
        ...problems.map((p) => el("div", { text: `${[p.step && `step '${p.step}'`, p.field].filter(Boolean).join(", ")}: ${p.message}` })));
    }
  }

  async function runAction(action) {
    if (!view) return;
    const current = view;
    const body = action === "resume" ? { retry_unknown: $("resume-run").dataset.retryUnknown === "true" } : {};
    try {
      await api(`/runs/${encodeURIComponent(current.id)}/${action}`, { method: "POST", body: JSON.stringify(body) });
    } catch (err) {
      if (!(err instanceof Unauthorized)) alert(err.message);
      return;
    }
    if (action === "resume") selectRun(current.id); // a resumed run has a new stream (from the start: the timeline)
    else current.refresh();
  }

  $("dag").addEventListener("click", (event) => {
    const node = event.target.closest ? event.target.closest(".node") : null;
    if (node && view) openStep(view, node.dataset.step);
  });
  $("step-close").addEventListener("click", closeStep);
  $("step-output-full").addEventListener("click", () => {
    if (!view || !view.step) return;
    view.fullOutput = true;
    refreshStep(view);
  });

  $("version-select").addEventListener("change", (event) => {
    if (!view || !view.plan) return;
    const chosen = Number(event.target.value);
    view.version = chosen === view.plan.current_version ? null : chosen;
    refreshRun(view);
  });

  $("login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    token = $("token-input").value.trim();
    if (!token) return;
    localStorage.setItem(TOKEN_KEY, token);
    $("token-input").value = "";
    start();
  });
  $("logout").addEventListener("click", () => showLogin(""));
  $("runs-status").addEventListener("change", () => { runs = new Map(); refreshRuns(); });
  $("runs-more").addEventListener("click", moreRuns);
  $("memory-status").addEventListener("change", () => loadMemory());
  $("memory-refresh").addEventListener("click", () => loadMemory());
  $("submit-form").addEventListener("submit", submitRun);
  $("cancel-run").addEventListener("click", () => runAction("cancel"));
  $("resume-run").addEventListener("click", () => runAction("resume"));
  window.addEventListener("hashchange", route);

  // A token in the fragment (#token=...) never reaches the server or its logs: take it and remove it.
  const fromFragment = location.hash.match(/^#token=([^&]+)$/);
  if (fromFragment) {
    token = decodeURIComponent(fromFragment[1]);
    localStorage.setItem(TOKEN_KEY, token);
    history.replaceState(null, "", location.pathname);
  }
  if (token) start(); else showLogin("");
})();
