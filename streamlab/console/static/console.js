// The lab console's page. Streams are opened at the edge (the lab's front
// door, another origin: nginx lets this console's origin read the answers);
// /api is the console's own server (toxics, presets, engine and gateway
// counters). One driver per transport, one lane per stream, one timeline per
// lane. window.consoleState holds everything shown, for people and tests.
"use strict";

const state = window.consoleState = {
  lab: null, lanes: [], hops: {}, engine: null, gateway: null, tokensPerS: null,
  presets: [], preset: null, faults: [], errors: [], tracing: null,
};
const $ = (selector, root = document) => root.querySelector(selector);
const el = (tag, attrs = {}, ...children) => {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value; else node.setAttribute(key, value);
  }
  node.append(...children);
  return node;
};
const now = () => performance.now();
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// ---- the console's own API ---------------------------------------------------------------
// The console serves this page with a token in it; every change to the lab
// carries it, so no other site's page can make one (guard.py).
const CONSOLE_TOKEN = document.querySelector('meta[name="streamlab-console-token"]').content;

async function api(method, path, body) {
  const headers = {"x-streamlab-console-token": CONSOLE_TOKEN};
  if (body !== undefined) headers["content-type"] = "application/json";
  const response = await fetch(path, {
    method, headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (response.status === 204) return null;
  const data = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(`${method} ${path}: ${response.status} ${data.error || ""}`);
  return data;
}

function report(error) {
  state.errors.push(String(error));
  $("#preset-note").textContent = String(error);
}

// ---- stream options (the request's `streamlab` field, docs/api.md) -------------------------
function readOptions() {
  const form = $("#options");
  const value = (name) => form.elements[name].value.trim();
  const number = (name) => (value(name) === "" ? undefined : Number(value(name)));
  const streamlab = {};
  for (const name of ["prefill_ms", "token_gap_ms", "answer_tokens", "heartbeat_s", "job_ttl_s"]) {
    if (number(name) !== undefined) streamlab[name] = number(name);
  }
  if (number("pause_after") !== undefined) {
    streamlab.pauses = [{after_token: number("pause_after"), pause_ms: number("pause_ms") || 0}];
  }
  if (value("relay") !== "direct") streamlab.relay = value("relay");
  if (value("engine_errors") !== "report") streamlab.engine_errors = value("engine_errors");
  const trimmed = value("location").replace(/^\/+|\/+$/g, "");
  return {
    prompt: value("prompt") || "hello", streamlab,
    prefix: trimmed ? `/${trimmed}/` : "/",
    graceS: number("grace_s"),
    watchdogS: number("watchdog_s"),
  };
}

function writeOptions(preset) {
  const form = $("#options");
  const s = preset.streamlab;
  const set = (name, v) => { form.elements[name].value = v === undefined || v === null ? "" : v; };
  set("location", preset.location);
  set("prefill_ms", s.prefill_ms); set("token_gap_ms", s.token_gap_ms);
  set("answer_tokens", s.answer_tokens); set("heartbeat_s", s.heartbeat_s);
  set("job_ttl_s", s.job_ttl_s);
  set("pause_after", s.pauses ? s.pauses[0].after_token : undefined);
  if (s.pauses) set("pause_ms", s.pauses[0].pause_ms);
  set("relay", s.relay || "direct"); set("engine_errors", s.engine_errors || "report");
  set("watchdog_s", preset.watchdog_s);
  for (const box of form.querySelectorAll("input[name=t]")) {
    box.checked = preset.transports.includes(box.value);
  }
}

// ---- lanes: one stream each ----------------------------------------------------------------
let nextLane = 1;

function newLane(transport, options, fault) {
  const lane = {
    id: nextLane++, transport, options, fault, status: "starting", t0: now(),
    t0Unix: (performance.timeOrigin + now()) / 1000,  // the waterfall's clock: wall time
    requestId: `console-${Math.random().toString(16).slice(2, 14)}`,
    streamId: null, jobId: null, ttlS: null,
    ttftMs: null, tokens: 0, indexes: [], text: "", bytes: 0, requests: 0, heartbeats: 0,
    opens: 0, connectionErrors: 0, lastEventId: null, reconnects: [], ends: 0,
    events: [], log: [], stopped: false, stopAtMs: null, ended: false, engine: null,
    trace: null, waterfall: null, traceError: null, traceAsked: false,
  };
  state.lanes.push(lane);
  renderLane(lane);
  return lane;
}

function mark(lane, kind, label = "") {
  lane.events.push({t: now() - lane.t0, kind, label});
  if (label) lane.log.push(`${((now() - lane.t0) / 1000).toFixed(2)}s ${kind}: ${label}`);
  dirty(lane);
}

function setStatus(lane, status) { lane.status = status; dirty(lane); }

function onToken(lane, index, text) {
  if (lane.ttftMs === null) lane.ttftMs = Math.round(now() - lane.t0);
  lane.tokens += 1;
  lane.indexes.push(index);
  lane.text += text;
  mark(lane, "token");
  if (lane.fault && !lane.fault.applied && lane.tokens >= lane.fault.after_tokens) {
    applyFault(lane, lane.fault);
  }
}

// Every way a stream ends goes through here once: the page counts ends, so a
// stream that ended twice (a replayed terminal event) shows as a bug.
function end(lane, status, label) {
  lane.ends += 1;
  if (lane.ended) { mark(lane, "error", `ended again: ${status}`); return; }
  lane.ended = true;
  mark(lane, status === "done" ? "end" : "error", label || status);
  if (!lane.stopped) setStatus(lane, status);
  watchEngine(lane, lane.stopped ? 60_000 : 5_000);
  loadTrace(lane);
}

function url(lane, path) { return `${state.lab.edge_url}${lane.options.prefix}${path}`; }

function chatBody(lane, extra = {}) {
  return JSON.stringify({
    messages: [{role: "user", content: lane.options.prompt}],
    streamlab: {...lane.options.streamlab, request_id: lane.requestId}, ...extra,
  });
}

const JSON_HEADERS = {"content-type": "application/json"};

// ---- drivers: one per transport ------------------------------------------------------------
const drivers = {
  // The resume surface with the browser's own EventSource: it reconnects by
  // itself and sends Last-Event-ID; the page only watches.
  eventsource: {
    async start(lane) {
      const body = JSON.parse(chatBody(lane));
      delete body.streamlab.request_id;  // the stream id is the engine's request id here
      if (lane.options.graceS !== undefined) body.resume = {grace_s: lane.options.graceS};
      const created = await fetch(url(lane, "v1/streams"), {
        method: "POST", headers: JSON_HEADERS, body: JSON.stringify(body)});
      lane.requests += 1;
      if (created.status !== 201) {
        end(lane, "error", `POST v1/streams: HTTP ${created.status} ${await created.text()}`);
        return;
      }
      const stream = await created.json();
      lane.streamId = lane.requestId = stream.id;
      const source = lane.source = new EventSource(
        `${state.lab.edge_url}${lane.options.prefix}${stream.events_url.replace(/^\//, "")}`);
      source.onopen = () => {
        lane.opens += 1;
        lane.requests += 1;
        if (lane.opens > 1) {
          const reconnect = {lastEventId: lane.lastEventId, gatewaySaw: undefined};
          lane.reconnects.push(reconnect);
          mark(lane, "open", `reconnected, Last-Event-ID ${lane.lastEventId || "(none)"}`);
          gatewaySaw(lane, reconnect);
        } else {
          mark(lane, "open", "connected");
        }
        setStatus(lane, "streaming");
      };
      source.addEventListener("token", (e) => {
        const token = JSON.parse(e.data);
        lane.lastEventId = e.lastEventId;
        lane.bytes += sseBytes(e, "token");
        onToken(lane, token.index, token.text);
      });
      source.addEventListener("gap", (e) => mark(lane, "error", `gap ${e.data}`));
      const terminal = (name, status) => source.addEventListener(name, (e) => {
        lane.lastEventId = e.lastEventId;
        lane.bytes += sseBytes(e, name);
        source.close();  // the stream is over: no reconnect
        end(lane, status, `${name} ${e.data}`);
      });
      terminal("done", "done");
      terminal("cancelled", "cancelled");
      // Trouble that may pass (the shared store, a paused gateway): never an
      // end. The response closes and EventSource reconnects after `retry:`
      // with its Last-Event-ID (docs/resume.md, "Transient trouble").
      source.addEventListener("retry", (e) => {
        lane.bytes += sseBytes(e, "retry");
        mark(lane, "error", `retry ${e.data}; will resume after ${lane.lastEventId || "(none)"}`);
        setStatus(lane, "reconnecting");
      });
      source.addEventListener("error", (e) => {
        if (e instanceof MessageEvent && JSON.parse(e.data).retryable) {
          lane.bytes += sseBytes(e, "error");  // a retryable error: as `retry`
          mark(lane, "error", `retryable error ${e.data}`);
          return;
        }
        if (e instanceof MessageEvent) {  // the server's named `error` event
          lane.bytes += sseBytes(e, "error");
          source.close();
          end(lane, "error", `error ${e.data}`);
          return;
        }
        if (lane.ended || lane.stopped) return;
        lane.connectionErrors += 1;
        if (source.readyState === EventSource.CLOSED) {
          end(lane, "error", "connection refused for good (non-200)");
        } else {
          mark(lane, "error", `connection lost; will resume after ${lane.lastEventId || "(none)"}`);
          setStatus(lane, "reconnecting");
        }
      });
    },
    async stop(lane) {
      if (lane.source) lane.source.close();
      if (lane.streamId) {  // the resume surface's Stop: cancel now, not after the grace
        await fetch(url(lane, `v1/streams/${lane.streamId}`), {method: "DELETE"}).catch(() => {});
        lane.requests += 1;
      }
    },
  },

  // The OpenAI route through fetch: the page parses the SSE itself, so it
  // sees every byte, every `: ping` and whether [DONE] came.
  "sse-fetch": {
    async start(lane) {
      lane.abort = new AbortController();
      const watchdogS = lane.options.watchdogS;
      let watchdogFired = false, response;
      const timer = watchdogS ? setTimeout(() => { watchdogFired = true; lane.abort.abort(); },
                                           watchdogS * 1000) : null;
      try {
        response = await fetch(url(lane, "v1/chat/completions"), {
          method: "POST", headers: JSON_HEADERS, body: chatBody(lane, {stream: true}),
          signal: lane.abort.signal});
      } catch (error) {
        if (!watchdogFired) throw error;
        end(lane, "error", `watchdog: no answer within ${watchdogS} s`);
        return;
      } finally {
        clearTimeout(timer);
      }
      lane.requests += 1;
      lane.requestId = response.headers.get("x-request-id") || lane.requestId;
      if (!response.ok) {
        end(lane, "error", `HTTP ${response.status} ${await response.text()}`);
        return;
      }
      mark(lane, "open", `HTTP ${response.status}`);
      setStatus(lane, "streaming");
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "", data = [], index = 0;
      for (;;) {
        const {value, done} = await readWithin(reader, lane.options.watchdogS);
        if (value === WATCHDOG) {
          lane.abort.abort();
          end(lane, "error", `watchdog: no byte for ${lane.options.watchdogS} s`);
          return;
        }
        if (done) break;
        lane.bytes += value.byteLength;
        buffer += decoder.decode(value, {stream: true});
        const lines = buffer.split(/\r\n|\r|\n/);
        buffer = lines.pop();
        for (const line of lines) {
          if (line.startsWith(":")) { lane.heartbeats += 1; mark(lane, "ping"); continue; }
          if (line.startsWith("data:")) { data.push(line.slice(5).replace(/^ /, "")); continue; }
          if (line !== "" || data.length === 0) continue;
          const payload = data.join("\n");
          data = [];
          if (payload === "[DONE]") { end(lane, "done", "[DONE]"); return; }
          const chunk = JSON.parse(payload);
          if (chunk.error) { end(lane, "error", `error event: ${chunk.error.message}`); return; }
          const text = chunk.choices && chunk.choices[0] && chunk.choices[0].delta.content;
          if (text) onToken(lane, index++, text);
        }
      }
      end(lane, "cut", "the body ended without [DONE]");
    },
    async stop(lane) { if (lane.abort) lane.abort.abort(); },
  },

  websocket: {
    async start(lane) {
      const wsUrl = url(lane, "ws").replace(/^http/, "ws");
      const socket = lane.socket = new WebSocket(wsUrl);
      lane.requests += 1;
      socket.onopen = () => {
        mark(lane, "open", "101 Switching Protocols");
        setStatus(lane, "streaming");
        socket.send(JSON.stringify({prompt: lane.options.prompt,
                                    streamlab: {...lane.options.streamlab,
                                                request_id: lane.requestId}}));
      };
      socket.onmessage = (e) => {
        lane.bytes += e.data.length;
        if (e.data === "[DONE]") { end(lane, "done", "[DONE]"); return; }
        const message = JSON.parse(e.data);
        if (message.error) { end(lane, "error", `error: ${message.error.message}`); return; }
        onToken(lane, message.index, message.text);
      };
      socket.onclose = (e) => {
        if (!lane.ended && !lane.stopped) {
          end(lane, "error", `closed ${e.code}${e.reason ? " " + e.reason : ""} before [DONE]`);
        }
      };
    },
    async stop(lane) { if (lane.socket) lane.socket.close(1000, "stop"); },
  },

  "long-poll": {start: (lane) => pollJob(lane, 10), stop: stopPolling},
  poll: {start: (lane) => pollJob(lane, 0), stop: stopPolling},
};

// The client's read timeout (a scenario's "watchdog"): a read that brings no
// byte within it answers WATCHDOG instead; without one, a read may wait forever.
const WATCHDOG = Symbol("watchdog");
function readWithin(reader, seconds) {
  if (!seconds) return reader.read();
  let timer;
  const expired = new Promise((resolve) => {
    timer = setTimeout(() => resolve({value: WATCHDOG, done: false}), seconds * 1000);
  });
  return Promise.race([reader.read(), expired]).finally(() => clearTimeout(timer));
}

// An EventSource hides the wire: this is the event as the gateway wrote it.
function sseBytes(e, name) {
  return `id: ${e.lastEventId}\nevent: ${name}\ndata: ${e.data}\n\n`.length;
}

// What the gateway recorded the reconnect as sending (GET /v1/streams/{id}).
async function gatewaySaw(lane, reconnect) {
  try {
    const response = await fetch(url(lane, `v1/streams/${lane.streamId}`));
    const status = await response.json();
    const attaches = status.attaches || [];
    reconnect.gatewaySaw = attaches.length ? attaches[attaches.length - 1].last_event_id : null;
    dirty(lane);
  } catch (error) {
    reconnect.gatewaySaw = `(${error})`;
  }
}

// Short polling (waitS 0, a GET every 250 ms) and long polling (held up to waitS).
const MAX_POLL_FAILURES = 20;
async function pollJob(lane, waitS) {
  const created = await fetch(url(lane, "v1/jobs"), {
    method: "POST", headers: JSON_HEADERS, body: chatBody(lane)});
  lane.requests += 1;
  if (created.status !== 201) {
    end(lane, "error", `POST v1/jobs: HTTP ${created.status} ${await created.text()}`);
    return;
  }
  const job = await created.json();
  lane.jobId = job.id;
  lane.requestId = job.request_id;
  lane.ttlS = job.ttl_s;
  mark(lane, "open", `job ${job.id.slice(0, 8)}, TTL ${job.ttl_s} s`);
  setStatus(lane, "streaming");
  let next = 0, failures = 0;
  while (!lane.stopped) {
    lane.abort = new AbortController();
    const wait = waitS ? `&wait_s=${waitS}` : "";
    let response;
    try {
      response = await fetch(url(lane, `v1/jobs/${job.id}?since=${next}${wait}`),
                             {signal: lane.abort.signal});
      failures = 0;
    } catch (error) {
      if (lane.stopped) return;
      // A poll is a fresh request: a cut costs one failed poll, then the next
      // one carries on from `since` (unless the job itself is gone: 404 below).
      failures += 1;
      lane.connectionErrors += 1;
      mark(lane, "error", `poll failed (${error.message}); retrying`);
      if (failures >= MAX_POLL_FAILURES) throw error;
      await sleep(500);
      continue;
    }
    lane.requests += 1;
    const text = await response.text();
    lane.bytes += text.length;
    if (!response.ok) { end(lane, "error", `GET: HTTP ${response.status} ${text}`); return; }
    const page = JSON.parse(text);
    page.tokens.forEach((token, i) => onToken(lane, next + i, token));
    next = page.next;
    if (page.done) {
      end(lane, page.error ? "error" : "done",
          page.error ? `error: ${page.error.message || JSON.stringify(page.error)}`
                     : `done (${page.finish_reason})`);
      return;
    }
    if (!waitS) await sleep(250);
  }
}

// Polling's Stop is only "stop asking": nothing tells the gateway, so the
// engine runs on until the job's TTL reaps it (the leak the page shows).
async function stopPolling(lane) { if (lane.abort) lane.abort.abort(); }

// ---- Stop and what the engine did ----------------------------------------------------------
async function stop(lane) {
  if (lane.ended || lane.stopped) return;
  // The mark first: the engine's cancel is timed from this moment (the console's
  // server stamps it with the clock the engine's records use).
  try { await api("POST", `/api/engine/generations/${lane.requestId}/stop`); }
  catch (error) { lane.log.push(`stop mark: ${error}`); }
  lane.stopped = true;
  lane.stopAtMs = Math.round(now() - lane.t0);
  mark(lane, "stop", "Stop pressed");
  await drivers[lane.transport].stop(lane);
  setStatus(lane, "stopped");
  loadTrace(lane);
  watchEngine(lane, lane.ttlS !== null ? (lane.ttlS || 60) * 1000 + 15_000 : 30_000);
}

// Poll the engine's record of this generation until it is no longer running
// or the deadline passes (a leaking job with TTL 0 never stops).
async function watchEngine(lane, forMs) {
  if (lane.watching) return;
  lane.watching = true;
  const started = now(), deadline = started + forMs;
  while (now() < deadline) {
    try {
      const record = await api("GET", `/api/engine/generations/${lane.requestId}`);
      const was = lane.engine && lane.engine.state;
      lane.engine = record;
      if (record.state === "cancelled" && was !== "cancelled") {
        lane.events.push({t: now() - lane.t0 - record.cancelled_ago_s * 1000, kind: "cancel"});
      }
      dirty(lane);
      if (record.state !== "running") break;
    } catch (error) { /* not at the engine yet */ }
    if (!state.lanes.includes(lane)) break;  // cleared from the page
    await sleep(now() - started < 3000 ? 100 : 250);  // fine-grained near the Stop
  }
  lane.watching = false;
}

// ---- hops: toxics and enable/disable, through the console's server --------------------------
// Every answer that carries the hops goes through here. Calls overlap (the
// 2 s refresh, a button), so an answer to an older call than the one shown
// is dropped: a refresh sent before a Disable must not show the hop enabled.
let hopsAsked = 0, hopsShownFor = 0;
async function showHops(call) {
  const asked = ++hopsAsked;
  const hops = await call();
  if (asked < hopsShownFor) return;
  hopsShownFor = asked;
  state.hops = hops;
  renderHops();
}

const refreshHops = () => showHops(() => api("GET", "/api/hops"));

// What was typed into the hops' inputs survives their re-rendering.
const hopInputs = {};

async function hopAction(hop, action, input) {
  const number = () => Number(input.value || input.placeholder);
  const toxics = {
    latency: () => ({type: "latency", attributes: {latency: number()}}),
    bandwidth: () => ({type: "bandwidth", attributes: {rate: number()}}),
    timeout: () => ({type: "timeout", attributes: {timeout: 0}}),
    reset: () => ({type: "reset_peer", attributes: {timeout: 0}}),
  };
  // Every live stream's timeline shows when a hop was touched.
  const label = {latency: `latency ${input && number()} ms`, bandwidth: `${input && number()} KB/s`,
                 timeout: "black hole", reset: "reset_peer"}[action] || action;
  for (const lane of state.lanes.filter((l) => !l.ended && !l.stopped)) {
    mark(lane, "fault", `${hop}: ${label}`);
  }
  try {
    if (action === "disable" || action === "enable") {
      await showHops(() => api("POST", `/api/hops/${hop}/enabled`,
                               {enabled: action === "enable"}));
      return;
    }
    await api("POST", `/api/hops/${hop}/toxics`, toxics[action]());
    await refreshHops();
  } catch (error) { report(error); }
}

async function applyFault(lane, fault) {
  fault.applied = true;
  state.faults.push({lane: lane.id, hop: fault.hop, at: Math.round(now() - lane.t0)});
  mark(lane, "fault", `${fault.disable ? "disable" : "toxics on"} ${fault.hop}`);
  try {
    for (const toxic of fault.toxics) await api("POST", `/api/hops/${fault.hop}/toxics`, toxic);
    if (fault.disable) await api("POST", `/api/hops/${fault.hop}/enabled`, {enabled: false});
    if (fault.restore_after_ms) {
      await sleep(fault.restore_after_ms);
      await api("POST", `/api/hops/${fault.hop}/enabled`, {enabled: true});
      mark(lane, "fault", `${fault.hop} enabled again`);
    }
  } catch (error) { report(error); }
  refreshHops().catch(report);
}

// ---- presets: the scenario catalogue ---------------------------------------------------------
async function applyPreset(name, mode) {
  const preset = state.presets.find((p) => p.scenario === name && p.mode === mode);
  state.preset = preset;
  await showHops(() => api("POST", `/api/presets/${name}/${mode}`));
  writeOptions(preset);
  for (const row of document.querySelectorAll(".preset")) {
    row.classList.toggle("active", row.dataset.scenario === name);
  }
  const stopHint = !preset.press_stop ? ""
    : preset.stop_after_tokens ? ` Press Stop after ${preset.stop_after_tokens} tokens.`
    : " Press Stop during the silent prefill.";
  $("#preset-note").textContent =
    `${name} [${mode}]: ${preset.story}.${stopHint} Expect: ${preset.expect.join(", ")}`;
  clearLanes();
  startStreams(preset.transports, preset.fault ? {...preset.fault} : null);
}

// ---- starting streams --------------------------------------------------------------------------
function startStreams(transports, fault = null) {
  const options = readOptions();
  const started = [];
  for (const transport of transports) {
    // A mid-stream fault belongs to the first stream only: it is applied once.
    const lane = newLane(transport, options, started.length === 0 ? fault : null);
    started.push(lane);
    drivers[transport].start(lane).catch((error) => {
      if (!lane.stopped) end(lane, "error", `${error}`);
    });
  }
  return started.map((lane) => lane.id);
}

function clearLanes() {
  for (const lane of state.lanes) {
    if (lane.ended || lane.stopped) continue;
    lane.stopped = true;
    drivers[lane.transport].stop(lane);
  }
  state.lanes = [];
  $("#lanes").replaceChildren();
}

// ---- rendering ------------------------------------------------------------------------------------
const COLORS = {token: "#1f5fbf", ping: "#8d99a6", open: "#2e8b57", error: "#d0312d",
                stop: "#7b3fb5", cancel: "#c2185b", end: "#1d232a", fault: "#e07b00"};
const LABELS = {"eventsource": "SSE · EventSource", "sse-fetch": "SSE · fetch",
                "websocket": "WebSocket", "long-poll": "long polling", "poll": "polling 250 ms"};
const pending = new Set();

function dirty(lane) {
  if (pending.size === 0) requestAnimationFrame(flush);
  pending.add(lane);
}

function flush() {
  for (const lane of pending) renderLane(lane);
  pending.clear();
}

function renderLane(lane) {
  let node = document.getElementById(`lane-${lane.id}`);
  if (!node) {
    node = el("div", {class: "lane", id: `lane-${lane.id}`, "data-transport": lane.transport},
      el("div", {class: "lane-head"},
        el("b", {}, `#${lane.id} ${LABELS[lane.transport]}`),
        el("span", {class: "status"}),
        el("span", {class: "figures"}),
        el("button", {"data-action": "stop", "data-lane": String(lane.id)}, "Stop")),
      el("canvas", {height: "44"}),
      el("div", {class: "engine"}),
      el("div", {class: "waterfall"}),
      el("div", {class: "text"}),
      el("div", {class: "log"}));
    $("#lanes").append(node);
  }
  const status = $(".status", node);
  status.textContent = lane.status;
  status.className = `status ${lane.status}`;
  const ttft = lane.ttftMs === null ? "–" : `${lane.ttftMs} ms`;
  const heartbeats = lane.transport === "sse-fetch" ? ` · heartbeats ${lane.heartbeats}` : "";
  const approx = lane.transport === "eventsource" ? "≈" : "";
  $(".figures", node).textContent = `TTFT ${ttft} · tokens ${lane.tokens} · bytes ${approx}` +
    `${lane.bytes} · requests ${lane.requests}${heartbeats}` +
    (lane.reconnects.length ? ` · reconnects ${lane.reconnects.length}` : "");
  $("button[data-action=stop]", node).disabled = lane.ended || lane.stopped;
  $(".text", node).textContent = lane.text;
  $(".engine", node).textContent = engineLine(lane);
  const reconnects = lane.reconnects.map((r) =>
    `reconnect sent Last-Event-ID ${r.lastEventId}` +
    (r.gatewaySaw === undefined ? "" : ` (gateway saw ${r.gatewaySaw})`));
  $(".log", node).textContent = [...reconnects, ...lane.log.slice(-6)].join("\n");
  drawTimeline($("canvas", node), lane);
}

function engineLine(lane) {
  const record = lane.engine;
  if (!record) return lane.stopped ? "engine: …" : "";
  let line = `engine: ${record.state} · ${record.tokens_generated} tokens generated`;
  if (record.stop_to_cancel_ms !== null) line += ` · Stop → cancel ${record.stop_to_cancel_ms} ms`;
  if (record.state === "cancelled") line += ` · ${record.tokens_after_cancel} after the cancel`;
  if (record.state === "running" && lane.stopped) {
    const after = ((now() - lane.t0 - lane.stopAtMs) / 1000).toFixed(1);
    line += ` · still generating ${after} s after Stop`;
    if (lane.ttlS !== null) {
      line += lane.ttlS ? ` (nobody polls: the job's ${lane.ttlS} s TTL will reap it)`
                        : " (nobody polls, and TTL 0 never reaps it)";
    }
  }
  const unread = record.tokens_generated - lane.tokens;
  if (lane.stopped && unread > 0) {
    line += ` · ${unread} token${unread === 1 ? "" : "s"} made that the page never read`;
  }
  return line;
}

function drawTimeline(canvas, lane) {
  const width = canvas.clientWidth || 600;
  if (canvas.width !== width) canvas.width = width;
  const height = canvas.height;
  const g = canvas.getContext("2d");
  g.clearRect(0, 0, width, height);
  const last = lane.events.length ? lane.events[lane.events.length - 1].t : 0;
  const spanMs = Math.max(4000, (lane.ended ? last : now() - lane.t0) * 1.1);
  const x = (t) => 4 + (t / spanMs) * (width - 8);
  g.fillStyle = "#8d99a6";
  g.font = "10px sans-serif";
  const step = spanMs > 20000 ? 5000 : 1000;
  for (let t = 0; t <= spanMs; t += step) {
    g.fillRect(x(t), height - 4, 1, 4);
    g.fillText(`${t / 1000}s`, x(t) + 2, height - 1);
  }
  for (const event of lane.events) {
    g.fillStyle = COLORS[event.kind] || "#000";
    const px = x(event.t);
    if (event.kind === "token") g.fillRect(px, 10, 1.5, 22);
    else if (event.kind === "ping") g.fillRect(px - 2, 3, 4, 4);
    else if (event.kind === "end") g.fillRect(px, 2, 4, 36);
    else if (event.kind === "fault") {
      g.beginPath(); g.moveTo(px, 2); g.lineTo(px - 5, 10); g.lineTo(px + 5, 10); g.fill();
    } else g.fillRect(px, 2, 2.5, 36);
  }
}

// ---- the waterfall: the stream's timeline at every hop (a lab up with --tracing) ------------
// The console's server collects it as `streamlab trace ID` does (/api/trace/{id}:
// the proxy's log line, the gateway's and the engine's spans in Jaeger) and
// lays it out as rows; the client's row is this page's own clock (pageRecord),
// the lab's client made no record of its streams. One axis, wall-clock seconds.
const HOP_COLORS = {client: "#2f6fb0", proxy: "#6b7580", gateway: "#2e8b57", engine: "#7b3fb5"};
const SEGMENT_COLORS = {connect: "#9cc3e8", queue: "#e0b3ff", prefill: "#b07ad9",
                        "to the engine's first token": "#8fcfa8",
                        "to the gateway's headers": "#b8c0c8"};
const MARK_COLORS = {first_token: "#1d232a", first_byte: "#1d232a", heartbeat: "#e07b00",
                     ping: "#e07b00", cancel: "#c2185b", client_left: "#c2185b",
                     error: "#c0392b"};

async function loadTrace(lane) {
  if (!state.tracing || !state.tracing.tracing || lane.traceAsked) return;
  lane.traceAsked = true;
  await sleep(500);  // the services export their spans in batches (200 ms)
  for (let attempt = 0; attempt < 3 && state.lanes.includes(lane); attempt++) {
    try {
      const client = encodeURIComponent(JSON.stringify(pageRecord(lane)));
      lane.trace = await api(
        "GET", `/api/trace/${encodeURIComponent(lane.requestId)}?wait_s=3&client=${client}`);
      lane.waterfall = lane.trace.waterfall;
      lane.traceError = null;
      if (lane.trace.missing.length === 0 || attempt === 2) break;
    } catch (error) {
      lane.traceError = String(error);
    }
    await sleep(1000);
  }
  renderWaterfall(lane);
}

// The page's own timings of the stream, on the wall clock (record_client's
// fields): the server uses them when the lab's client made no record of it.
function pageRecord(lane) {
  const sec = (e) => (e ? Math.round(e.t) / 1000 : null);
  const tokens = lane.events.filter((e) => e.kind === "token");
  const end = lane.events.find((e) => ["end", "error", "stop"].includes(e.kind));
  return {
    started_unix: lane.t0Unix, headers_s: sec(lane.events.find((e) => e.kind === "open")),
    first_byte_s: sec(tokens[0]), ttft_s: sec(tokens[0]), last_token_s: sec(tokens.at(-1)),
    total_s: sec(end) ?? (now() - lane.t0) / 1000,
    pings_s: lane.events.filter((e) => e.kind === "ping").map(sec),
    done: lane.status === "done" && !lane.stopped,
    error: lane.stopped ? "stopped" : lane.status === "done" ? "" : lane.status,
  };
}

const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs = {}, text = null) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
  if (text !== null) {
    const title = document.createElementNS(SVG, "title");
    title.textContent = text;
    node.append(title);
  }
  return node;
}

