// The peer's worker (an ES module worker): boots Pyodide from the relay, installs numpy and the runtime
// wheel from the relay's lock file, then (once the page says "join") asks the relay for work, trains each
// unit in Python and uploads the result. Everything is reported to the page; the page never waits on Python.
// A local task's peer trains on files its person chose in the page: the page reads them (File API) and hands
// their bytes over in a "files" message; they are parsed here by the task (runtime.worker's add_local_file),
// kept for a new session's task, and never sent anywhere: only the trained weights and metrics go to the relay.
//
// A page may run several of these workers (one per core its volunteer gives), each a peer of its own: its own token,
// its own leases. "stop" makes a worker finish the unit in hand, upload it, leave the session (its leases freed at
// once) and wait, booted, until it is asked to join again. The page's CPU share (a "share" message, 0.1..1) is a
// duty cycle kept here, not by the page's timers (which a background tab throttles): after a unit of T seconds of
// training the worker rests T (1 - share) / share before asking for the next, holding no lease while it rests.
//
// All Python it calls is one module, runtime.worker (boot report, the peer, the device, training); the worker
// runs no Python source of its own and passes nothing through pyodide.globals. The one exception is the
// "run" message, a test and benchmark hook that runs the Python source it is given: it is answered only
// when the page was opened with ?test=1 (the page passes that flag in its "boot" message).
import { loadPyodide } from "/pyodide/pyodide.mjs";
import { volunteerProof } from "./identity.js";

const INDEX_URL = new URL("/pyodide/", self.location.origin).href;
const STEPS = ["fetch and start Pyodide", "install numpy + runtime", "import runtime"];
const TEST_FLAG = "test";
// Refusals that mean this page's runtime is older than the relay's: retraining cannot help, a reload does.
const OUT_OF_DATE = new Set(["outdated_format", "wrong_codec", "bad_engine_class"]);
// Refusals that mean this session cannot check what this page's engine computes: it stops rather than train for
// nothing (a page is told to train such a session on the CPU, whose results it can check).
const CANNOT_BE_CHECKED = new Set(["engine_not_replayable"]);

// The answers of POST /api/work, as runtime/protocol.py declares them (tests/runtime/test_protocol.py holds these
// typedefs to its JSON Schema: a field added there must be added here, and the worker reads no other field).
/**
 * @typedef {Object} Job a unit to train, leased to this peer
 * @property {number} round
 * @property {number} slot
 * @property {number} pass_index
 * @property {number} unit_index
 * @property {number} unit_seed
 * @property {"data"|"experience"|"local"} kind
 * @property {number} episodes
 * @property {number} progress
 * @property {number} lease_deadline
 * @property {number} lease_seconds
 * @property {number} weights_round
 * @property {number} num_rounds
 * @property {string} fingerprint
 * @property {string} [weights_digest]
 * @property {string} [weights_url]
 * @property {number} [carried_from]
 * @property {Object} [codec]
 * @property {"backup"} [copy]
 */
/**
 * @typedef {Object} Wait no unit now: ask again after `wait` seconds
 * @property {number} wait
 * @property {string} reason
 */
/**
 * @typedef {Object} Done the session is over
 * @property {string} reason
 * @property {boolean} [done]
 */

let pyodide = null;
let entry = null; // runtime.worker, the module's proxy
let options = null; // from the page's "boot" message: { blas, test }
let booted = null; // resolves once the runtime is imported
let credentials = null;
let profile = {}; // the volunteer's display name and team, from the page's "join" message (sent with the key's proof)
let training = false;
let stopping = false; // the page asked this worker to stop training (fewer cores given, or 0: paused)
// this peer left the session (POST /api/leave): its next ask says back=1, so the relay takes it back (an ask without
// it, sent before a closing page's leave and arriving after, is not taken for the peer's return)
let left = false;
let wake = null; // ends a wait early when the page says stop (an abort for a held /api/work, or a sleep's timer)
let share = 1; // the volunteer's CPU share (web/src/guest.js)
let resting = false; // in the rest after a unit: a new share ends it early (the rest is reckoned again)
let current = null; // the prepared task of the session being trained ("Try the model" answers with it)
const localFiles = new Map(); // name -> Uint8Array: the files chosen in the page (they stay in this worker)
let localNoise = { z: 0, clip: 1 }; // local differential privacy, the volunteer's choice (web/src/local_privacy.js)
let localReady = false; // whether the chosen files give the task enough examples to train

// Calls that build or change the task's Python peer run one after another (the page may send files while the
// training loop prepares the task).
let queue = Promise.resolve();
function serialized(fn) {
  const run = queue.then(fn);
  queue = run.catch(() => {});
  return run;
}

