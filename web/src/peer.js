// This peer's state, shared by the page's modules and exposed as window.peertrain (tests and `peertrain peers`
// read it), and the join: a peer joins once it is asked to and may.
import { volunteerProfile } from "./identity.js";

export const $ = (id) => document.getElementById(id);
// Show a control's value, unless the volunteer is typing into it: a re-render (each unit redraws the page) between
// their keystrokes and Enter would otherwise put the old value back and their change would be lost. A control's own
// change handler shows the outcome with force (a value clamped to what the machine allows).
export function showValue(id, value, force = false) {
  const control = $(id);
  if (force || document.activeElement !== control) control.value = value;
}
export const params = new URLSearchParams(location.search);
export const peer = { state: "starting", versions: null, steps: [], worker: null, pending: new Map(), nextId: 1,
  session: null, activity: "not joined", unitsDone: 0, lastMetrics: null, refused: [], local: null, wantsJoin: params.has("join"),
  bytes: { sent: 0, received: 0 }, context: null, workers: [], cores: 0, coreLimit: 1, localFiles: [], longestTaskMs: 0,
  pausedFor: "", share: 1, onFirstReady: () => {}, onLeft: () => {}, onWorkerChange: () => {} };
// (bytes: this page's uploads and downloads for its units; context: a secure context, cross-origin isolation, WebGPU
// offered, once the first worker is ready; workers: a record per training worker, worker: the first one's Worker;
// cores: how many workers the volunteer gives, coreLimit: the most the control offers; pausedFor: why the
// volunteer's rules pause every worker now ("" when none does), share: the CPU share each worker keeps (guest.js);
// localFiles: a local task's chosen files, kept to hand to a worker started later; longestTaskMs: the page's longest
// task since it opened (over 50 ms); onFirstReady, onLeft, onWorkerChange: set by workers.js)
window.peertrain = peer;

export function fmt(value) {
  return typeof value === "number" ? (Math.abs(value) >= 100 ? value.toFixed(0) : value.toPrecision(4)) : "–";
}

export function setState(state) {
  peer.state = state;
  $("state").textContent = state;
  document.body.dataset.state = state;
  if (state === "ready" && peer.session) $("join").disabled = !mayJoin();
  if (state === "ready") maybeJoin();
}

export function setActivity(text, kind) {
  peer.activity = text;
  $("peer-activity").textContent = text;
  if (kind) document.body.dataset.peer = kind;
}

// A peer may join once Pyodide is up and, for a local task, once its files give enough examples.
export function mayJoin() {
  const session = peer.session;
  return Boolean(session) && !session.done && !peer.joined && peer.state === "ready"
    && (session.task.kind !== "local" || Boolean(peer.local && peer.local.ready));
}

export function join() {
  peer.wantsJoin = true;
  maybeJoin();
}

// Join when asked to (the button, ?join=1) as soon as that is possible: a local task waits for a valid file.
export function maybeJoin() {
  if (!peer.wantsJoin || !mayJoin()) {
    if (peer.wantsJoin && !peer.joined && peer.session && !peer.session.done && peer.session.task.kind === "local" && peer.state === "ready") {
      setActivity("choose files to train on (they stay in this browser)", "waiting");
    }
    return;
  }
  peer.joined = true;
  $("join").disabled = true;
  setActivity(peer.pausedFor || "joining", peer.pausedFor ? "paused" : "joining");
  peer.workers.forEach(joinWorker);
}

// How many workers train now: the cores given, or none while a rule of the volunteer's pauses the page.
export const trainingCores = () => (peer.pausedFor ? 0 : peer.cores);

// A worker joins (or comes back) when the page has joined and it is booted and within the cores training. The first
// worker takes the device the page asked for (?device=auto|webgpu); the others train on the CPU.
export function joinWorker(record) {
  if (!peer.joined || record.state !== "ready" || record.joined || record.stopping || record.index >= trainingCores()
      || record.banned || record.finished) return;
  record.joined = true;
  record.worker.postMessage({ type: "join", joinCode: $("join-code").value || params.get("code") || "",
    device: record.index === 0 ? params.get("device") || "cpu" : "cpu", profile: volunteerProfile() });
}
