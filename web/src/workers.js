// How many cores the volunteer gives: one training worker per core, each a peer of its own (its own token and
// leases), so the relay's checks, bans and replays see each worker as they see a page. The default leaves a core for
// the page and the rest of the machine, fits the machine's memory (navigator.deviceMemory, where the browser gives
// it) and the relay's cap on live peers per address; the volunteer's choice (the "Cores" control, 0 pauses) is
// remembered across visits; ?workers=N (headless peers, tests) wins over both for this visit.
//
// Worker 0 boots first and alone, so the Pyodide assets come over the network once; the others boot in parallel
// after it, from the browser's cache. A worker given back finishes the unit in hand, uploads it and leaves the session
// (its leases freed at once); worker 0 then stays booted and idle (it answers "Try the model"), the others end.
// Closing the page tells the relay that every worker leaves (a keepalive request per worker), so their units go to
// other peers at once instead of waiting out their leases.
//
// The volunteer's rules (guest.js) pause the workers the same way without changing the count given: while
// peer.pausedFor says why, no worker trains (trainingCores() is 0), and the workers within the count stay booted and
// idle, so resuming is quick and each comes back as the same peer.
import { startWorker } from "./boot.js";
import { $, joinWorker, params, peer, setActivity, showValue, trainingCores } from "./peer.js";

const STORED = "peertrain.cores";
// One worker's memory with the largest built-in model (bytelm-2.3mb) while it trains: its Pyodide's WebAssembly heap
// measured 124 MB (`peertrain bench workers`; BENCHMARKS.md, "Workers per page"), doubled for what the heap does not
// hold (the worker's JavaScript heap, compiled code, fetched buffers).
const WORKER_MB = 256;
const MEMORY_SHARE = 0.5; // of the machine's memory the page's workers may take together

export function coreLimit() {
  const cores = navigator.hardwareConcurrency || 1;
  const byMemory = navigator.deviceMemory ? Math.floor((navigator.deviceMemory * 1024 * MEMORY_SHARE) / WORKER_MB) : cores;
  return Math.max(1, Math.min(cores, byMemory));
}

const defaultCores = () => Math.max(1, Math.min(coreLimit(), (navigator.hardwareConcurrency || 1) - 1));

function clamp(value, limit) {
  const number = Number.parseInt(value, 10);
  return Number.isFinite(number) ? Math.max(0, Math.min(limit, number)) : null;
}

// The relay's cap on live peers per address (0: none), from the session status; the control never offers more.
function relayCap() {
  const cap = peer.session && peer.session.peers ? peer.session.peers.per_address : 0;
  return cap > 0 ? cap : Infinity;
}

function chosenCores() {
  let stored = null;
  try { stored = localStorage.getItem(STORED); } catch { /* storage refused: the default */ }
  return clamp(params.get("workers"), peer.coreLimit) ?? clamp(stored, peer.coreLimit) ?? defaultCores();
}

export function showWorkers() {
  const list = $("workers");
  list.hidden = peer.workers.length < 2;
  list.replaceChildren(...peer.workers.map((record) => {
    const li = document.createElement("li");
    li.dataset.worker = String(record.index);
    li.textContent = `worker ${record.index + 1}${record.peerId ? ` (${record.peerId})` : ""}: ${record.activity}; ${record.unitsDone} unit${record.unitsDone === 1 ? "" : "s"}`;
    return li;
  }));
  showValue("cores", String(peer.cores));
  $("cores-note").textContent = peer.cores === 0 ? "paused: no core given"
    : `${peer.cores} of this machine's ${navigator.hardwareConcurrency || 1} cores train (at most ${peer.coreLimit} offered)`;
  $("guest-status").textContent = whatTheWorkersDo();
}