function report(type, fields) {
  self.postMessage({ type, ...fields });
}

function step(index, detail) {
  report("step", { index, name: STEPS[index], total: STEPS.length, detail: detail || "" });
}

const describe = (error) => String((error && error.stack) || error);

// The WebAssembly heap of this worker's Pyodide: nearly all of its memory (numpy, the runtime, the model).
const heapBytes = () => { try { return pyodide._module.HEAP8.buffer.byteLength; } catch { return null; } };

async function boot() {
  const started = performance.now();
  step(0); // (pyodide.mjs came with this module; loadPyodide fetches the interpreter and its standard library)
  pyodide = await loadPyodide({ indexURL: INDEX_URL, lockFileURL: INDEX_URL + "pyodide-lock.json" });
  step(1);
  await pyodide.loadPackage(["numpy", "peertrain-runtime"], {
    messageCallback: (message) => step(1, message),
    errorCallback: (message) => report("log", { level: "error", message }),
  });
  step(2);
  entry = pyodide.pyimport("runtime.worker");
  // ?blas=numpy keeps numpy's own matmul loop; otherwise runtime.worker installs the WebAssembly SIMD kernel.
  const versions = JSON.parse(entry.boot(options.blas || ""));
  if (versions.matmul_error) report("log", { level: "error", message: versions.matmul_error });
  delete versions.matmul_error;
  report("ready", {
    versions: { pyodide: pyodide.version, ...versions },
    seconds: (performance.now() - started) / 1000,
    heapBytes: heapBytes(),
  });
}

// A wait that "stop" ends at once: the sleep between asks, and a held /api/work (aborted).
function interruptible(ms) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    wake = () => { clearTimeout(timer); resolve(); };
  }).finally(() => { wake = null; });
}


// The rest after a unit that took `seconds` of training, reckoned again when the share changes; "stop" ends it.
async function rest(seconds) {
  const started = performance.now();
  for (;;) {
    const left = (seconds * (1 - share)) / share - (performance.now() - started) / 1000;
    if (left <= 0 || stopping) return;
    const reason = `resting: CPU share ${Math.round(share * 100)} % (the next unit in ${Math.ceil(left)} s)`;
    report("waiting", { reason, resting: left });
    resting = true;
    await interruptible(left * 1000).finally(() => { resting = false; });
  }
}

// cacheable: a content-addressed answer (weights by digest): no credentials, and the browser's cache may keep it.
async function api(path, { method = "GET", body = null, binary = false, cacheable = false, signal = null } = {}) {
  const headers = {};
  if (credentials && !cacheable) headers.Authorization = `Bearer ${credentials.peer_id}:${credentials.token}`;
  const response = await fetch(path, { method, headers, body, signal, cache: cacheable ? "default" : "no-store" });
  if (!response.ok) {
    let detail = {};
    try { detail = await response.json(); } catch { /* not JSON */ }
    const error = new Error(detail.message || `${method} ${path}: HTTP ${response.status}`);
    error.status = response.status;
    error.code = detail.error;
    error.retryAfter = Number(response.headers.get("Retry-After")) || 1; // (seconds, on a 429 or 503)
    error.ticket = detail.ticket || ""; // (a refused join's place in its address's queue)
    throw error;
  }
  return binary ? new Uint8Array(await response.arrayBuffer()) : response.json();
}

// A refusal that asking again will not change (a wrong join code, say); network trouble and 5xx are retried.
const permanent = (error) => error.status >= 400 && error.status < 500 && error.status !== 429;

// The task and its Python peer for the relay's current session (built again when a new session trains
// another task; a local task's peer gets the chosen files again).
// A codec's error-feedback residual (topk's) survives a reload: kept in IndexedDB per task package (its fingerprint).
function residuals(mode, use) {
  return new Promise((resolve, reject) => {
    const opening = indexedDB.open("peertrain", 1);
    opening.onupgradeneeded = () => opening.result.createObjectStore("residuals");
    opening.onerror = () => reject(opening.error);
    opening.onsuccess = () => {
      const request = use(opening.result.transaction("residuals", mode).objectStore("residuals"));
      request.onsuccess = () => resolve(request.result);
      request.onerror = () => reject(request.error);
    };
  });
}
const saveResidual = (fingerprint, bytes) => residuals("readwrite", (store) => store.put(bytes, fingerprint));
const loadResidual = (fingerprint) => residuals("readonly", (store) => store.get(fingerprint));

