// The peer's worker: boots Pyodide from the relay, installs numpy and the runtime wheel from the relay's
// lock file, then (once the page says "join") asks the relay for work, trains each unit in Python and
// uploads the result. Everything is reported to the page; the page never waits on Python.
"use strict";

const INDEX_URL = new URL("/pyodide/", self.location.origin).href;
const STEPS = ["fetch Pyodide", "start the interpreter", "install numpy + runtime", "import runtime"];
let pyodide = null;
let credentials = null;

function report(type, fields) {
  self.postMessage({ type, ...fields });
}

function step(index, detail) {
  report("step", { index, name: STEPS[index], total: STEPS.length, detail: detail || "" });
}

async function boot() {
  const started = performance.now();
  step(0);
  importScripts(INDEX_URL + "pyodide.js");
  step(1);
  pyodide = await loadPyodide({ indexURL: INDEX_URL, lockFileURL: INDEX_URL + "pyodide-lock.json" });
  step(2);
  await pyodide.loadPackage(["numpy", "peertrain-runtime"], {
    messageCallback: (message) => step(2, message),
    errorCallback: (message) => report("log", { level: "error", message }),
  });
  // Pyodide's numpy has no BLAS: its matmul is a plain loop. The runtime's WebAssembly SIMD kernel (loaded
  // into Pyodide's memory as a side module) gives the same float32 sums about 15x faster; ?blas=numpy opts out.
  let matmul = "numpy (no BLAS)";
  if (new URL(self.location.href).searchParams.get("blas") !== "numpy") {
    try {
      matmul = pyodide.runPython("from runtime.backend import wasm_gemm\nwasm_gemm.install()");
    } catch (error) {
      report("log", { level: "error", message: `SIMD matmul kernel unavailable, numpy's loop instead: ${error}` });
    }
  }
  step(3);
  const versions = pyodide.runPython(`
import json, sys
import numpy, runtime
json.dumps({"python": sys.version.split()[0], "numpy": numpy.__version__,
            "runtime": getattr(runtime, "__version__", "unknown")})`);
  report("ready", {
    versions: { pyodide: pyodide.version, ...JSON.parse(versions), matmul },
    seconds: (performance.now() - started) / 1000,
  });
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function api(path, { method = "GET", body = null, binary = false } = {}) {
  const headers = {};
  if (credentials) headers.Authorization = `Bearer ${credentials.peer_id}:${credentials.token}`;
  const response = await fetch(path, { method, headers, body, cache: "no-store" });
  if (!response.ok) {
    let detail = {};
    try { detail = await response.json(); } catch (_) { /* not JSON */ }
    const error = new Error(detail.message || `${method} ${path}: HTTP ${response.status}`);
    error.status = response.status;
    error.code = detail.error;
    throw error;
  }
  return binary ? new Uint8Array(await response.arrayBuffer()) : response.json();
}

// Train forever: ask for work, fetch weights and the unit, train in Python, upload. Network trouble is
// retried with back-off; a refused result is reported and the peer moves on.
async function trainLoop(joinCode, device) {
  const taskInfo = await api("/api/task");
  if (taskInfo.wheel) await pyodide.loadPackage([taskInfo.wheel]);
  pyodide.globals.set("task_info_json", JSON.stringify(taskInfo));
  const peer = pyodide.runPython("from runtime.peer import Peer\nPeer(task_info_json)");
  // Device choice (?device=auto|webgpu; default cpu): timed on the task's own model, reported to the page.
  // GPU units run through callPromising so their read-backs can block on mapAsync (JSPI).
  let deviceText = "CPU (numpy in Pyodide)";
  let trainOnDevice = null;
  if (device && device !== "cpu") {
    const choice = JSON.parse(await pyodide.runPython("from runtime.device import choose_for_peer\nchoose_for_peer")
      .callPromising(peer, device));
    deviceText = choice.description;
    if (choice.chosen === "webgpu") trainOnDevice = pyodide.runPython("from runtime.device import train_on_device\ntrain_on_device");
  }
  credentials = await api("/api/join", { method: "POST", body: JSON.stringify({ join_code: joinCode || "" }) });
  report("joined", { peerId: credentials.peer_id, device: deviceText });
  let weightsRound = null;
  let failures = 0;
  for (;;) {
    try {
      // hold: the relay keeps a "wait" answer up to 15 s and answers the moment a round opens (no polling gap).
      const job = await api("/api/work?hold=15", { method: "POST" });
      failures = 0;
      if (job.done) { report("finished", { reason: job.reason }); return; }
      if (job.wait !== undefined) { report("waiting", { reason: job.reason }); await sleep(job.wait * 1000); continue; }
      if (weightsRound !== job.weights_round) {
        const message = await api("/api/weights", { binary: true });
        weightsRound = peer.set_weights(message);
      }
      const unit = job.kind === "data" ? await api(`/api/unit/${job.unit_index}`, { binary: true }) : null;
      report("training", { job });
      const started = performance.now();
      const out = trainOnDevice ? await trainOnDevice.callPromising(peer, JSON.stringify(job), unit)
        : peer.train(JSON.stringify(job), unit);
      const result = out.toJs();
      out.destroy();
      const seconds = (performance.now() - started) / 1000;
      const metrics = JSON.parse(peer.last_metrics_json);
      try {
        await api(`/api/result?round=${job.round}&slot=${job.slot}`, { method: "POST", body: result });
        report("uploaded", { job, metrics, seconds });
      } catch (error) {
        if (error.status >= 400 && error.status < 500) report("refused", { job, code: error.code, message: error.message });
        else throw error;
      }
    } catch (error) {
      if (error.status === 401) { credentials = await api("/api/join", { method: "POST", body: "{}" }); continue; }
      failures += 1;
      const delay = Math.min(30, 2 ** Math.min(failures, 5)) * (0.75 + Math.random() / 2);
      report("offline", { message: String(error.message || error), retryIn: delay });
      await sleep(delay * 1000);
    }
  }
}

self.onmessage = async (event) => {
  const message = event.data || {};
  if (message.type === "run") {
    // Test and benchmark hook: run Python source in the worker and return its (string) result.
    try {
      const result = await pyodide.runPythonAsync(message.code);
      report("result", { id: message.id, value: result === undefined ? null : String(result) });
    } catch (error) {
      report("result", { id: message.id, error: String(error) });
    }
  } else if (message.type === "join") {
    trainLoop(message.joinCode, message.device).catch((error) => report("failed", { message: String(error.stack || error) }));
  }
};

boot().catch((error) => report("failed", { message: String(error && error.stack ? error.stack : error) }));
