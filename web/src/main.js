// The page: starts the worker, shows the session live (server-sent events) and what this peer does.
// All Python runs in the worker; nothing here waits on it.
const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const peer = { state: "starting", versions: null, steps: [], worker: null, pending: new Map(), nextId: 1,
  session: null, activity: "not joined", unitsDone: 0, lastMetrics: null, refused: [], local: null, wantsJoin: params.has("join") };
window.peertrain = peer;
let chart = null;

function setState(state) {
  peer.state = state;
  $("state").textContent = state;
  document.body.dataset.state = state;
  if (state === "ready" && peer.session) $("join").disabled = !mayJoin();
  if (state === "ready") maybeJoin();
}

function setActivity(text, kind) {
  peer.activity = text;
  $("peer-activity").textContent = text;
  if (kind) document.body.dataset.peer = kind;
}

function showStep({ index, name, total, detail }) {
  const steps = $("steps");
  while (steps.children.length <= index) steps.appendChild(document.createElement("li"));
  [...steps.children].forEach((li, i) => { li.className = i < index ? "done" : i === index ? "active" : ""; });
  steps.children[index].textContent = detail ? `${name}: ${detail}` : name;
  $("progress").max = total;
  $("progress").value = index;
  peer.steps[index] = name;
  setState("loading");
}

function showVersions(versions, seconds) {
  const list = $("versions");
  list.replaceChildren();
  for (const [key, value] of Object.entries({ ...versions, "boot seconds": seconds.toFixed(1) })) {
    const dt = document.createElement("dt");
    dt.textContent = key;
    const dd = document.createElement("dd");
    dd.textContent = value;
    list.append(dt, dd);
  }
}

function fmt(value) {
  return typeof value === "number" ? (Math.abs(value) >= 100 ? value.toFixed(0) : value.toPrecision(4)) : "–";
}

// The metrics the chart can show: every validation metric the session has reported, and for a local task the
// peers' federated evaluation of the same metrics (``federated_<name>``).
const FEDERATED = "federated_";

function metricNames(session) {
  const names = new Set(Object.keys(session.initial_metrics || {}));
  for (const entry of session.history) {
    for (const key of Object.keys(entry.metrics || {})) names.add(key);
    for (const key of Object.keys((entry.federated || {}).metrics || {})) names.add(FEDERATED + key);
  }
  return [...names];
}

function chosenMetric(session) {
  const select = $("metric-select");
  const names = metricNames(session);
  const judged = (session.evaluation === "federated" ? FEDERATED : "") + session.metric;
  if (select.options.length !== names.length) {
    const keep = select.value || (session.evaluation === "federated" ? FEDERATED : "") + (session.task.plot_metric || session.metric);
    select.replaceChildren(...names.map((name) => new Option(name, name)));
    select.value = names.includes(keep) ? keep : judged;
  }
  return select.value || judged;
}

// x = rounds merged into the weights the point judges: the host validates after each merge (x = round + 1); a
// round's federated evaluation judges the weights that round started from (x = its of_round).
function hostPoints(session, name) {
  const points = new Map();
  if (session.initial_metrics && session.initial_metrics[name] !== undefined) points.set(0, session.initial_metrics[name]);
  for (const entry of session.history) if ((entry.metrics || {})[name] !== undefined) points.set(entry.round + 1, entry.metrics[name]);
  return points;
}

function federatedPoints(session, name) {
  const points = new Map();
  for (const entry of session.history) {
    const federated = entry.federated;
    if (federated && (federated.metrics || {})[name] !== undefined) points.set(federated.of_round, federated.metrics[name]);
  }
  return points;
}