// The status line under "Join and train": why the page pauses or rests, in the words of the rule.
function whatTheWorkersDo() {
  const busy = peer.workers.filter((record) => record.joined);
  if (peer.pausedFor) {
    return busy.length ? `${peer.pausedFor} (the unit in hand finishes and uploads first)` : peer.pausedFor;
  }
  if (peer.cores === 0) return "paused: no core given";
  if (!peer.joined) return peer.state === "failed" ? "cannot train: see the error below" : "not training: not joined yet";
  if (peer.workers.length && peer.workers.every((record) => record.finished)) return "the session is over";
  const share = `CPU share ${Math.round(peer.share * 100)} %`;
  if (busy.length && busy.every((record) => record.activity.startsWith("resting"))) return `resting: ${share}`;
  return peer.share < 1 ? `training (${share})` : "training";
}

// The CPU share to every worker (each keeps its own duty cycle: worker.js).
export function sendShare() {
  for (const record of peer.workers) record.worker.postMessage({ type: "share", share: peer.share });
}

const workerAt = (index) => peer.workers.find((record) => record.index === index);

function end(record) {
  record.worker.terminate();
  peer.workers = peer.workers.filter((other) => other !== record);
}

// Start, join, or give back workers until `cores` of them train (none while a rule pauses the page). Workers past
// the first start only once the first is booted (its assets are then in the browser's cache).
export function setCores(cores) {
  peer.cores = Math.max(0, Math.min(cores, peer.coreLimit, relayCap()));
  const training = trainingCores();
  const first = workerAt(0);
  for (let index = 0; index < Math.max(1, training); index += 1) {
    let record = workerAt(index);
    if (!record) {
      if (first.state !== "ready") break;
      record = startWorker(index);
      record.worker.postMessage({ type: "share", share: peer.share });
      peer.workers = [...peer.workers, record].sort((a, b) => a.index - b.index);
    }
    record.stopping = false;
    joinWorker(record);
  }
  for (const record of peer.workers.filter((other) => other.index >= training)) {
    if (record.stopping) continue;
    if (!record.joined) { // (booting, or idle: nothing to hand back; kept while paused within the cores given)
      if (record.index > 0 && record.index >= peer.cores) end(record);
      continue;
    }
    record.stopping = true;
    record.worker.postMessage({ type: "stop" });
  }
  showWorkers();
}

// A worker given back has uploaded what it had and left: worker 0 stays for "Try the model", the others end.
peer.onLeft = (record) => {
  record.stopping = false;
  if (record.index >= peer.cores && record.index > 0) end(record);
  else joinWorker(record); // (given again while it was leaving, or the pause ended meanwhile)
  if (peer.pausedFor && !peer.workers.some((other) => other.joined)) setActivity(peer.pausedFor, "paused");
  showWorkers();
};

// The first worker's assets are in the browser's cache now: the others boot from there, in parallel.
peer.onFirstReady = () => setCores(peer.cores);
peer.onWorkerChange = showWorkers;

function leaveAll() {
  for (const record of peer.workers) {
    if (!record.token || !record.joined) continue;
    fetch("/api/leave", { method: "POST", keepalive: true, headers: { Authorization: `Bearer ${record.peerId}:${record.token}` } })
      .catch(() => {});
  }
}

// The page's longest task on its main thread (a PerformanceObserver of long tasks: 50 ms or more).
function watchLongTasks() {
  if (!("PerformanceObserver" in window) || !PerformanceObserver.supportedEntryTypes.includes("longtask")) return;
  new PerformanceObserver((list) => {
    for (const entry of list.getEntries()) peer.longestTaskMs = Math.max(peer.longestTaskMs, entry.duration);
  }).observe({ type: "longtask", buffered: true });
}

export function startWorkers() {
  peer.coreLimit = coreLimit();
  $("cores").max = String(peer.coreLimit);
  peer.cores = chosenCores();
  // Worker 0 alone first; setCores runs again once it is ready (peer.onFirstReady).
  peer.workers = [startWorker(0)];
  peer.worker = peer.workers[0].worker;
  showWorkers();
  $("cores").addEventListener("change", () => {
    const cores = clamp($("cores").value, peer.coreLimit) ?? peer.cores;
    try { localStorage.setItem(STORED, String(cores)); } catch { /* not remembered */ }
    setCores(cores);
    showValue("cores", String(peer.cores), true);
  });
  window.addEventListener("pagehide", leaveAll);
  watchLongTasks();
}