function renderWaterfall(lane) {
  const box = $(`#lane-${lane.id} .waterfall`);
  if (!box) return;
  box.replaceChildren();
  if (lane.traceError) { box.append(el("span", {class: "muted"}, `timeline: ${lane.traceError}`)); return; }
  const w = lane.waterfall;
  if (!w) return;
  const width = box.clientWidth || 700, labelW = 170, rowH = 15, top = 4;
  const height = top + w.rows.length * rowH + 16;
  const t0 = w.start_s, spanS = Math.max(w.end_s - t0, 0.001) * 1.03;  // room for the cut
  const x = (t) => labelW + ((t - t0) / spanS) * (width - labelW - 8);
  const root = svg("svg", {width, height, viewBox: `0 0 ${width} ${height}`, class: "waterfall-svg"});
  w.rows.forEach((row, i) => {
    const y = top + i * rowH;
    const label = svg("text", {x: 2, y: y + 10, class: "wf-label"});
    label.textContent = row.label;
    root.append(label);
    if (row.start_s === null) return;
    const end = row.end_s === null ? w.end_s : row.end_s;
    const ms = (t) => `${((t - t0) * 1000).toFixed(1)} ms`;
    root.append(svg("rect", {x: x(row.start_s), y: y + 3, width: Math.max(1, x(end) - x(row.start_s)),
                             height: rowH - 6, fill: HOP_COLORS[row.hop] || "#555", opacity: 0.35,
                             class: "bar", "data-hop": row.hop},
                    `${row.label}: ${ms(row.start_s)} → ${ms(end)}`));
    for (const seg of row.segments) {
      root.append(svg("rect", {x: x(seg.start_s), y: y + 3, width: Math.max(1, x(seg.end_s) - x(seg.start_s)),
                               height: rowH - 6, fill: SEGMENT_COLORS[seg.what] || "#999",
                               class: "segment", "data-what": seg.what},
                      `${seg.what}: ${((seg.end_s - seg.start_s) * 1000).toFixed(1)} ms`));
    }
    for (const m of row.marks) {
      const small = m.what === "heartbeat";
      root.append(svg("rect", {x: x(m.t_s) - 1, y: y + (small ? 4 : 1), width: small ? 2 : 2.5,
                               height: small ? rowH - 8 : rowH - 2,
                               fill: MARK_COLORS[m.what] || HOP_COLORS[row.hop] || "#000",
                               class: "mark", "data-what": m.what}, `${m.what} at ${ms(m.t_s)}`));
    }
  });
  if (w.cut) {
    const cx = x(w.cut.t_s), bottom = top + w.rows.length * rowH;
    root.append(svg("line", {x1: cx, x2: cx, y1: 0, y2: bottom, stroke: "#c0392b",
                             "stroke-width": 2, "stroke-dasharray": "3 2", class: "cut"},
                    `cut by ${w.cut.hop} at ${((w.cut.t_s - t0) * 1000).toFixed(1)} ms`));
    const label = svg("text", {x: cx - 4, y: 10, "text-anchor": "end", class: "wf-cut"});
    label.textContent = `cut: ${w.cut.hop}`;
    root.append(label);
  }
  const axisY = top + w.rows.length * rowH + 12;
  const step = spanS > 8 ? 2 : spanS > 2 ? 0.5 : spanS > 0.5 ? 0.1 : 0.05;
  for (let t = 0; t <= spanS + 1e-9; t += step) {
    root.append(svg("rect", {x: x(t0 + t), y: axisY - 10, width: 1, height: 3, fill: "#8d99a6"}));
    const tick = svg("text", {x: x(t0 + t) + 2, y: axisY, class: "wf-axis"});
    tick.textContent = `${Math.round(t * 1000)} ms`;
    root.append(tick);
  }
  box.append(root);
  const note = [lane.trace.where_held ? `first token waited longest at ${lane.trace.where_held}` : "",
                w.cut ? cutNote(w.cut, lane.trace.cut) : "",
                lane.trace.missing.length ? `missing: ${lane.trace.missing.join("; ")}` : ""]
    .filter(Boolean).join(" · ");
  if (note) box.append(el("div", {class: "muted wf-note"}, note));
}