async function buildTask(current) {
  const taskInfo = await api("/api/task");
  if (current && current.peer.fingerprint === taskInfo.fingerprint) return { ...current, taskInfo };
  if (taskInfo.wheel) await pyodide.loadPackage([taskInfo.wheel]);
  if (current) current.peer.destroy();
  const built = { taskInfo, peer: entry.build_peer(JSON.stringify(taskInfo)), mode: null, onWebgpu: false, description: "" };
  const kept = await loadResidual(taskInfo.fingerprint).catch(() => undefined);
  if (kept) report("residual", { restored: built.peer.restore_residual(kept) });
  if (taskInfo.kind === "local") {
    for (const [name, bytes] of localFiles) built.peer.add_local_file(name, bytes);
    built.peer.set_local_privacy(localNoise.z, localNoise.clip);
    reportLocal(built.peer);
  } else {
    localReady = false;
  }
  return built;
}

// The task with its device. GPU calls go through callPromising so that their reads can block (JSPI).
async function prepare(current, device) {
  const built = await buildTask(current);
  // Device choice (?device=auto|webgpu; default cpu): timed on the task's own model, reported to the page.
  // (callPromising needs JSPI, which only the GPU path needs: the CPU path never calls it.) A session whose host
  // replays compare results bit for bit names the devices it can check (the CPU): the page keeps to them.
  const allowed = built.taskInfo.devices;
  const mode = allowed && device && !allowed.includes(device) ? allowed[0] : device || "cpu";
  if (mode !== (device || "cpu")) {
    report("log", { level: "warn", message: `this session checks results on ${allowed.join(", ")} only: training there, not on ${device}` });
  }
  if (built.mode === mode) return built;
  const peer = built.peer;
  const choice = JSON.parse(await (mode === "cpu" ? peer.choose_device(mode) : peer.choose_device.callPromising(mode)));
  return { ...built, mode, onWebgpu: choice.chosen === "webgpu", description: choice.description };
}

// What the page shows beside its file picker: each file's report, the examples found, whether it may train.
function reportLocal(peer) {
  const summary = JSON.parse(peer.local_summary());
  localReady = summary.ready;
  report("local", { summary });
}

// Join the session, with the join code the page was given. Used at the start and whenever the relay refuses
// the stored token (401: a relay restarted with a new session no longer knows this peer).
// Many volunteers behind one address (a classroom's NAT) join in turn: a join past the address's rate is refused 429
// with Retry-After and a ticket that keeps its place, shown with the next try.
const MAX_JOIN_TRIES = 200;
async function join(joinCode, prepared) {
  credentials = null;
  let ticket = "";
  for (let tries = 1; !credentials; tries++) {
    try {
      // the volunteer's key, proven on a fresh challenge (identity.js); null where no key can be kept: anonymous
      const volunteer = await volunteerProof(() => api("/api/challenge", { method: "POST" }), profile);
      const body = { join_code: joinCode || "", ...(ticket ? { ticket } : {}), ...(volunteer ? { volunteer } : {}) };
      credentials = await api("/api/join", { method: "POST", body: JSON.stringify(body) });
    } catch (error) {
      if (error.code === "volunteer_proof" && tries < 3) continue; // (a relay restarted since its challenge)
      if (error.status === 429 && stopping) return; // (paused while waiting its turn: not joined, nothing to leave)
      if (error.status !== 429 || tries >= MAX_JOIN_TRIES) throw error;
      ticket = error.ticket || ticket;
      report("waiting", { reason: `joining in turn with others at this address: in ${error.retryAfter} s` });
      await interruptible(error.retryAfter * 1000);
    }
  }
  report("joined", { peerId: credentials.peer_id, token: credentials.token, device: prepared.description });
}

// Stopped by the page: the unit in hand is uploaded by now; the relay frees this peer's leases at once (a unit it
// was handed but has not started goes to the next peer that asks). The credentials are kept: joining again later
// makes the same peer come back.
async function leave() {
  if (!credentials) { report("left", {}); return; } // (never joined: stopped while waiting its turn to)
  left = true;
  try {
    await api("/api/leave", { method: "POST" });
  } catch (error) {
    report("log", { level: "warn", message: `leaving the session: ${describe(error)} (the lease runs out instead)` });
  }
  report("left", {});
}