function drawChart(session) {
  const metric = chosenMetric(session);
  const name = metric.startsWith(FEDERATED) ? metric.slice(FEDERATED.length) : metric;
  // Async mode validates every few merges: the chart has a point per validation, at its merge.
  const host = hostPoints(session, name);
  const federated = federatedPoints(session, name);
  const training = new Map(session.history.map((entry) => [entry.round + 1, (entry.train || {}).train_loss ?? (entry.train || {}).mean_return ?? null]));
  const labels = [...new Set([...host.keys(), ...federated.keys()])].sort((a, b) => a - b);
  const at = (points) => labels.map((label) => (points.has(label) ? points.get(label) : null));
  const best = session.best && session.best.round !== null && session.best.round !== undefined ? session.best.round + 1 : 0;
  // The initial point and the best round are drawn larger.
  const radius = labels.map((label) => (label === 0 || (label === best && name === session.metric) ? 6 : 2));
  $("metric-name").textContent = metric;
  peer.chartMetric = metric;
  peer.chartPoints = labels.length;
  if (typeof Chart === "undefined") return;
  const datasets = [];
  if (host.size) datasets.push({ label: name, data: at(host), borderColor: "#2f6fdf", tension: 0.1, pointRadius: radius, yAxisID: "y", spanGaps: true });
  if (federated.size) {
    datasets.push({ label: `${name}, federated (peers' held-out examples)`, data: at(federated), borderColor: "#1b7f3b",
      tension: 0.1, pointRadius: radius, yAxisID: "y", spanGaps: true });
  }
  datasets.push({ label: "local training loss (mean of the units)", data: at(training), borderColor: "#d9822b",
    borderDash: [4, 3], tension: 0.1, pointRadius: 1, yAxisID: "y1", spanGaps: true });
  if (!chart) {
    chart = new Chart($("chart"), {
      type: "line",
      data: { labels, datasets },
      options: { animation: false, responsive: true, scales: { x: { title: { display: true, text: "round" } },
        y: { position: "left" }, y1: { position: "right", grid: { drawOnChartArea: false } } } },
    });
  } else {
    chart.data.labels = labels;
    chart.data.datasets = datasets;
    chart.update();
  }
}

function showTiming(session) {
  const times = session.history.map((entry) => entry.time).filter((t) => typeof t === "number");
  if (times.length < 2) { $("timing").textContent = "Round timing: after two rounds"; return; }
  const gaps = times.slice(1).map((t, i) => t - times[i]).sort((a, b) => a - b);
  const median = gaps[Math.floor(gaps.length / 2)];
  const left = Math.max(0, session.num_rounds - session.round);
  $("timing").textContent = session.done ? `Round timing: ${median.toFixed(1)} s per round (median)`
    : `Round timing: ${median.toFixed(1)} s per round (median); about ${Math.ceil((median * left) / 60)} min left for ${left} round${left === 1 ? "" : "s"}`;
}

function ago(seconds) {
  return seconds < 90 ? `${seconds.toFixed(0)} s ago` : `${(seconds / 60).toFixed(0)} min ago`;
}

function showParticipants(session) {
  const rows = (session.participants || []).map((p) => {
    const tr = document.createElement("tr");
    tr.dataset.peer = p.peer;
    for (const value of [p.peer, p.device || "–", String(p.units_done),
      p.median_unit_seconds === null ? "–" : `${p.median_unit_seconds.toFixed(1)} s`, ago(p.last_seen_seconds),
      String(p.refusals), p.banned ? "banned" : "no"]) {
      const td = document.createElement("td");
      td.textContent = value;
      tr.append(td);
    }
    return tr;
  });
  $("participants").tBodies[0].replaceChildren(...rows);
}

function showDownload(session) {
  $("download-public").hidden = !session.public_model;
  $("download-form").hidden = Boolean(session.public_model);
}

const KINDS = { data: "data chunks", experience: "plays its own episodes", local: "trains on each peer's own files" };

