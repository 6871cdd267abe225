// The page's training workers: their start (Pyodide boots in each), the one table of handlers for their messages,
// and the page's requests to the first (window.peertrain.run and .ask). All Python runs in the workers; nothing here
// waits on it. Worker 0 is the page's own: its boot steps, versions and device are the page's; every worker is a
// peer of its own (its record in peer.workers), and the page's counts are their sums.
import { showLocalFiles } from "./local_files.js";
import { $, fmt, joinWorker, params, peer, setActivity, setState } from "./peer.js";

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

// "Try the model": the worker answers with the current global weights (between its units).
peer.ask = (prompt) => new Promise((resolve, reject) => {
  const id = peer.nextId++;
  peer.pending.set(id, { resolve, reject, respond: true });
  peer.worker.postMessage({ type: "respond", id, prompt });
});

// Run Python in the worker; resolves with the value (a string) or rejects with the error. The worker
// answers only on a page opened for testing (?test=1) and refuses otherwise.
peer.run = (code) => new Promise((resolve, reject) => {
  const id = peer.nextId++;
  peer.pending.set(id, { resolve, reject });
  peer.worker.postMessage({ type: "run", id, code });
});

// Bytes in words: the volunteer's own traffic for each unit.
const kilobytes = (bytes) => (bytes >= 1e6 ? `${(bytes / 1e6).toFixed(2)} MB` : `${(bytes / 1e3).toFixed(1)} kB`);

// A worker's own line in "This peer" (several workers only), and the page's activity line.
function activity(record, text, kind) {
  record.activity = text;
  record.kind = kind;
  peer.onWorkerChange();
  setActivity(peer.workers.length > 1 ? `worker ${record.index + 1}: ${text}` : text, kind);
}

