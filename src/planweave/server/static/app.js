// planweave dashboard: plain JavaScript, no build step, nothing loaded from elsewhere (Cytoscape.js is vendored in
// static/vendor/ by scripts/vendor-dashboard.sh).
//
// Data flow: the runs list comes from GET /runs and stays current through the global event stream (GET /events,
// followed from the list's X-Journal-Position). A selected run's state (GET /runs/{id}) is re-read when its event
// stream (GET /runs/{id}/events) says something happened, and only the drawn nodes whose status changed are updated;
// its plan graph (GET /runs/{id}/plan) is re-read, and the graph rebuilt, only on a new plan version. The plan is drawn
// by Cytoscape.js on a canvas, laid out in layers from the plan's depths (dagre for small graphs), collapsed by layer
// above 500 steps. The timeline, the model calls and the errors are built from the events themselves; the step list
// and the timeline draw only the rows in view. Clicking a step opens its panel beside the graph
// (GET /runs/{id}/steps/{step}: inputs, output, attempts, errors), re-read when an event of that step arrives. Streams
// are read with fetch() so that they can carry the Authorization header (EventSource cannot), and resume with
// Last-Event-ID after a disconnect.
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
      else if (k === "style") node.style.cssText = v; // through the CSSOM: the server's CSP refuses style attributes
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
      else if (k === "style") node.style.cssText = v;
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
            // Frames are cut at an index and the rest kept once per chunk: a replay of thousands of events arrives
            // in big chunks, and re-slicing the buffer per frame was quadratic (seconds at 2,000 events).
            let from = 0;
            let end;
            while ((end = buffer.indexOf("\n\n", from)) >= 0) {
              const frame = buffer.slice(from, end);
              from = end + 2;
              const parsed = parseFrame(frame);
              if (parsed) {
                if (parsed.id) last = Number(parsed.id);
                onEvent(parsed.event, parsed.data, last);
              }
            }
            buffer = buffer.slice(from);
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
    // The run in the address loads at once, beside the runs list (a busy server answers the list slowly).
    if (location.hash.startsWith("#/runs/")) route();
    try {
      await loadRuns();
    } catch (err) {
      if (!(err instanceof Unauthorized)) $("login-error").textContent = String(err.message || err);
      return;
    }
    ticker = setInterval(tick, 1000); // only redraws what depends on the clock (running durations, open bars)
    loadCapabilities();
    route();
  }

  // -- the workers of a queue (serve --queue) ----------------------------------------------------------------------
  // GET /workers: which worker runs what, and the age of each lease. Leases age with time, not with events, so the
  // panel is re-read every few seconds; a server without a queue answers 404 and the panel stays hidden.
  let workersTimer = null;

  // GET /capabilities: whether this server plans goals (the goal form shows) and has a queue (the workers panel).
  async function loadCapabilities() {
    let body;
    try {
      ({ body } = await api("/capabilities"));
    } catch (err) {
      return;
    }
    $("submit-kind").hidden = !body.goals;
    if (!body.goals) setSubmitKind("plan");
    if (body.queue) loadWorkers();
  }

  function setSubmitKind(kind) {
    for (const radio of document.querySelectorAll('#submit-kind input[name="kind"]')) radio.checked = radio.value === kind;
    $("plan-box").hidden = kind !== "plan";
    $("goal-box").hidden = kind !== "goal";
  }

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

  // A child run (a sub-plan) is listed under its parent when the parent is listed, folded until the parent's row is
  // opened. Only an id with a dot can be a child's (planning/subplans.py names it PARENT.STEP): its parent is read
  // once from GET /runs/{id}/subplans, as runtree.child_ids does, so that a run merely named "a.b" stays at the top.
  const openParents = new Set();
  const parents = new Map(); // run id -> its parent's id, or null for a root; absent: not read yet
  const parentsAsked = new Set();
  const rerenderRuns = throttle(async () => renderRuns(), 100);

  function parentOf(runId) {
    if (!runId.includes(".")) return null;
    if (parents.has(runId)) {
      const parent = parents.get(runId);
      return parent !== null && runs.has(parent) ? parent : null;
    }
    if (!parentsAsked.has(runId)) {
      parentsAsked.add(runId);
      api(`/runs/${encodeURIComponent(runId)}/subplans`).then(({ body }) => {
        parents.set(runId, body.parent ? body.parent.run : null);
        if (body.parent) rerenderRuns();
      }).catch(() => { parentsAsked.delete(runId); });
    }
    return null;
  }

  function renderRuns() {
    const tbody = $("runs").querySelector("tbody");
    const children = new Map();
    const roots = [];
    for (const run of runs.values()) {
      const parent = parentOf(run.run_id);
      if (parent === null) roots.push(run);
      else { if (!children.has(parent)) children.set(parent, []); children.get(parent).push(run); }
    }
    const rows = [];
    const add = (run, depth) => {
      const kids = children.get(run.run_id) || [];
      const open = openParents.has(run.run_id) || (view && view.id.startsWith(`${run.run_id}.`));
      const fold = kids.length ? el("button", { type: "button", class: "link fold", title: `${kids.length} sub-plan run(s)`,
        text: `${open ? "▾" : "▸"}${kids.length}`, onclick: (event) => {
          event.stopPropagation();
          if (openParents.has(run.run_id)) openParents.delete(run.run_id); else openParents.add(run.run_id);
          renderRuns();
        } }) : null;
      const row = el("tr", { class: depth ? "run-row child-run" : "run-row", "data-run": run.run_id,
        "data-parent": depth ? parentOf(run.run_id) : null, onclick: () => navigate(run.run_id) },
        el("td", { class: "id", title: run.plan ? `${run.run_id} (${run.plan})` : run.run_id,
          style: depth ? `padding-left:${4 + depth * 14}px` : null }, fold, run.run_id),
        el("td", {}, el("span", { class: `badge status-${run.status}`, text: run.status }),
          Object.keys(run.waiting || {}).length
            ? el("span", { class: "badge status-waiting_approval waiting-badge", title: Object.keys(run.waiting).join(", "),
              text: `${Object.keys(run.waiting).length} waiting` })
            : null),
        el("td", { class: "duration", text: formatDuration(runDuration(run)) }),
        el("td", { text: formatCost(run.cost_usd) }));
      if (view && view.id === run.run_id) row.classList.add("selected");
      rows.push(row);
      if (open) for (const kid of kids) add(kid, depth + 1);
    };
    for (const run of roots) add(run, 0);
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
    if (view && view.cy) view.cy.destroy();
    view = {
      id: runId,
      summary: null,
      plan: null,
      planStale: true, // the plan's shape must be (re-)read: first load, a new plan version, another version chosen
      shape: null, // planShape(plan)
      graph: null, // what is drawn: shownGraph()
      cy: null, // the Cytoscape instance of this run
      status: new Map(), // step -> its status, as last drawn
      collapse: $("collapse-mode").value, // none, layer, version
      expanded: new Set(), // groups opened while collapsed
      viewSet: false,
      version: null, // null: follow the current version
      attempts: new Map(), // step -> [{attempt, start, end, outcome}]
      finishedAt: new Map(), // step -> when its last outcome (succeeded, failed, cancelled after it started) came
      modelCalls: new Map(), // purpose -> [{purpose, model, step, tokens, cost, start, end}]
      latestEnd: null,
      errors: [],
      startedAt: null,
      lastAt: null,
      finished: false,
      stream: null,
      step: null, // the step whose panel is open
      group: null, // the collapsed group whose panel is open
      subplanRuns: new Map(), // a plan step -> its child run (GET /runs/{id}/subplans)
      subExpanded: new Set(), // plan steps whose child run is drawn inside the graph (collapsed by default)
      childPlans: new Map(), // child run -> its plan (GET /runs/{child}/plan), read when expanded
      childNodes: new Map(), // drawn node id of a child's step -> {run, step}
    };
    const current = view;
    current.stepRefresh = throttle(() => refreshStep(current), 200);
    // Each refresh re-reads the run's state (and its graph when its shape changed): slower for big plans.
    current.refresh = throttle(() => refreshRun(current), 250);
    current.redraw = throttle(async () => { if (view === current) { renderTimeline(); renderModelTotals(current); } }, 150);
    $("no-run").hidden = true;
    $("run").hidden = false;
    $("run-title").textContent = runId;
    $("run-plan").textContent = "";
    $("errors").replaceChildren(el("p", { class: "muted", text: "None." }));
    $("gantt-body").replaceChildren();
    $("gantt-axis").replaceChildren();
    $("step-panel").hidden = true;
    $("waiting").hidden = true;
    $("forecast").hidden = true;
    $("attention").hidden = true;
    delete $("attention").dataset.key;
    $("waiting-list").replaceChildren();
    delete $("waiting-list").dataset.key;
    $("step-list").querySelector(".vspace").replaceChildren();
    $("run-models").textContent = "—";
    $("model-totals").textContent = "";
    renderRuns();
    refreshRun(current);
    current.stream = openStream(`/runs/${encodeURIComponent(runId)}/events`, 0, (kind, event) => {
      if (view !== current) return;
      if (kind === "run_finished") current.finished = true;
      else if (kind === "run_created" || kind === "run_resumed") current.finished = false;
      if (kind === "plan_version") current.planStale = true;
      applyEvent(current, kind, event);
      // The replayed events of an ended run change nothing its summary does not already say: re-read it only while
      // the run goes, and once its end is replayed (the critical path as run needs every step's finish).
      const ended = current.summary && current.summary.status !== "running";
      if (!ended || ["run_finished", "run_resumed", "run_created", "plan_version"].includes(kind)) current.refresh();
      current.redraw();
      if (current.step && (event.step === current.step || kind === "run_finished")) current.stepRefresh();
    }, () => current.finished || view !== current);
  }

  // Ends the open attempts of the steps in `only` (all steps when it is not given): an event of one step touches that
  // step only, so that replaying a 10,000-step run's events stays linear.
  function closeOpenAttempts(current, at, outcome, only) {
    const steps = only ? only.filter((step) => current.attempts.has(step)) : [...current.attempts.keys()];
    for (const step of steps) {
      const attempts = current.attempts.get(step);
      const last = attempts[attempts.length - 1];
      if (last && last.end === null) {
        last.end = at;
        last.outcome = outcome;
        current.latestEnd = Math.max(current.latestEnd ?? at, at);
      }
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
      case "model_call": {
        // A planner's, joiner's or llm step's call: on the timeline with its tokens and cost (none: unknown).
        const purpose = data.purpose || "call";
        const tokens = data.prompt_tokens === undefined && data.completion_tokens === undefined ? null
          : (data.prompt_tokens || 0) + (data.completion_tokens || 0);
        const start = typeof data.started_at === "number" ? data.started_at : at;
        const end = typeof data.finished_at === "number" ? data.finished_at : at;
        if (!current.modelCalls.has(purpose)) current.modelCalls.set(purpose, []);
        current.modelCalls.get(purpose).push({ purpose, model: data.model || null, step: data.step || step || null,
          tokens, cost: typeof data.cost_usd === "number" ? data.cost_usd : null, start, end });
        current.latestEnd = Math.max(current.latestEnd || end, end);
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

  // Re-reads the run's summary, and its plan only when its shape may have changed; what is drawn is updated in place.
  async function refreshRun(current) {
    const base = `/runs/${encodeURIComponent(current.id)}`;
    const planPath = current.version ? `${base}/plan?version=${current.version}` : `${base}/plan`;
    const wantPlan = current.planStale;
    current.planStale = false;
    let summary;
    let plan = null;
    try {
      [summary, plan] = await Promise.all([api(`${base}?outputs=false`), wantPlan ? api(planPath) : null]);
    } catch (err) {
      if (wantPlan) current.planStale = true;
      if (err instanceof Unauthorized || view !== current) return;
      if (err.status === 404 && !current.summary) {
        $("run-error").hidden = false;
        $("run-error").textContent = String(err.message);
      }
      return;
    }
    if (view !== current) return;
    current.summary = summary.body;
    const steps = Object.keys(summary.body.steps || {}).length;
    if (steps > 300 && !current.slowed) {
      current.slowed = true;
      current.refresh = throttle(() => refreshRun(current), 1000);
    }
    renderHeader(current);
    if (plan) {
      current.plan = plan.body;
      current.shape = planShape(plan.body);
      if (!current.viewSet && plan.body.steps.length > AUTO_COLLAPSE && current.collapse === "none") {
        current.collapse = "layer";
        $("collapse-mode").value = "layer";
      }
      // An earlier version shows the statuses its steps had when it was replaced.
      current.status = new Map(plan.body.steps.map((step) => [step.id, step.status]));
      $("run-plan").textContent = plan.body.name || plan.body.goal || "";
      renderVersions(current);
      buildDag(current);
      api(`${base}/subplans`).then(({ body }) => renderSubplans(current, body)).catch(() => {});
    }
    if (!current.plan) return;
    const changed = current.version ? [] : applyStatuses(current);
    markCritical(current);
    renderAttention(current);
    if (current.group) renderGroup(current);
    if (current.subExpanded.size && !current.childRefreshing) {
      current.childRefreshing = true;
      refreshChildren(current).finally(() => { current.childRefreshing = false; });
    }
    if (changed.length || plan) {
      if ($("dag-search").value.trim()) markMatches(current); else renderStepList(current);
      redrawMinimapDots();
    }
    followFrontier(current);
    renderTimeline();
    renderModelTotals(current);
  }

  // -- sub-plans: the parent of a child run, and the tree of a run's child runs (docs/subplans.md) ---------------
  function renderSubplans(current, tree) {
    if (view !== current) return;
    const known = current.subplanRuns.size;
    for (const child of tree.children) current.subplanRuns.set(child.step, child.run);
    if (current.subplanRuns.size !== known) markSubplans(current);
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
      details.addEventListener("toggle", () => { current.subplansOpen = details.open; if (current.cy) current.cy.resize(); });
      items.push(details);
    }
    const box = $("run-subplans");
    const shown = !box.hidden;
    box.hidden = !items.length;
    box.replaceChildren(...items);
    // The box sits above the graph: shown, it moves the canvas, and Cytoscape maps clicks from where the canvas was
    // until told (a tap on a node missed it by the box's height).
    if (current.cy && shown !== !box.hidden) current.cy.resize();
  }

  // -- a plan step's child run drawn inside the parent's graph: a group after the step, collapsed by default --------
  // The plan steps with a child run show it in their label (▸ collapsed, ▾ expanded).
  function markSubplans(current) {
    if (!current.cy) return;
    current.cy.batch(() => {
      for (const stepId of current.subplanRuns.keys()) {
        const node = current.cy.getElementById(stepId);
        const step = current.shape && current.shape.byId.get(stepId);
        if (node.nonempty() && step) node.data("label", stepLabel(step, current));
      }
    });
    if (current.step && current.subplanRuns.has(current.step)) renderStepModels(current, current.step);
  }

  async function toggleSubplan(current, stepId) {
    const childRun = current.subplanRuns.get(stepId);
    if (!childRun) return;
    if (current.subExpanded.has(stepId)) {
      current.subExpanded.delete(stepId);
      if (current.childNodes.has(current.step)) closeStep();
      buildDag(current);
      return;
    }
    // The step's collapsed group (if it is in one) opens first: the child is drawn after the step's own node.
    const g = groupOf(current, stepId);
    if (g !== null) current.expanded.add(g);
    current.subExpanded.add(stepId);
    await loadChildPlan(current, childRun);
    if (view !== current || !current.subExpanded.has(stepId)) return;
    buildDag(current);
    const box = current.cy.getElementById(`subplan:${childRun}`); // the step and its child's steps in view
    if (box.nonempty()) current.cy.center(box.union(current.cy.getElementById(stepId)));
  }

  async function loadChildPlan(current, childRun) {
    try {
      const { body } = await api(`/runs/${encodeURIComponent(childRun)}/plan`);
      current.childPlans.set(childRun, body);
    } catch (err) {
      if (err instanceof Unauthorized) return;
      current.childPlans.set(childRun, { error: String(err.message), steps: [] });
    }
  }

  // Adds the expanded child runs to the drawn graph: a compound node after its plan step, holding the child's steps
  // laid out in layers below it (node ids `sub:RUN/STEP`; their panels read the child run's steps).
  function addSubplanGroups(current) {
    const cy = current.cy;
    current.childNodes = new Map();
    const elements = [];
    for (const stepId of current.subExpanded) {
      const childRun = current.subplanRuns.get(stepId);
      const plan = childRun && current.childPlans.get(childRun);
      const anchor = cy.getElementById(stepId);
      if (!plan || anchor.empty()) continue;
      const groupId = `subplan:${childRun}`;
      elements.push({ group: "nodes", data: { id: groupId, label: plan.error ? `${childRun}: ${plan.error}` : `sub-plan ${childRun} · ${plan.steps.length} steps`, step: stepId },
        classes: "subplan-group" });
      const base = anchor.position();
      const shape = planShape(plan);
      const rows = new Map();
      for (const step of plan.steps) {
        const d = shape.depth.get(step.id);
        const row = rows.get(d) || 0;
        rows.set(d, row + 1);
        const id = `sub:${childRun}/${step.id}`;
        current.childNodes.set(id, { run: childRun, step: step.id, tool: step.tool });
        elements.push({ group: "nodes", data: { id, parent: groupId, label: stepLabel(step), status: step.status, tool: step.tool },
          position: { x: base.x + d * X_GAP * 0.9, y: base.y + (row + 1.6) * Y_GAP }, classes: "child-step" });
      }
      for (const step of plan.steps) {
        for (const dep of step.deps) {
          elements.push({ group: "edges", data: { id: `e:sub:${childRun}/${dep}>${step.id}`, source: `sub:${childRun}/${dep}`, target: `sub:${childRun}/${step.id}` } });
        }
      }
      elements.push({ group: "edges", data: { id: `e:${stepId}>${groupId}`, source: stepId, target: groupId }, classes: "subplan-edge" });
    }
    if (elements.length) cy.add(elements);
  }

  // A live child run's statuses follow the parent's refreshes (its plan re-read while it has not ended).
  async function refreshChildren(current) {
    for (const stepId of current.subExpanded) {
      const childRun = current.subplanRuns.get(stepId);
      const plan = childRun && current.childPlans.get(childRun);
      if (!plan || plan.error || plan.steps.every((s) => ENDED_STEP.includes(s.status))) continue;
      await loadChildPlan(current, childRun);
      if (view !== current || !current.cy) return;
      const fresh = current.childPlans.get(childRun);
      if (fresh.steps.length !== plan.steps.length) { buildDag(current); return; }
      current.cy.batch(() => {
        for (const step of fresh.steps) current.cy.getElementById(`sub:${childRun}/${step.id}`).data("status", step.status);
      });
    }
  }
  const ENDED_STEP = ["succeeded", "failed", "cancelled", "skipped"];

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

  // -- the DAG: Cytoscape.js (canvas), laid out in layers ------------------------------------------------------------
  // Layout: dagre for small graphs; above DAGRE_MAX shown nodes the positions come from the plan's depths (a step's
  // layer is its longest chain of dependencies, its row the mean row of its dependencies): linear time, where dagre
  // took 2.2 s at 1,000 steps and overflowed its stack at 3,000 (docs/benchmarks.md).
  // Live updates change node data and classes only (statuses, the critical path); the elements are rebuilt when the
  // plan's shape changes (a new version, a collapse or an expand), never per event.
  const DAGRE_MAX = 60;
  const LARGE = 400; // above this many shown nodes: straight edges, no edges while moving, labels only when readable
  const X_GAP = 210, Y_GAP = 56, NODE_W = 170, NODE_H = 36;
  const COLORS = {
    pending: "#c9ced6", ready: "#8ab4f8", running: "#f5a524", succeeded: "#2f9e44", failed: "#e03131",
    cancelled: "#868e96", skipped: "#e9ecef", unknown: "#9c36b5", waiting_approval: "#fab005", waiting_input: "#fab005",
  };
  const WAITING = ["waiting_approval", "waiting_input"];

  function dagStyle(large) {
    const style = [
      { selector: "node", style: {
        shape: "round-rectangle", width: NODE_W, height: NODE_H, "background-color": COLORS.pending,
        "border-width": 1, "border-color": "#495057", label: "data(label)", "font-size": 11, color: "#1f2329",
        "text-valign": "center", "text-halign": "center", "text-wrap": "wrap", "text-max-width": NODE_W - 10,
        "min-zoomed-font-size": large ? 6 : 0 } },
      { selector: "node.group", style: { shape: "round-rectangle", width: NODE_W + 20, height: NODE_H + 22,
        "border-width": 2, "border-style": "double", "border-color": "#3b5bdb", "background-color": "#eef2ff" } },
      { selector: "node.group.has-failed", style: { "background-color": "#ffe3e3" } },
      { selector: "node.group.has-waiting", style: { "background-color": "#fff3bf" } },
      { selector: "node.group.has-running", style: { "border-color": COLORS.running } },
      { selector: "node.subplan", style: { "border-style": "double", "border-width": 4 } },
      { selector: "node.subplan-group", style: { shape: "round-rectangle", "background-color": "#f1f3f5", "background-opacity": 0.6,
        "border-style": "dashed", "border-width": 2, "border-color": "#7048e8", "text-valign": "top", "text-halign": "center",
        "font-size": 11, color: "#5f3dc4", padding: 12 } },
      { selector: "edge.subplan-edge", style: { "line-style": "dashed", "line-color": "#7048e8", "target-arrow-color": "#7048e8" } },
      { selector: "edge", style: { width: 1.4, "line-color": "#adb5bd", "curve-style": large ? "haystack" : "bezier",
        "target-arrow-shape": large ? "none" : "triangle", "target-arrow-color": "#adb5bd", "arrow-scale": 0.8 } },
      { selector: "edge.critical", style: { width: 3, "line-color": "#d9480f", "target-arrow-color": "#d9480f", "z-index": 2 } },
      { selector: "node.critical", style: { "border-width": 4, "border-color": "#d9480f" } },
      { selector: "node.match", style: { "underlay-color": "#3b5bdb", "underlay-opacity": 0.35, "underlay-padding": 8 } },
      { selector: "node:selected", style: { "border-width": 5, "border-color": "#111", "overlay-opacity": 0 } },
    ];
    for (const [status, color] of Object.entries(COLORS)) {
      const light = ["pending", "ready", "skipped", "running", "waiting_approval", "waiting_input"].includes(status);
      style.push({ selector: `node[status = "${status}"]`, style: { "background-color": color, color: light ? "#1f2329" : "#fff" } });
    }
    style.push({ selector: 'node[status = "skipped"]', style: { "border-style": "dashed" } });
    return style;
  }

  // The plan's shape, computed once per plan: each step's depth (longest chain of dependencies), the version that
  // added it, the number of layers and the band of layers a collapsed group holds.
  function planShape(plan) {
    const depth = new Map();
    for (const step of plan.steps) { // plan order is topological: dependencies come first
      let d = 0;
      for (const dep of step.deps) d = Math.max(d, (depth.get(dep) ?? -1) + 1);
      depth.set(step.id, d);
    }
    const addedIn = new Map();
    for (const v of plan.versions || []) for (const id of v.added || []) addedIn.set(id, v.version);
    let layers = 0;
    for (const d of depth.values()) layers = Math.max(layers, d + 1);
    const band = Math.max(1, Math.ceil(layers / LAYER_GROUPS));
    return { depth, addedIn, layers, band, byId: new Map(plan.steps.map((s) => [s.id, s])) };
  }

  // Collapsed by layer, a long plan's layers go in bands, so that at most LAYER_GROUPS groups are drawn.
  const LAYER_GROUPS = 120;
  const AUTO_COLLAPSE = 500; // plans above this many steps open collapsed by layer (1,000 nodes drawn took 1-2 s)

  function groupOf(current, id) {
    const mode = current.collapse;
    if (mode === "none") return null;
    let key;
    if (mode === "layer") {
      const band = current.shape.band;
      const first = Math.floor(current.shape.depth.get(id) / band) * band + 1;
      key = band === 1 ? `layer ${first}` : `layers ${first}–${Math.min(first + band - 1, current.shape.layers)}`;
    } else {
      key = `v${current.shape.addedIn.get(id) || 1}`;
    }
    return current.expanded.has(key) ? null : key;
  }

  // What is drawn: steps, and collapsed groups standing for their steps; edges between what is drawn, deduplicated.
  function shownGraph(current) {
    const plan = current.plan;
    const shape = current.shape;
    const rep = new Map(); // step -> the id of the node it is drawn as
    const nodes = new Map(); // id -> {id, depth, group, members}
    for (const step of plan.steps) {
      const g = groupOf(current, step.id);
      const id = g === null ? step.id : `group:${g}`;
      rep.set(step.id, id);
      const d = shape.depth.get(step.id);
      let node = nodes.get(id);
      if (!node) { node = { id, depth: d, group: g, members: [] }; nodes.set(id, node); }
      node.depth = Math.min(node.depth, d);
      node.members.push(step.id);
    }
    const edges = new Map();
    const preds = new Map();
    for (const step of plan.steps) {
      const to = rep.get(step.id);
      for (const dep of step.deps) {
        const from = rep.get(dep);
        if (from === undefined || from === to) continue;
        const key = `${from}>${to}`;
        if (edges.has(key)) continue;
        edges.set(key, { id: `e:${key}`, source: from, target: to, from: dep, to: step.id });
        if (!preds.has(to)) preds.set(to, []);
        preds.get(to).push(from);
      }
    }
    return { rep, nodes, edges, preds };
  }

  // Layered positions: x by depth, rows ordered by the mean row of their predecessors (one barycentre pass).
  // Depths with nothing drawn (inside a collapsed band of layers) take no room: columns are the depths drawn, in order.
  function layeredPositions(graph) {
    const depths = [...new Set([...graph.nodes.values()].map((node) => node.depth))].sort((a, b) => a - b);
    const column = new Map(depths.map((d, i) => [d, i]));
    const layers = [];
    for (const node of graph.nodes.values()) {
      const c = column.get(node.depth);
      (layers[c] = layers[c] || []).push(node.id);
    }
    const row = new Map();
    const pos = new Map();
    layers.forEach((layer, d) => {
      if (!layer) return;
      const weight = new Map(layer.map((id) => {
        const ps = (graph.preds.get(id) || []).filter((p) => row.has(p));
        return [id, ps.length ? ps.reduce((s, p) => s + row.get(p), 0) / ps.length : 0];
      }));
      if (d > 0) layer.sort((a, b) => weight.get(a) - weight.get(b));
      layer.forEach((id, j) => {
        row.set(id, j - (layer.length - 1) / 2);
        pos.set(id, { x: d * X_GAP, y: (j - (layer.length - 1) / 2) * Y_GAP });
      });
    });
    return pos;
  }

  function groupLabel(current, node) {
    const counts = {};
    for (const id of node.members) {
      const s = current.status.get(id) || "pending";
      counts[s] = (counts[s] || 0) + 1;
    }
    const parts = [];
    for (const s of ["failed", "waiting_approval", "waiting_input", "running", "succeeded"]) {
      if (counts[s]) parts.push(`${counts[s]} ${s.replace("waiting_", "waiting ")}`);
    }
    return { text: `${node.group} · ${node.members.length} steps\n${parts.join(" · ") || "pending"}`, counts };
  }

  function stepLabel(step, current = null) {
    const id = step.id.length > 24 ? `${step.id.slice(0, 23)}…` : step.id;
    const sub = current && step.tool === "plan" && current.subplanRuns.has(step.id)
      ? (current.subExpanded.has(step.id) ? " ▾ sub-plan" : " ▸ sub-plan") : "";
    return `${id}\n${step.tool}${sub}`;
  }

  function buildDag(current) {
    const plan = current.plan;
    const container = $("dag-canvas");
    $("dag-empty").hidden = plan.steps.length > 0;
    const graph = shownGraph(current);
    current.graph = graph;
    const large = graph.nodes.size > LARGE;
    if (!current.cy || current.cyLarge !== large) {
      if (current.cy) current.cy.destroy();
      current.cyLarge = large;
      current.cy = cytoscape({
        container, style: dagStyle(large), elements: [], minZoom: 0.01, maxZoom: 2.5,
        boxSelectionEnabled: false, pixelRatio: 1, hideEdgesOnViewport: large, textureOnViewport: false,
        wheelSensitivity: 0.4, autoungrabify: true,
      });
      const cy = current.cy;
      cy.on("tap", "node", (event) => {
        const id = event.target.id();
        if (id.startsWith("group:")) openGroup(current, id);
        else if (id.startsWith("subplan:")) return; // a child run's box (a tap on its step bubbles up to it too)
        else openStep(current, id, { center: false });
      });
      cy.on("viewport", () => current.minimapView && current.minimapView());
      current.minimapView = throttleFrame(() => drawMinimap(current, false));
    }
    const cy = current.cy;
    const elements = [];
    for (const node of graph.nodes.values()) {
      if (node.group !== null) {
        const { text, counts } = groupLabel(current, node);
        const classes = ["group"];
        if (counts.failed) classes.push("has-failed");
        if (counts.waiting_approval || counts.waiting_input) classes.push("has-waiting");
        if (counts.running) classes.push("has-running");
        elements.push({ group: "nodes", data: { id: node.id, label: text, status: "group" }, classes: classes.join(" ") });
      } else {
        const step = current.shape.byId.get(node.id);
        elements.push({ group: "nodes", data: { id: node.id, label: stepLabel(step, current), status: current.status.get(node.id) || step.status, tool: step.tool },
          classes: step.tool === "plan" ? "subplan" : "" });
      }
    }
    for (const edge of graph.edges.values()) {
      elements.push({ group: "edges", data: { id: edge.id, source: edge.source, target: edge.target } });
    }
    const useDagre = graph.nodes.size <= DAGRE_MAX && typeof cytoscapeDagre !== "undefined";
    const positions = useDagre ? null : layeredPositions(graph);
    if (positions) for (const e of elements) if (e.group === "nodes") e.position = positions.get(e.data.id);
    cy.batch(() => {
      cy.elements().remove();
      cy.add(elements);
    });
    if (useDagre) cy.layout({ name: "dagre", rankDir: "LR", nodeSep: 18, rankSep: 60, fit: false }).run();
    if (current.subExpanded.size) addSubplanGroups(current);
    markCritical(current);
    markMatches(current);
    if (current.step && cy.getElementById(current.step).nonempty()) cy.getElementById(current.step).select();
    if (!current.viewSet) { fitView(current); current.viewSet = true; }
    drawMinimap(current, true);
  }

  // Requests at most one call per animation frame.
  function throttleFrame(fn) {
    let queued = false;
    return () => {
      if (queued) return;
      queued = true;
      requestAnimationFrame(() => { queued = false; fn(); });
    };
  }

  // The box of the nodes' centres, widened by a node: from positions only (Cytoscape's own bounding box measures
  // every label, which took half a second at 1,000 steps).
  function nodesBox(cy) {
    let x1 = Infinity, y1 = Infinity, x2 = -Infinity, y2 = -Infinity;
    cy.nodes().forEach((node) => {
      const p = node.position();
      if (p.x < x1) x1 = p.x; if (p.x > x2) x2 = p.x;
      if (p.y < y1) y1 = p.y; if (p.y > y2) y2 = p.y;
    });
    if (x1 === Infinity) return null;
    x1 -= NODE_W; x2 += NODE_W; y1 -= NODE_H; y2 += NODE_H;
    return { x1, y1, x2, y2, w: x2 - x1, h: y2 - y1 };
  }

  function fitView(current) {
    const cy = current.cy;
    if (!cy) return;
    cy.resize(); // the page's layout may have changed since the graph was made (panels shown or hidden)
    const box = nodesBox(cy);
    if (!box) return;
    let zoom = Math.min(cy.width() / box.w, cy.height() / box.h, 1.2);
    let cx = (box.x1 + box.x2) / 2;
    // A long plan fitted whole is unreadable: start at its beginning, at a zoom where labels can be read.
    if (zoom < 0.35) {
      zoom = 0.5;
      cx = box.x1 + cy.width() / 2 / zoom;
    }
    cy.viewport({ zoom, pan: { x: cy.width() / 2 - cx * zoom, y: cy.height() / 2 - ((box.y1 + box.y2) / 2) * zoom } });
  }

  // The critical path as classes of its nodes and edges (and the key's words), updated in place.
  function markCritical(current) {
    const cy = current.cy;
    if (!cy) return;
    const path = criticalPath(current);
    const key = $("critical-key");
    key.textContent = path.actual ? "critical path (as run)" : "critical path (by estimates)";
    key.title = path.actual
      ? "The steps that determined when the run ended: from the last to finish, each one's latest-finishing dependency."
      : "The longest chain of steps by their estimated durations (a live run's path: estimates, not what happened).";
    $("dag").dataset.critical = path.actual ? "actual" : "estimated";
    const signature = `${path.actual}:${path.steps.join(",")}`;
    current.critical = new Set(path.steps);
    if (current.criticalSignature === signature && current.criticalDrawn === cy.elements().length) return;
    current.criticalSignature = signature;
    current.criticalDrawn = cy.elements().length;
    cy.batch(() => {
      cy.elements(".critical").removeClass("critical");
      const rep = current.graph.rep;
      for (let i = 0; i < path.steps.length; i++) {
        const node = cy.getElementById(rep.get(path.steps[i]) || path.steps[i]);
        node.addClass("critical");
        if (i > 0) {
          const a = rep.get(path.steps[i - 1]), b = rep.get(path.steps[i]);
          if (a !== b) cy.getElementById(`e:${a}>${b}`).addClass("critical");
        }
      }
    });
  }

  // Applies the run summary's step statuses to what is drawn: only the nodes whose status changed are touched.
  function applyStatuses(current) {
    const steps = (current.summary && current.summary.steps) || {};
    const changed = [];
    for (const [id, step] of Object.entries(steps)) {
      if (current.status.get(id) !== step.status) { current.status.set(id, step.status); changed.push(id); }
    }
    if (!changed.length || !current.cy || !current.graph) return changed;
    const cy = current.cy;
    const groups = new Set();
    cy.batch(() => {
      for (const id of changed) {
        const shown = current.graph.rep.get(id);
        if (shown === undefined) continue;
        if (shown === id) cy.getElementById(id).data("status", current.status.get(id));
        else groups.add(shown);
      }
      for (const gid of groups) {
        const node = current.graph.nodes.get(gid);
        const { text, counts } = groupLabel(current, node);
        const ele = cy.getElementById(gid);
        ele.data("label", text);
        ele.toggleClass("has-failed", !!counts.failed);
        ele.toggleClass("has-waiting", !!(counts.waiting_approval || counts.waiting_input));
        ele.toggleClass("has-running", !!counts.running);
      }
    });
    return changed;
  }

  // Keeps the running steps (else the ready or waiting ones) in view.
  function followFrontier(current) {
    if (!$("follow").checked || !current.cy) return;
    const cy = current.cy;
    const want = ["running", "ready", "waiting_approval", "waiting_input"];
    let frontier = null;
    for (const status of want) {
      const ids = [...current.status].filter(([, s]) => s === status).map(([id]) => current.graph.rep.get(id));
      if (ids.length) { frontier = cy.collection(ids.map((id) => cy.getElementById(id))); break; }
    }
    if (!frontier || frontier.empty()) return;
    const box = frontier.boundingBox();
    const ext = cy.extent();
    const inside = box.x1 >= ext.x1 && box.x2 <= ext.x2 && box.y1 >= ext.y1 && box.y2 <= ext.y2;
    if (inside) return;
    // As close as shows the whole frontier, at most 1:1, at least a zoom where a node is still a node.
    const zoom = Math.max(0.3, Math.min(1, (cy.width() - 40) / Math.max(box.w, 1), (cy.height() - 40) / Math.max(box.h, 1)));
    cy.viewport({ zoom, pan: { x: cy.width() / 2 - ((box.x1 + box.x2) / 2) * zoom, y: cy.height() / 2 - ((box.y1 + box.y2) / 2) * zoom } });
  }

  // -- the minimap: every node as a dot in its status colour, and the part of the plan in view ---------------------
  function drawMinimap(current, dotsChanged) {
    const cy = current.cy;
    const canvas = $("minimap");
    if (!cy || view !== current) return;
    const ctx = canvas.getContext("2d");
    const W = canvas.width, H = canvas.height;
    if (dotsChanged || !current.minimap) {
      const bb = nodesBox(cy);
      if (!bb) { ctx.clearRect(0, 0, W, H); current.minimap = null; return; }
      // Each axis scaled on its own: a long plan is far wider than tall, and would be a thin line otherwise.
      current.minimap = { bb, sx: (W - 8) / bb.w, sy: (H - 8) / bb.h };
    }
    const { bb, sx, sy } = current.minimap;
    if (dotsChanged || !current.minimapDots) {
      const dots = current.minimapDots || document.createElement("canvas");
      dots.width = W; dots.height = H;
      const dctx = dots.getContext("2d");
      dctx.fillStyle = "#fff";
      dctx.fillRect(0, 0, W, H);
      cy.nodes().forEach((node) => {
        const p = node.position();
        const s = node.data("status");
        dctx.fillStyle = s === "group" ? "#3b5bdb" : COLORS[s] || COLORS.pending;
        dctx.fillRect(4 + (p.x - bb.x1) * sx - 1, 4 + (p.y - bb.y1) * sy - 1, 3, 3);
      });
      current.minimapDots = dots;
    }
    ctx.drawImage(current.minimapDots, 0, 0);
    const ext = cy.extent();
    ctx.strokeStyle = "#3b5bdb";
    ctx.lineWidth = 1.5;
    ctx.strokeRect(4 + (ext.x1 - bb.x1) * sx, 4 + (ext.y1 - bb.y1) * sy, Math.max(ext.w * sx, 2), Math.max(ext.h * sy, 2));
  }
  const redrawMinimapDots = throttle(async () => { if (view) drawMinimap(view, true); }, 500);

  function minimapGo(event) {
    const current = view;
    if (!current || !current.cy || !current.minimap) return;
    const rect = $("minimap").getBoundingClientRect();
    const { bb, sx, sy } = current.minimap;
    const x = bb.x1 + (event.clientX - rect.left - 4) / sx;
    const y = bb.y1 + (event.clientY - rect.top - 4) / sy;
    const cy = current.cy;
    cy.pan({ x: cy.width() / 2 - x * cy.zoom(), y: cy.height() / 2 - y * cy.zoom() });
  }

  // -- search: by step id, tool:NAME or status:NAME; the matches are outlined and listed -----------------------------
  function searchMatches(current, text) {
    const query = text.trim().toLowerCase();
    if (!query || !current.plan) return null;
    const m = query.match(/^(tool|status|state):(.*)$/);
    const out = [];
    for (const step of current.plan.steps) {
      const status = current.status.get(step.id) || step.status;
      let hit;
      if (m && m[1] === "tool") hit = step.tool.toLowerCase().includes(m[2].trim());
      else if (m) hit = status.startsWith(m[2].trim());
      else hit = step.id.toLowerCase().includes(query) || step.tool.toLowerCase() === query || status === query;
      if (hit) out.push(step.id);
    }
    // An exact id first: Enter opens it.
    out.sort((a, b) => (b.toLowerCase() === query) - (a.toLowerCase() === query));
    return out;
  }

  function markMatches(current) {
    const cy = current.cy;
    const found = searchMatches(current, $("dag-search").value);
    current.matches = found;
    $("search-count").textContent = found === null ? "" : `${found.length} match${found.length === 1 ? "" : "es"}`;
    renderStepList(current);
    if (!cy) return;
    cy.batch(() => {
      cy.nodes(".match").removeClass("match");
      if (found) for (const id of found.slice(0, 2000)) cy.getElementById(current.graph.rep.get(id)).addClass("match");
    });
  }

  // Shows a step: expands its collapsed group if it is in one, selects it, centres it, opens its panel.
  function focusStep(current, stepId) {
    if (!current.plan || !current.shape.byId.has(stepId)) return;
    const g = groupOf(current, stepId);
    if (g !== null) { current.expanded.add(g); buildDag(current); }
    openStep(current, stepId, { center: true });
  }

  function openGroup(current, groupId) {
    const node = current.graph.nodes.get(groupId);
    if (!node) return;
    current.step = null;
    current.group = groupId;
    $("step-panel").hidden = false;
    current.cy.resize();
    current.cy.nodes(":selected").unselect();
    current.cy.getElementById(groupId).select();
    $("step-title").textContent = node.group;
    $("step-tool").textContent = `${node.members.length} steps`;
    $("step-status").textContent = "group";
    $("step-status").className = "badge";
    for (const id of ["step-args-box", "step-output-box", "step-error"]) $(id).hidden = true;
    $("step-attempts").hidden = true;
    $("step-links").textContent = "";
    $("step-models").textContent = "";
    const box = $("step-group");
    box.hidden = false;
    renderGroup(current);
  }

  function renderGroup(current) {
    const node = current.graph && current.graph.nodes.get(current.group);
    const box = $("step-group");
    if (!node) { box.replaceChildren(); return; }
    const waiting = node.members.filter((id) => WAITING.includes(current.status.get(id)));
    const failed = node.members.filter((id) => current.status.get(id) === "failed");
    const key = `${current.group}|${waiting.join(",")}|${failed.join(",")}`;
    if (box.dataset.key === key) return; // unchanged: keep what the person is typing
    box.dataset.key = key;
    const expand = el("button", { type: "button", class: "expand-group", text: "Expand this group",
      onclick: () => { current.expanded.add(node.group); current.group = null; box.hidden = true; buildDag(current); closeStep(); } });
    const steps = current.summary ? current.summary.steps || {} : {};
    box.replaceChildren(expand,
      waiting.length ? el("h4", { text: `Waiting for you (${waiting.length})` }) : null,
      ...waiting.map((id) => (current.status.get(id) === "waiting_approval"
        ? approvalItem(current, id, steps[id] || {}) : inputItem(current, id, steps[id] || {}))),
      failed.length ? el("h4", { text: `Failed (${failed.length})` }) : null,
      failed.length ? el("div", { class: "chips" }, ...failed.slice(0, 50).map((id) => chip(current, id, "failed"))) : null,
      el("h4", { text: "Steps" }),
      el("div", { class: "chips" }, ...node.members.slice(0, 200).map((id) => chip(current, id, current.status.get(id) || "pending"))),
      node.members.length > 200 ? el("p", { class: "muted", text: `and ${node.members.length - 200} more: search for them` }) : null);
  }

  function chip(current, id, status) {
    return el("button", { type: "button", class: `chip status-${status}`, "data-step": id, title: `${id}: ${status}`,
      text: id, onclick: () => focusStep(current, id) });
  }

  // Failed and waiting steps, above the graph: one click from their node.
  function renderAttention(current) {
    const failed = [], waiting = [];
    for (const [id, s] of current.status) {
      if (s === "failed") failed.push(id);
      else if (WAITING.includes(s)) waiting.push(id);
    }
    const box = $("attention");
    const key = `${failed.join(",")}|${waiting.join(",")}`;
    if (box.dataset.key === key) return;
    box.dataset.key = key;
    box.hidden = !failed.length && !waiting.length;
    const MAX = 12;
    const group = (label, ids, status) => (ids.length ? el("div", { class: "attention-group", "data-kind": status },
      el("span", { class: "attention-label", text: `${label} (${ids.length})` }),
      ...ids.slice(0, MAX).map((id) => chip(current, id, current.status.get(id))),
      ids.length > MAX ? el("button", { type: "button", class: "link", text: `all ${ids.length}…`,
        onclick: () => { $("dag-search").value = `status:${status}`; markMatches(current); } }) : null) : null);
    box.replaceChildren(...[group("failed", failed, "failed"), group("waiting", waiting, "waiting")].filter(Boolean));
  }

  // -- the steps, as a virtual list: only the rows in view are in the page ------------------------------------------
  const LIST_ROW = 24;

  function renderStepList(current) {
    const box = $("step-list");
    const ids = current.matches || (current.plan ? current.plan.steps.map((s) => s.id) : []);
    current.listIds = ids;
    $("step-list-count").textContent = current.matches ? `(${ids.length} of ${current.plan.steps.length})` : `(${ids.length})`;
    const space = box.querySelector(".vspace");
    space.style.height = `${ids.length * LIST_ROW}px`;
    const first = Math.max(0, Math.floor(box.scrollTop / LIST_ROW) - 5);
    const last = Math.min(ids.length, first + Math.ceil((box.clientHeight || 240) / LIST_ROW) + 10);
    const rows = [];
    for (let i = first; i < last; i++) {
      const id = ids[i];
      const step = current.shape.byId.get(id);
      const status = current.status.get(id) || "pending";
      const attempts = current.attempts.get(id) || [];
      const a = attempts[attempts.length - 1];
      const took = a && a.end !== null ? formatDuration(a.end - a.start) : a ? "running" : "—";
      rows.push(el("div", { class: `list-row${id === current.step ? " selected" : ""}`, role: "listitem", "data-step": id,
        style: `top:${i * LIST_ROW}px`, onclick: () => focusStep(current, id) },
        el("span", { class: "id", text: id }), el("span", { class: "tool muted", text: step ? step.tool : "" }),
        el("span", { class: `badge status-${status}`, text: status }), el("span", { class: "muted", text: took })));
    }
    space.replaceChildren(...rows);
  }

  // -- steps waiting for a person: approve / reject, or give a value ------------------------------------------------
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
  // Opens a step's panel beside the graph; center: bring its node into view (a search, a chip, the list).
  function openStep(current, stepId, { center = false } = {}) {
    current.step = stepId;
    current.group = null;
    current.fullOutput = false;
    $("step-panel").hidden = false;
    const cy = current.cy;
    if (cy) {
      cy.resize(); // the panel beside it took some of the graph's width
      cy.nodes(":selected").unselect();
      const node = cy.getElementById(stepId);
      if (node.nonempty()) {
        node.select();
        if (center) {
          const zoom = Math.max(cy.zoom(), 0.8);
          cy.viewport({ zoom, pan: { x: cy.width() / 2 - node.position("x") * zoom, y: cy.height() / 2 - node.position("y") * zoom } });
        }
      }
    }
    $("step-group").hidden = true;
    delete $("step-group").dataset.key;
    for (const id of ["step-args-box", "step-output-box"]) $(id).hidden = false;
    $("step-attempts").hidden = false;
    $("step-panel").hidden = false;
    const child = current.childNodes.get(stepId);
    $("step-title").textContent = child ? `${child.run} › ${child.step}` : stepId;
    renderStepModels(current, stepId);
    renderStepList(current);
    const row = $("graph-row").getBoundingClientRect();
    if (row.top < 0 || row.bottom > window.innerHeight) $("graph-row").scrollIntoView({ block: "nearest" });
    refreshStep(current);
  }

  function renderStepModels(current, stepId) {
    const calls = [];
    for (const list of current.modelCalls.values()) for (const c of list) if (c.step === stepId) calls.push(c);
    $("step-models").textContent = calls.length ? calls.map((c) => modelCallText(c, current)).join("\n") : "None.";
    const step = current.shape && current.shape.byId.get(stepId);
    const links = $("step-links");
    links.replaceChildren();
    const child = current.childNodes.get(stepId);
    if (child) { // a step of an expanded child run
      links.append("step of the sub-plan ", el("a", { href: `#/runs/${encodeURIComponent(child.run)}`, text: child.run }));
    } else if (step && step.tool === "plan") { // a sub-plan: its child run (planning/subplans.py names it run.step)
      const childRun = current.subplanRuns.get(stepId) || `${current.id}.${stepId}`;
      links.append("sub-plan: ", el("a", { href: `#/runs/${encodeURIComponent(childRun)}`, text: childRun }));
      if (current.subplanRuns.has(stepId)) {
        const open = current.subExpanded.has(stepId);
        links.append(" ", el("button", { type: "button", class: "expand-subplan", text: open ? "Collapse in the graph" : "Expand in the graph",
          onclick: async () => { await toggleSubplan(current, stepId); if (view === current && current.step === stepId) renderStepModels(current, stepId); } }));
      }
    }
  }

  function closeStep() {
    if (view) { view.step = null; view.group = null; }
    $("step-panel").hidden = true;
    if (view && view.cy) { view.cy.resize(); view.cy.nodes(":selected").unselect(); }
  }

  async function refreshStep(current) {
    const stepId = current.step;
    if (!stepId) return;
    const child = current.childNodes.get(stepId); // a step of an expanded child run: read from that run
    const path = child ? `/runs/${encodeURIComponent(child.run)}/steps/${encodeURIComponent(child.step)}`
      : `/runs/${encodeURIComponent(current.id)}/steps/${encodeURIComponent(stepId)}`;
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
    if (child) $("step-title").textContent = `${child.run} › ${child.step}`;
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

  // -- the timeline of step attempts and model calls: a virtual list of rows (only those in view are drawn) ---------
  const ROW = 22, LABEL = 170, PAD = 8, AXIS = 22;

  function timelineRows(current) {
    const rows = [];
    // Model calls first: one row per purpose (planner, joiner, llm steps, ...), then the steps in plan order.
    for (const purpose of [...current.modelCalls.keys()].sort()) rows.push({ kind: "model", id: purpose });
    const seen = new Set();
    if (current.plan) for (const s of current.plan.steps) if (current.attempts.has(s.id)) { rows.push({ kind: "step", id: s.id }); seen.add(s.id); }
    for (const id of current.attempts.keys()) if (!seen.has(id)) rows.push({ kind: "step", id });
    return rows;
  }

  function renderTimeline() {
    const current = view;
    if (!current) return;
    const box = $("gantt");
    const body = $("gantt-body");
    const axis = $("gantt-axis");
    const rows = timelineRows(current);
    if (!rows.length || current.startedAt === null) {
      axis.replaceChildren();
      axis.setAttribute("height", "0");
      body.style.height = "auto";
      body.replaceChildren(el("p", { class: "muted", text: "No step has started yet." }));
      return;
    }
    const running = current.summary && current.summary.status === "running";
    const t0 = current.startedAt;
    let t1 = current.summary && current.summary.finished_at !== null && current.summary.finished_at !== undefined
      ? current.summary.finished_at : current.lastAt;
    const now = nowFor(t0);
    if (running && now !== null) t1 = Math.max(t1, now);
    t1 = Math.max(t1, current.latestEnd || t0);
    const span = Math.max(t1 - t0, 1e-3);
    const width = Math.max(box.clientWidth - 2, 600);
    const plotW = width - LABEL - PAD * 2;
    const x = (t) => LABEL + PAD + ((t - t0) / span) * plotW;
    // The axis stays on top while the rows scroll under it.
    axis.setAttribute("width", String(width));
    axis.setAttribute("height", String(AXIS));
    const ticks = [];
    const every = TIME_STEPS.find((s) => span / s <= 6) || Math.ceil(span / 6 / 86400) * 86400;
    for (let d = 0; d <= span + 1e-9; d += every) {
      const at = x(t0 + d);
      const anchor = d === 0 ? "start" : at > LABEL + PAD + plotW - 30 ? "end" : "middle";
      ticks.push(svg("line", { x1: at, x2: at, y1: AXIS - 5, y2: AXIS, class: "grid" }));
      ticks.push(svg("text", { x: at, y: 13, class: "tick", "text-anchor": anchor, text: formatTick(d) }));
    }
    axis.replaceChildren(...ticks);
    const critical = current.critical || new Set(criticalPath(current).steps);
    const height = rows.length * ROW + PAD;
    body.style.height = `${height}px`;
    const scroll = box.scrollTop;
    const first = Math.max(0, Math.floor(scroll / ROW) - 5);
    const last = Math.min(rows.length, first + Math.ceil((box.clientHeight || 300) / ROW) + 10);
    const root = svg("svg", { width, height: (last - first) * ROW, role: "img", "aria-label": "timeline of step attempts and model calls",
      style: `position:absolute;left:0;top:${first * ROW}px` });
    for (let i = first; i < last; i++) {
      const row = rows[i];
      const y = (i - first) * ROW;
      if (row.kind === "model") {
        const calls = current.modelCalls.get(row.id);
        root.append(svg("text", { x: 4, y: y + 15, class: "row-label model-label", text: `model · ${row.id} (${calls.length})` }));
        for (const c of calls) {
          const bar = svg("rect", { x: x(c.start), y: y + 5, width: Math.max(x(c.end) - x(c.start), 2), height: ROW - 10, rx: 2,
            class: "bar model-call", "data-purpose": row.id, "data-step": c.step || null });
          bar.append(svg("title", { text: modelCallText(c) }));
          root.append(bar);
        }
        continue;
      }
      const id = row.id;
      root.append(svg("text", { x: 4, y: y + 15, class: `row-label${critical.has(id) ? " critical" : ""}`,
        text: id.length > 22 ? `${id.slice(0, 21)}…` : id }));
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
    }
    body.replaceChildren(root);
  }

  // A call's cost, or null when unknown: the journal bills a model without a price 0 (planning/loop.py), and the
  // server then says the run's cost is unknown (null): such a call's 0 is unknown too, never $0.
  function callCost(current, c) {
    if (c.cost === null) return null;
    const unpriced = c.cost === 0 && (c.tokens || 0) > 0 && current.summary && current.summary.cost_usd === null;
    return unpriced ? null : c.cost;
  }

  function modelCallText(c, current = view) {
    const tokens = c.tokens === null ? "tokens unknown" : `${c.tokens.toLocaleString()} tokens`;
    const known = current ? callCost(current, c) : c.cost;
    const cost = known === null ? "cost unknown (no price)" : formatCost(known);
    return `${c.purpose}${c.model ? ` · ${c.model}` : ""}${c.step ? ` · step ${c.step}` : ""}: ${tokens}, ${cost}, ${formatDuration(c.end - c.start)}`;
  }

  // The run's model calls in the header: how many, their tokens, their cost (unknown when some call had no price).
  function renderModelTotals(current) {
    let n = 0, tokens = 0, cost = 0, unpriced = 0;
    for (const calls of current.modelCalls.values()) {
      for (const c of calls) {
        n += 1;
        tokens += c.tokens || 0;
        const known = callCost(current, c);
        if (known === null) unpriced += 1; else cost += known;
      }
    }
    const text = !n ? "none" : `${n} · ${tokens.toLocaleString()} tokens · ${unpriced === n ? "cost unknown"
      : `${formatCost(cost)}${unpriced ? ` + unknown (${unpriced} unpriced)` : ""}`}`;
    $("run-models").textContent = text;
    $("model-totals").textContent = n ? `(model calls: ${text})` : "";
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
  // Starts a plan (YAML or JSON) or a goal (when the server has a model), with an optional budget and deadline.
  async function submitRun(event) {
    event.preventDefault();
    const out = $("submit-error");
    out.replaceChildren();
    const goal = !$("goal-box").hidden;
    let body;
    if (goal) {
      const text = $("goal-input").value.trim();
      if (!text) { out.textContent = "Write a goal first."; return; }
      body = { goal: text };
    } else {
      const text = $("plan-input").value.trim();
      if (!text) { out.textContent = "Write a plan first."; return; }
      if (text.startsWith("{")) {
        try { body = { plan: JSON.parse(text) }; } catch (err) { out.textContent = `not valid JSON: ${err.message}`; return; }
      } else {
        body = { plan_yaml: text };
      }
    }
    for (const [field, input] of [["budget_usd", "budget-input"], ["deadline", "deadline-input"]]) {
      const raw = $(input).value.trim();
      if (!raw) continue;
      const value = Number(raw);
      if (!isFinite(value) || value < 0) { out.textContent = `${field}: ${raw} is not a non-negative number`; return; }
      body[field] = value;
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

  $("dag-search").addEventListener("input", throttle(async () => { if (view && view.plan) markMatches(view); }, 150));
  $("dag-search").addEventListener("keydown", (event) => {
    if (event.key !== "Enter" || !view || !view.plan) return;
    markMatches(view);
    if (view.matches && view.matches.length) focusStep(view, view.matches[0]);
  });
  $("collapse-mode").addEventListener("change", (event) => {
    if (!view || !view.plan) return;
    view.collapse = event.target.value;
    view.expanded = new Set();
    closeStep();
    buildDag(view);
    fitView(view);
  });
  $("expand-all").addEventListener("click", () => {
    if (!view || !view.plan) return;
    $("collapse-mode").value = "none";
    view.collapse = "none";
    buildDag(view);
  });
  $("fit-view").addEventListener("click", () => {
    if (!view || !view.cy) return;
    const cy = view.cy;
    const box = nodesBox(cy);
    if (!box) return;
    const zoom = Math.max(cy.minZoom(), Math.min(cy.width() / box.w, cy.height() / box.h, 1.2));
    cy.viewport({ zoom, pan: { x: cy.width() / 2 - ((box.x1 + box.x2) / 2) * zoom, y: cy.height() / 2 - ((box.y1 + box.y2) / 2) * zoom } });
  });
  $("follow").addEventListener("change", () => { if (view) followFrontier(view); });
  $("minimap").addEventListener("click", minimapGo);
  $("step-list").addEventListener("scroll", throttleFrame(() => { if (view && view.plan) renderStepList(view); }));
  $("gantt").addEventListener("scroll", throttleFrame(() => { if (view) renderTimeline(); }));
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
    view.planStale = true;
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
  for (const radio of document.querySelectorAll('#submit-kind input[name="kind"]')) {
    radio.addEventListener("change", () => setSubmitKind(radio.value));
  }
  $("cancel-run").addEventListener("click", () => runAction("cancel"));
  $("resume-run").addEventListener("click", () => runAction("resume"));
  window.addEventListener("hashchange", route);

  // For the browser tests and the benchmark (tests/server/browser.py): the selected run, its graph (view.cy).
  window.planweave = { get view() { return view; } };

  // A token in the fragment (#token=...) never reaches the server or its logs: take it and remove it.
  const fromFragment = location.hash.match(/^#token=([^&]+)$/);
  if (fromFragment) {
    token = decodeURIComponent(fromFragment[1]);
    localStorage.setItem(TOKEN_KEY, token);
    history.replaceState(null, "", location.pathname);
  }
  if (token) start(); else showLogin("");
})();