function showFederated(session) {
  const local = session.task.kind === "local";
  $("federated-label").hidden = !local;
  $("federated").hidden = !local;
  const last = [...session.history].reverse().find((entry) => entry.federated);
  if (!local) return;
  const judged = session.evaluation === "federated" ? " (this session's metric: the host holds no validation split)" : " (beside the host's validation)";
  $("federated").textContent = !last ? `none yet${judged}`
    : `${Object.entries(last.federated.metrics).map(([k, v]) => `${k} ${fmt(v)}`).join(", ")} on ${last.federated.examples} held-out examples of ${last.federated.results} result${last.federated.results === 1 ? "" : "s"}, of the weights after ${last.federated.of_round} round${last.federated.of_round === 1 ? "" : "s"}${judged}`;
}

function showLocal(session) {
  const local = session.task.local;
  $("local-section").hidden = !local;
  if (!local) return;
  $("local-hint").textContent = local.hint ? `Choose ${local.hint}. A unit trains on at most ${local.max_examples_per_unit} of your examples.` : "";
  if (local.accept && !$("local-files").accept) $("local-files").accept = local.accept;
}

// A peer may join once Pyodide is up and, for a local task, once its files give enough examples.
function mayJoin() {
  const session = peer.session;
  return Boolean(session) && !session.done && !peer.joined && peer.state === "ready"
    && (session.task.kind !== "local" || Boolean(peer.local && peer.local.ready));
}

function showSession(session) {
  peer.session = session;
  $("task-name").textContent = `${session.task.name} (${KINDS[session.task.kind] || session.task.kind})`;
  $("task-boundary").textContent = session.task.crosses_boundary;
  $("merge").textContent = `${session.merge} · ${session.plan.participants_per_round} units per round · ${session.plan.passes} passes`;
  const p = session.peers;
  $("peers").textContent = `${p.connected} connected (${p.joined} joined); a round starts with ${p.needed}`;
  $("round").textContent = `${Math.min(session.round + 1, session.num_rounds)} of ${session.num_rounds}`;
  $("round-progress").max = session.round_progress.slots || 1;
  $("round-progress").value = session.round_progress.done;
  const waiting = Math.max(0, p.needed - p.connected);
  $("session-status").textContent = session.done ? `finished: ${session.stopped || "all rounds done"}`
    : session.paused ? "paused by the host" : session.merging ? "merging and validating the round"
    : waiting > 0 && session.round_progress.done === 0 ? `waiting for ${waiting} more peer${waiting > 1 ? "s" : ""}`
    : `training: ${session.round_progress.done}/${session.round_progress.slots} units back`
      + (session.round_progress.copies ? `, ${session.round_progress.copies} backup or second cop${session.round_progress.copies > 1 ? "ies" : "y"} out` : "");
  const last = session.history[session.history.length - 1];
  $("async").textContent = session.mode !== "async" ? "off (rounds wait for their units)"
    : `weights version ${session.round}; ${session.round_progress.done} of ${session.round_progress.slots} results in the buffer; `
      + (last && last.staleness ? `last merge: results ${last.staleness.join(", ")} versions stale` : "no merge yet");
  $("backups").textContent = last && last.backups
    ? `round ${last.round + 1}: units ${last.backups.units.join(", ")} got a backup; ${last.backups.won.length ? `the backup of ${last.backups.won.join(", ")} came first` : "the originals came first"}`
    : "none in the last round";
  const refused = Object.entries(session.counters).filter(([k]) => k.startsWith("refused."));
  $("refusals").textContent = refused.length ? refused.map(([k, v]) => `${k.slice(8)}: ${v}`).join(", ") : "0";
  const defenses = session.defenses || { guards: [], not_covered: [] };
  $("defenses").replaceChildren(...defenses.guards.map((text) => {
    const li = document.createElement("li");
    li.textContent = text;
    return li;
  }));
  $("not-covered").textContent = defenses.not_covered.join("; ");
  $("samples").replaceChildren(...session.samples.map((sample) => {
    const li = document.createElement("li");
    li.textContent = sample.text;
    if (sample.ok !== null) li.className = sample.ok ? "ok" : "wrong";
    return li;
  }));
  showLocal(session);
  showFederated(session);
  drawChart(session);
  showTiming(session);
  showParticipants(session);
  showDownload(session);
  const hint = session.task.respond_hint;
  $("try-section").hidden = !hint;
  if (hint && !$("try-prompt").placeholder) { $("try-prompt").placeholder = hint; $("try-prompt").value = hint; }
  $("join").disabled = !mayJoin();
  maybeJoin();
}