// Handlers get the worker's record and its message. Boot steps, versions and failures of worker 0 are the page's.
const handlers = {
  step(record, message) { if (record.index === 0) showStep(message); },
  ready(record, message) {
    record.state = "ready";
    record.heapBytes = message.heapBytes;
    record.bootSeconds = message.seconds;
    if (record.index !== 0) { joinWorker(record); return; }
    [...$("steps").children].forEach((li) => (li.className = "done"));
    $("progress").value = $("progress").max;
    peer.versions = message.versions;
    // What this browser offers the page: WebGPU and the worker's threads need a secure context (HTTPS, or this
    // machine) and cross-origin isolation (the relay's COOP/COEP headers).
    peer.context = { secure: window.isSecureContext, isolated: window.crossOriginIsolated, webgpu: "gpu" in navigator };
    showVersions({ ...message.versions,
      "secure context": peer.context.secure ? "yes" : "no: open the page over HTTPS for WebGPU",
      "cross-origin isolated": peer.context.isolated ? "yes" : "no",
      WebGPU: peer.context.webgpu ? "offered" : "not offered" }, message.seconds);
    setState("ready");
    peer.onFirstReady();
  },
  failed(record, message) {
    record.state = "failed";
    record.error = message.message;
    if (record.index !== 0) { console.error(`worker ${record.index + 1} failed: ${message.message}`); return; }
    $("error").hidden = false;
    $("error").textContent = message.message;
    setState("failed");
  },
  response(record, message) {
    const waiting = peer.pending.get(message.id);
    peer.pending.delete(message.id);
    if (waiting) waiting.resolve(message);
  },
  result(record, message) {
    const waiting = peer.pending.get(message.id);
    peer.pending.delete(message.id);
    if (waiting) (message.error ? waiting.reject(new Error(message.error)) : waiting.resolve(message.value));
  },
  log(record, message) { console[message.level === "error" ? "error" : "log"](`worker ${record.index + 1}: ${message.message}`); },
  joined(record, message) {
    record.peerId = message.peerId;
    record.token = message.token;
    record.joined = true;
    if (record.index === 0 || !peer.peerId) peer.peerId = message.peerId; // (the page's id: its first worker's)
    if (record.index === 0) $("device").textContent = message.device;
    activity(record, "joined", "joined");
  },
  device(record, message) { // the device choice: { chosen, requested, cpu_ms, webgpu_ms, reason, description }
    record.device = { chosen: message.chosen, requested: message.requested, cpu_ms: message.cpu_ms,
      webgpu_ms: message.webgpu_ms, reason: message.reason };
    if (record.index !== 0) return;
    peer.device = record.device;
    $("device").textContent = message.description;
  },
  waiting(record, message) { activity(record, message.reason, "waiting"); },
  training(record, message) {
    const what = { backup: "a backup of a slow peer's unit" }; // (a redundancy check's job does not say it is one)
    const copy = what[message.job.copy] ? `${what[message.job.copy]} ` : "unit ";
    const carried = message.job.carried_from !== undefined ? ` (carried from round ${message.job.carried_from + 1}, where the deadline passed without it)` : "";
    activity(record, `training ${copy}${message.job.unit_index} of round ${message.job.round + 1}${carried}`, "training");
  },
  uploaded(record, message) {
    record.unitsDone += 1;
    record.heapBytes = message.heapBytes;
    peer.unitsDone += 1;
    peer.lastMetrics = message.metrics;
    const loss = message.metrics.train_loss ?? message.metrics.mean_return;
    peer.bytes = { sent: peer.bytes.sent + message.sent, received: peer.bytes.received + message.received };
    $("last-unit").textContent = `unit ${message.job.unit_index}, local ${message.metrics.train_loss !== undefined ? "loss" : "return"} ${fmt(loss)}, ${message.seconds.toFixed(1)} s; `
      + `sent ${kilobytes(message.sent)}, received ${kilobytes(message.received)} (this page so far: ${kilobytes(peer.bytes.sent)} sent, ${kilobytes(peer.bytes.received)} received)`;
    activity(record, `uploaded unit ${message.job.unit_index} (${peer.unitsDone} so far)`, "uploaded");
  },
  refused(record, message) { peer.refused.push(message.code); activity(record, `result refused: ${message.message}`, "refused"); },
  offline(record, message) { activity(record, `relay unreachable (${message.message}); retrying in ${message.retryIn.toFixed(0)} s`, "offline"); },
  banned(record, message) {
    record.banned = message.message;
    peer.banned = message.message;
    activity(record, `banned from this session: ${message.message}`, "banned");
    $("error").hidden = false;
    $("error").textContent = `This peer was banned: ${message.message}`;
  },
  residual(record, message) { peer.residualRestored = message.restored; }, // entries of topk's residual kept from before
  outdated(record, message) {
    activity(record, `stopped: ${message.message}`, "outdated");
    $("error").hidden = false;
    $("error").textContent = `This page is out of date for the relay (${message.message}). Reload the page to train again.`;
  },
  finished(record, message) { record.finished = true; activity(record, `session finished: ${message.reason}`, "finished"); },
  left(record) { record.joined = false; peer.onLeft(record); },
  local(record, message) { if (record.index === 0) showLocalFiles(message); },
};

// A module worker (`import` of /pyodide/pyodide.mjs); its boot options come in its first message:
// ?blas=numpy keeps numpy's own matmul, ?test=1 lets the "run" hook (window.peertrain.run) answer. Returns the
// worker's record (peer.workers); it boots at once.
export function startWorker(index) {
  const record = { index, worker: new Worker("/src/worker.js", { type: "module" }), state: "starting", peerId: null,
    token: null, joined: false, unitsDone: 0, activity: "starting", kind: "", device: null, heapBytes: null,
    bootSeconds: null, banned: null, finished: false, stopping: false, error: null };
  record.worker.onmessage = (event) => {
    const handler = handlers[event.data.type];
    if (handler) handler(record, event.data);
    else console.error(`the page got an unknown message from worker ${index + 1}: ${event.data.type}`);
  };
  record.worker.onerror = (event) => handlers.failed(record, { message: `worker error: ${event.message || "the worker script did not load"}` });
  record.worker.postMessage({ type: "boot", blas: params.get("blas") || "", test: params.get("test") === "1" });
  if (peer.localFiles.length) record.worker.postMessage({ type: "files", files: peer.localFiles });
  return record;
}
