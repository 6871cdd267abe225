// The worker: its start (Pyodide boots there), the one table of handlers for its messages, and the page's
// requests to it (window.peertrain.run and .ask). All Python runs in the worker; nothing here waits on it.
import { showLocalFiles } from "./local_files.js";
import { $, fmt, params, peer, setActivity, setState } from "./peer.js";

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

const handlers = {
  step: showStep,
  ready(message) {
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
    peer.bytes = { sent: peer.bytes.sent + message.sent, received: peer.bytes.received + message.received };
    $("last-unit").textContent = `unit ${message.job.unit_index}, local ${message.metrics.train_loss !== undefined ? "loss" : "return"} ${fmt(loss)}, ${message.seconds.toFixed(1)} s; `
      + `sent ${kilobytes(message.sent)}, received ${kilobytes(message.received)} (this page so far: ${kilobytes(peer.bytes.sent)} sent, ${kilobytes(peer.bytes.received)} received)`;
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
  residual(message) { peer.residualRestored = message.restored; }, // entries of topk's residual kept from before
  outdated(message) {
    setActivity(`stopped: ${message.message}`, "outdated");
    $("error").hidden = false;
    $("error").textContent = `This page is out of date for the relay (${message.message}). Reload the page to train again.`;
  },
  finished(message) { setActivity(`session finished: ${message.reason}`, "finished"); },
  local: showLocalFiles,
};

// A module worker (`import` of /pyodide/pyodide.mjs); its boot options come in its first message:
// ?blas=numpy keeps numpy's own matmul, ?test=1 lets the "run" hook (window.peertrain.run) answer.
export function startWorker() {
  peer.worker = new Worker("/src/worker.js", { type: "module" });
  peer.worker.onmessage = (event) => {
    const handler = handlers[event.data.type];
    if (handler) handler(event.data);
    else console.error(`the page got an unknown message from the worker: ${event.data.type}`);
  };
  peer.worker.onerror = (event) => handlers.failed({ message: `worker error: ${event.message || "the worker script did not load"}` });
  peer.worker.postMessage({ type: "boot", blas: params.get("blas") || "", test: params.get("test") === "1" });
}