function follow() {
  fetch("/api/session").then((response) => {
    if (response.status === 404) { $("no-session").hidden = false; $("session-facts").hidden = true; return; }
    const events = new EventSource("/api/events");
    events.onmessage = (event) => showSession(JSON.parse(event.data));
  });
}

// "Try the model": the worker answers with the current global weights (between its units).
peer.ask = (prompt) => new Promise((resolve, reject) => {
  const id = peer.nextId++;
  peer.pending.set(id, { resolve, reject, respond: true });
  peer.worker.postMessage({ type: "respond", id, prompt });
});

function drawEpisode(frames) {
  const canvas = $("try-canvas");
  canvas.hidden = false;
  const context = canvas.getContext("2d");
  let index = 0;
  const draw = () => {
    const [x, theta] = frames[Math.min(index, frames.length - 1)];
    context.clearRect(0, 0, canvas.width, canvas.height);
    const cx = canvas.width / 2 + (x / 2.4) * (canvas.width / 2 - 20);
    context.fillStyle = "#444";
    context.fillRect(0, canvas.height - 20, canvas.width, 2);
    context.fillRect(cx - 20, canvas.height - 34, 40, 14);
    context.strokeStyle = "#d9822b";
    context.lineWidth = 5;
    context.beginPath();
    context.moveTo(cx, canvas.height - 34);
    context.lineTo(cx + 70 * Math.sin(theta), canvas.height - 34 - 70 * Math.cos(theta));
    context.stroke();
    index += 1;
    if (index < frames.length) requestAnimationFrame(draw);
  };
  draw();
}

async function tryModel(event) {
  event.preventDefault();
  const prompt = $("try-prompt").value;
  $("try-answer").textContent = "asking the model (it answers between units)…";
  try {
    const answer = await peer.ask(prompt);
    peer.lastAnswer = answer;
    $("try-answer").textContent = answer.error ? `refused: ${answer.error}` : `${answer.text} (weights of round ${answer.round})`;
    if (answer.frames) drawEpisode(answer.frames);
  } catch (error) {
    $("try-answer").textContent = String(error.message || error);
  }
}

let adminToken = null; // typed into the page, kept in memory only

async function download(event) {
  event.preventDefault();
  adminToken = $("admin-token").value || adminToken;
  $("admin-token").value = "";
  $("download-status").textContent = "downloading…";
  const response = await fetch("/api/model", { headers: adminToken ? { Authorization: `Bearer ${adminToken}` } : {} });
  if (!response.ok) {
    let detail = {};
    try { detail = await response.json(); } catch { /* not JSON */ }
    $("download-status").textContent = `refused: ${detail.message || response.status}`;
    peer.downloaded = { ok: false, status: response.status };
    return;
  }
  const blob = await response.blob();
  const link = document.createElement("a");
  link.href = URL.createObjectURL(blob);
  link.download = "model.safetensors";
  link.click();
  URL.revokeObjectURL(link.href);
  peer.downloaded = { ok: true, bytes: blob.size };
  $("download-status").textContent = `downloaded ${(blob.size / 1e6).toFixed(2)} MB`;
}

function join() {
  peer.wantsJoin = true;
  maybeJoin();
}