function cutNote(cut, judged) {
  let note = `cut by ${cut.hop}`;
  if (judged && judged.hop === cut.hop) {
    if (judged.proxy && judged.hop === "proxy") note += ` (${judged.proxy})`;
    if (judged.silence_s !== null) note += `, ${judged.silence_s.toFixed(3)} s after the last token`;
    if (judged.gateway_outcome) note += `; gateway: ${judged.gateway_outcome}`;
    if (judged.engine_state) note += `; engine: ${judged.engine_state}`;
  }
  return note;
}

let shownHops = null;

function renderHops() {
  const shown = JSON.stringify(state.hops);
  if (shown === shownHops) return;  // unchanged: leave the inputs alone
  shownHops = shown;
  const list = $("#hop-list");
  list.replaceChildren();
  for (const hop of state.lab.hops) {
    const info = state.hops[hop] || {enabled: true, toxics: []};
    const input = (name, placeholder) => {
      const key = `${hop}-${name}`;
      const field = el("input", {type: "number", min: "0", placeholder, "data-hop-input": key});
      field.value = hopInputs[key] || "";
      field.addEventListener("input", () => { hopInputs[key] = field.value; });
      return field;
    };
    const latency = input("latency", "600"), rate = input("bandwidth", "1");
    const button = (action, label, input) => {
      const b = el("button", {"data-action": "hop", "data-hop": hop, "data-op": action}, label);
      b.addEventListener("click", () => hopAction(hop, action, input));
      return b;
    };
    const toxics = info.toxics.map((toxic) => {
      const attributes = Object.entries(toxic.attributes).map(([k, v]) => `${k}=${v}`).join(" ");
      const remove = el("button", {"data-action": "remove-toxic", "data-hop": hop,
                                   "data-toxic": toxic.name, title: "remove"}, "×");
      remove.addEventListener("click", () =>
        api("DELETE", `/api/hops/${hop}/toxics/${toxic.name}`).then(refreshHops).catch(report));
      return el("div", {class: "toxic"}, `${toxic.name} (${toxic.stream}) ${attributes}`, remove);
    });
    list.append(el("div", {class: "hop", "data-hop": hop},
      el("div", {class: "hop-head"}, el("b", {}, hop),
         info.enabled ? el("span", {class: "muted"}, "enabled")
                      : el("span", {class: "off"}, "DISABLED"),
         info.enabled ? button("disable", "disable") : button("enable", "enable")),
      el("div", {class: "hop-controls"},
         el("span", {}, "latency ms"), latency, button("latency", "add", latency),
         el("span", {}, "KB/s"), rate, button("bandwidth", "add", rate)),
      el("div", {class: "hop-faults"},
         button("timeout", "black hole (timeout 0)"), button("reset", "reset (RST)")),
      ...toxics));
  }
}