// The weights a job names: by digest, as the chain of compressed steps from the weights held where the relay has one
// (it redirects to the full weights where not), the full weights otherwise; a chain that does not rebuild the named
// weights (checked step by step in Python) is dropped for the full weights. Returns the bytes received.
async function fetchWeights(prepared, job) {
  if (!job.weights_url) { // (a relay that names no digest)
    const weights = await api(`/api/weights?round=${job.weights_round}`, { binary: true });
    prepared.peer.set_weights(weights);
    return weights.byteLength;
  }
  const held = prepared.peer.weights_sha;
  const first = await api(held ? `${job.weights_url}/from/${held}` : job.weights_url, { binary: true, cacheable: true });
  try {
    prepared.peer.set_weights(first);
    return first.byteLength;
  } catch (error) {
    if (!held) throw error;
    report("log", { level: "warn", message: `rebuilding the weights from steps failed, fetching them whole: ${describe(error)}` });
  }
  const whole = await api(job.weights_url, { binary: true, cacheable: true });
  prepared.peer.set_weights(whole);
  return first.byteLength + whole.byteLength;
}

async function trainUnit(prepared, job, unit) {
  const train = prepared.peer.train;
  try {
    const out = prepared.onWebgpu ? await train.callPromising(JSON.stringify(job), unit) : train(JSON.stringify(job), unit);
    try {
      const [result, metricsJson] = out.toJs();
      return { result, metrics: JSON.parse(metricsJson) };
    } finally {
      out.destroy();
    }
  } finally {
    train.destroy();
  }
}

// Train until the session is done: ask for work, fetch weights and the unit, train in Python, upload.
// Network trouble is retried with back-off; a refused result is reported and the peer moves on; a refused
// token means joining again (and, for a new session, fetching its task and weights again).

async function trainLoop(joinCode, device) {
  let prepared = await serialized(() => prepare(current, device));
  current = prepared;
  if (credentials) report("joined", { peerId: credentials.peer_id, token: credentials.token, device: prepared.description });
  else await join(joinCode, prepared);
  let weightsRound = null;
  let failures = 0;
  for (;;) {
    if (stopping) { await leave(); return; }
    try {
      if (!credentials) {
        prepared = await serialized(() => prepare(current, device));
        current = prepared;
        await join(joinCode, prepared);
        weightsRound = null; // a new session's round 0 is not the old session's round 0
        if (!credentials) continue; // (stopped while waiting its turn to join: the loop's top leaves)
      }
      // hold: the relay keeps a "wait" answer up to hold_seconds and answers the moment a round opens.
      if (prepared.taskInfo.kind === "local" && !localReady) { // (the person forgot the files: no work until new ones)
        report("waiting", { reason: "choose files to train on: this task trains on your own data" });
        await interruptible(1000);
        continue;
      }
      const hold = (prepared.taskInfo.limits || {}).hold_seconds || 0;
      const asking = new AbortController();
      wake = () => asking.abort();
      /** @type {Job|Wait|Done} */
      const query = [...(hold > 0 ? [`hold=${hold}`] : []), ...(left ? ["back=1"] : [])].join("&");
      const job = await api(query ? `/api/work?${query}` : "/api/work", { method: "POST", signal: asking.signal })
        .finally(() => { wake = null; });
      left = false; // (the relay has this peer back)
      failures = 0;
      if (job.done) { report("finished", { reason: job.reason }); return; }
      if (job.wait !== undefined) { report("waiting", { reason: job.reason }); await interruptible(job.wait * 1000); continue; }
      if (stopping) continue; // (handed a unit as the page said stop: leaving frees it for another peer at once)
      let received = 0; // bytes of weights and data this unit needed (shown to the volunteer)
      if (job.weights_digest ? prepared.peer.weights_sha !== job.weights_digest : weightsRound !== job.weights_round) {
        received += await fetchWeights(prepared, job);
        weightsRound = job.weights_round;
      }
      const unit = job.kind === "data" ? await api(`/api/unit/${job.unit_index}`, { binary: true }) : null;
      received += unit ? unit.byteLength : 0;
      report("training", { job });
      const started = performance.now();
      const { result, metrics } = await trainUnit(prepared, job, unit);
      const seconds = (performance.now() - started) / 1000;
      try {
        await api(`/api/result?round=${job.round}&slot=${job.slot}`, { method: "POST", body: result });
        report("uploaded", { job, metrics, seconds, sent: result.byteLength, received, heapBytes: heapBytes() });
        if (prepared.peer.keeps_residual) { // (the codec carries what it dropped into the next update)
          const residual = prepared.peer.residual();
          await saveResidual(prepared.taskInfo.fingerprint, residual.toJs()).catch((error) =>
            report("log", { level: "error", message: `could not keep the residual: ${error}` }));
          residual.destroy();
        }
      } catch (error) {
        if (OUT_OF_DATE.has(error.code)) { // the relay expects results this page's runtime does not send
          report("outdated", { message: error.message });
          return;
        }
        if (CANNOT_BE_CHECKED.has(error.code)) {
          report("refused", { job, code: error.code, message: error.message });
          return;
        }
        if (error.code !== "banned" && error.status !== 401 && permanent(error)) {
          report("refused", { job, code: error.code, message: error.message });
        } else throw error;
      }
      await rest(seconds);
    } catch (error) {
      if (stopping && error.name === "AbortError") continue; // (the held ask the page's stop ended)
      // A result that failed the host's replay bans this peer for the session: say why and stop asking.
      if (error.code === "banned") { report("banned", { message: error.message }); return; }
      if (error.status === 401) { credentials = null; continue; }
      if (!credentials && permanent(error)) throw error; // joining was refused for good
      failures += 1;
      const delay = Math.min(30, 2 ** Math.min(failures, 5)) * (0.75 + Math.random() / 2);
      report("offline", { message: String(error.message || error), retryIn: delay });
      await interruptible(delay * 1000);
    }
  }
}