// Join when asked to (the button, ?join=1) as soon as that is possible: a local task waits for a valid file.
function maybeJoin() {
  if (!peer.wantsJoin || !mayJoin()) {
    if (peer.wantsJoin && !peer.joined && peer.session && !peer.session.done && peer.session.task.kind === "local" && peer.state === "ready") {
      setActivity("choose files to train on (they stay in this browser)", "waiting");
    }
    return;
  }
  peer.joined = true;
  $("join").disabled = true;
  setActivity("joining", "joining");
  peer.worker.postMessage({ type: "join", joinCode: $("join-code").value || params.get("code") || "",
    device: params.get("device") || "cpu" });
}

// Run Python in the worker; resolves with the value (a string) or rejects with the error. The worker
// answers only on a page opened for testing (?test=1) and refuses otherwise.
peer.run = (code) => new Promise((resolve, reject) => {
  const id = peer.nextId++;
  peer.pending.set(id, { resolve, reject });
  peer.worker.postMessage({ type: "run", id, code });
});

// Local tasks: the chosen files are read here (File API) and their bytes handed to the worker; nothing is uploaded.
async function readFiles(files) {
  const chosen = [];
  for (const { file, name } of files) chosen.push({ name: name || file.webkitRelativePath || file.name, bytes: await file.arrayBuffer() });
  if (!chosen.length) return;
  $("local-summary").textContent = `reading ${chosen.length} file${chosen.length === 1 ? "" : "s"}…`;
  peer.worker.postMessage({ type: "files", files: chosen }, chosen.map((file) => file.bytes));
}