function renderPresets() {
  const list = $("#preset-list");
  const names = [...new Set(state.presets.map((p) => p.scenario))];
  for (const name of names) {
    const summary = state.presets.find((p) => p.scenario === name).summary;
    const button = (mode) => {
      const b = el("button", {"data-action": "preset", "data-scenario": name, "data-mode": mode},
                   mode);
      b.addEventListener("click", () => applyPreset(name, mode).catch(report));
      return b;
    };
    list.append(el("div", {class: "preset", "data-scenario": name, title: summary},
                   el("span", {}, name), el("div", {}, button("broken"), button("fixed"))));
  }
}

let lastEngine = null;

async function refreshPanel() {
  try {
    const engine = await api("GET", "/api/engine");
    if (lastEngine && engine.at > lastEngine.at) {
      state.tokensPerS = (engine.tokens_generated - lastEngine.tokens_generated) /
        (engine.at - lastEngine.at);
    }
    lastEngine = state.engine = engine;
  } catch (error) { state.engine = null; }
  try { state.gateway = await api("GET", "/api/gateway"); } catch (error) { state.gateway = null; }
  const e = state.engine || {}, g = state.gateway || {};
  const show = (v) => (v === undefined || v === null ? "–" : String(v));
  const rows = [
    ["engine", show(e.backend)], ["running", `${show(e.running)} / ${show(e.running_limit)}`],
    ["queued", show(e.queued)],
    ["tokens/s", state.tokensPerS === null ? "–" : state.tokensPerS.toFixed(0)],
    ["generations cancelled", show(e.generations_cancelled)],
    ["tokens after cancel", show(e.tokens_after_cancel)],
    ["gateway live streams", show(g.live_streams)], ["gateway heartbeats", show(g.heartbeats)],
    ["gateway tokens relayed", show(g.tokens_relayed)],
    ["polling jobs held", show(g.jobs_held)], ["resumable streams held", show(g.resume_streams_held)],
  ];
  $("#engine-figures").replaceChildren(...rows.flatMap(([k, v]) => [el("dt", {}, k),
                                                                    el("dd", {}, v)]));
}