// What the page may ask; one handler per message type.
const handlers = {
  boot(message) {
    if (booted) return;
    options = { blas: message.blas || "", test: Boolean(message[TEST_FLAG]) };
    booted = boot();
    booted.catch((error) => report("failed", { message: describe(error) }));
  },
  async join(message) {
    stopping = false;
    profile = message.profile || {};
    if (training) return;
    training = true;
    try {
      await booted;
      await trainLoop(message.joinCode, message.device);
    } catch (error) {
      report("failed", { message: describe(error) });
    } finally {
      training = false;
    }
  },
  // The page gives this worker's core back: finish the unit in hand, upload it, leave, and wait to be asked again.
  stop() {
    stopping = true;
    if (wake) wake();
    if (!training) report("left", {});
  },
  // The volunteer's CPU share, 0.1..1: applies from the rest in progress on.
  share(message) {
    share = Math.min(1, Math.max(0.1, Number(message.share) || 1));
    if (resting && wake) wake();
  },
  // Local tasks: files chosen in the page, as { name, bytes } (an ArrayBuffer each); parsed by the task here.
  async files(message) {
    try {
      await booted;
      await serialized(async () => {
        current = await buildTask(current);
        if (current.taskInfo.kind !== "local") throw new Error("this session's task trains on no files of yours");
        for (const file of message.files || []) {
          const bytes = new Uint8Array(file.bytes);
          localFiles.set(String(file.name), bytes);
          current.peer.add_local_file(String(file.name), bytes);
        }
        reportLocal(current.peer);
      });
    } catch (error) {
      report("local", { error: describe(error) });
    }
  },
  async clearFiles() {
    localFiles.clear();
    localReady = false;
    try {
      await booted;
      await serialized(async () => {
        if (current && current.taskInfo.kind === "local") { current.peer.clear_local_files(); reportLocal(current.peer); }
      });
    } catch (error) {
      report("local", { error: describe(error) });
    }
  },
  // Local differential privacy: noise this peer adds to its own updates before upload (0: none).
  async localPrivacy(message) {
    localNoise = { z: Number(message.noise_multiplier) || 0, clip: Number(message.clip) || 1 };
    await booted;
    await serialized(async () => {
      if (current && current.taskInfo.kind === "local") current.peer.set_local_privacy(localNoise.z, localNoise.clip);
    });
  },
  // "Try the model": the task answers a visitor's prompt from the current global weights. It runs between
  // units (a unit is one Python call), and the weights it uses are fetched for it: training is left alone.
  async respond(message) {
    try {
      await booted;
      if (!current || !credentials) throw new Error("join the session first: the model comes with it");
      const weights = await api("/api/weights", { binary: true });
      report("response", { id: message.id, ...JSON.parse(current.peer.respond(weights, String(message.prompt || ""))) });
    } catch (error) {
      report("response", { id: message.id, error: describe(error) });
    }
  },
  // Test and benchmark hook: run Python source in the worker and return its (string) result.
  async run(message) {
    if (!options || !options.test) {
      report("result", { id: message.id, error: `refused: the run hook answers only on a page opened for testing (?${TEST_FLAG}=1)` });
      return;
    }
    try {
      await booted;
      const result = await pyodide.runPythonAsync(message.code);
      report("result", { id: message.id, value: result === undefined ? null : String(result) });
    } catch (error) {
      report("result", { id: message.id, error: String(error) });
    }
  },
};

self.onmessage = (event) => {
  const message = event.data || {};
  const handler = handlers[message.type];
  if (handler) handler(message);
  else report("log", { level: "error", message: `the worker got an unknown message: ${message.type}` });
};