// The files under a dropped entry (a folder is read recursively), named by their path inside it.
async function entryFiles(entry) {
  if (entry.isFile) return [{ file: await new Promise((resolve, reject) => entry.file(resolve, reject)), name: entry.fullPath.replace(/^\//, "") }];
  const reader = entry.createReader();
  const found = [];
  for (;;) {
    const batch = await new Promise((resolve, reject) => reader.readEntries(resolve, reject));
    if (!batch.length) return found;
    for (const child of batch) found.push(...await entryFiles(child));
  }
}

async function dropped(event) {
  event.preventDefault();
  $("local-drop").classList.remove("over");
  const entries = [...event.dataTransfer.items].map((item) => item.webkitGetAsEntry && item.webkitGetAsEntry()).filter(Boolean);
  const files = entries.length ? (await Promise.all(entries.map(entryFiles))).flat()
    : [...event.dataTransfer.files].map((file) => ({ file }));
  await readFiles(files);
}

function showLocalSummary(summary) {
  peer.local = summary;
  $("local-summary").textContent = summary.ready
    ? `${summary.examples} examples in ${summary.valid_files} file${summary.valid_files === 1 ? "" : "s"}: ${summary.train} for training, ${summary.held_out} held out for federated evaluation`
    : summary.valid_files ? `only ${summary.train} training examples; this task needs ${summary.needed}`
      : "no valid file yet: training starts once one valid file is read";
  $("local-report").replaceChildren(...summary.files.map((file) => {
    const li = document.createElement("li");
    li.textContent = file.error ? `refused: ${file.error}` : `${file.name}: ${file.examples} examples (${(file.size / 1024).toFixed(1)} kB)`;
    li.className = file.error ? "wrong" : "ok";
    return li;
  }));
  $("join").disabled = !mayJoin();
  maybeJoin();
}

const handlers = {
  step: showStep,
  ready(message) {
    [...$("steps").children].forEach((li) => (li.className = "done"));
    $("progress").value = $("progress").max;
    peer.versions = message.versions;
    showVersions(message.versions, message.seconds);
    setState("ready");
  },
  failed(message) {
    $("error").hidden = false;
    $("error").textContent = message.message;
    setState("failed");
  },
  response(message) {
    const waiting = peer.pending.get(message.id);
    peer.pending.delete(message.id);
    if (waiting) waiting.resolve(message);
  },
  result(message) {
    const waiting = peer.pending.get(message.id);
    peer.pending.delete(message.id);
    if (waiting) (message.error ? waiting.reject(new Error(message.error)) : waiting.resolve(message.value));
  },
  log(message) { console[message.level === "error" ? "error" : "log"](message.message); },
  joined(message) { peer.peerId = message.peerId; $("device").textContent = message.device; setActivity("joined", "joined"); },
  device(message) { // the device choice: { chosen, requested, cpu_ms, webgpu_ms, reason, description }
    peer.device = { chosen: message.chosen, requested: message.requested, cpu_ms: message.cpu_ms,
      webgpu_ms: message.webgpu_ms, reason: message.reason };
    $("device").textContent = message.description;
  },
  waiting(message) { setActivity(message.reason, "waiting"); },
  training(message) {
    const what = { backup: "a backup of a slow peer's unit", redundancy: "a second copy (compared with another peer's) of unit" };
    const copy = what[message.job.copy] ? `${what[message.job.copy]} ` : "unit ";
    const carried = message.job.carried_from !== undefined ? ` (carried from round ${message.job.carried_from + 1}, where the deadline passed without it)` : "";
    setActivity(`training ${copy}${message.job.unit_index} of round ${message.job.round + 1}${carried}`, "training");
  },
  uploaded(message) {
    peer.unitsDone += 1;
    peer.lastMetrics = message.metrics;
    const loss = message.metrics.train_loss ?? message.metrics.mean_return;
    $("last-unit").textContent = `unit ${message.job.unit_index}, local ${message.metrics.train_loss !== undefined ? "loss" : "return"} ${fmt(loss)}, ${message.seconds.toFixed(1)} s`;
    setActivity(`uploaded unit ${message.job.unit_index} (${peer.unitsDone} so far)`, "uploaded");
  },
  refused(message) { peer.refused.push(message.code); setActivity(`result refused: ${message.message}`, "refused"); },
  offline(message) { setActivity(`relay unreachable (${message.message}); retrying in ${message.retryIn.toFixed(0)} s`, "offline"); },
  banned(message) {
    peer.banned = message.message;
    setActivity(`banned from this session: ${message.message}`, "banned");
    $("error").hidden = false;
    $("error").textContent = `This peer was banned: ${message.message}`;
  },
  finished(message) { setActivity(`session finished: ${message.reason}`, "finished"); },
  local(message) {
    if (message.error) { $("local-summary").textContent = `the files could not be read: ${message.error}`; return; }
    showLocalSummary(message.summary);
  },
};

// A module worker (`import` of /pyodide/pyodide.mjs); its boot options come in its first message:
// ?blas=numpy keeps numpy's own matmul, ?test=1 lets the "run" hook (window.peertrain.run) answer.
peer.worker = new Worker("/src/worker.js", { type: "module" });
peer.worker.onmessage = (event) => {
  const handler = handlers[event.data.type];
  if (handler) handler(event.data);
  else console.error(`the page got an unknown message from the worker: ${event.data.type}`);
};
peer.worker.onerror = (event) => handlers.failed({ message: `worker error: ${event.message || "the worker script did not load"}` });
peer.worker.postMessage({ type: "boot", blas: params.get("blas") || "", test: params.get("test") === "1" });
$("join").addEventListener("click", join);
$("try-form").addEventListener("submit", tryModel);
$("download-form").addEventListener("submit", download);
$("metric-select").addEventListener("change", () => { if (peer.session) drawChart(peer.session); });
for (const id of ["local-files", "local-folder"]) {
  $(id).addEventListener("change", (event) => { readFiles([...event.target.files].map((file) => ({ file }))); event.target.value = ""; });
}
$("local-drop").addEventListener("dragover", (event) => { event.preventDefault(); $("local-drop").classList.add("over"); });
$("local-drop").addEventListener("dragleave", () => $("local-drop").classList.remove("over"));
$("local-drop").addEventListener("drop", (event) => { dropped(event); });
$("local-clear").addEventListener("click", () => peer.worker.postMessage({ type: "clearFiles" }));
follow();