// ---- wiring ---------------------------------------------------------------------------------------
document.addEventListener("click", (event) => {
  const target = event.target.closest("button[data-action]");
  if (!target) return;
  const action = target.dataset.action;
  if (action === "start") {
    const chosen = [...document.querySelectorAll("input[name=t]:checked")].map((b) => b.value);
    startStreams(chosen);
  } else if (action === "stop-all") {
    state.lanes.forEach((lane) => stop(lane));
  } else if (action === "clear") {
    clearLanes();
  } else if (action === "stop") {
    const lane = state.lanes.find((l) => l.id === Number(target.dataset.lane));
    if (lane) stop(lane);
  } else if (action === "reset-lab") {
    showHops(() => api("POST", "/api/reset")).catch(report);
  }
});

async function main() {
  state.lab = await api("GET", "/api/lab");
  $("#edge").textContent = `streams through the edge: ${state.lab.edge_url}`;
  state.tracing = await api("GET", "/api/trace").catch(() => ({tracing: false}));
  $("#waterfall-legend").hidden = !state.tracing.tracing;
  state.presets = await api("GET", "/api/presets");
  renderPresets();
  await refreshHops();
  await refreshPanel();
  setInterval(() => refreshPanel(), state.lab.panel_interval_ms);
  setInterval(() => refreshHops().catch(() => {}), 2000);
  // Timelines move while a stream is silent (a think pause, a black hole).
  setInterval(() => state.lanes.filter((l) => !l.ended).forEach(dirty), 250);
  state.ready = true;
}

main().catch(report);
