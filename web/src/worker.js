// The peer's worker: boots Pyodide from the relay, installs numpy and the runtime wheel from the
// relay's lock file, and reports every step to the page. The page never waits on Python.
"use strict";

const INDEX_URL = new URL("/pyodide/", self.location.origin).href;
const STEPS = ["fetch Pyodide", "start the interpreter", "install numpy + runtime", "import runtime"];
let pyodide = null;

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
  step(3);
  const versions = pyodide.runPython(`
import json, sys
import numpy, runtime
json.dumps({
    "python": sys.version.split()[0],
    "numpy": numpy.__version__,
    "runtime": getattr(runtime, "__version__", "unknown"),
    "runtime_file": runtime.__file__,
})`);
  report("ready", {
    versions: { pyodide: pyodide.version, ...JSON.parse(versions) },
    seconds: (performance.now() - started) / 1000,
  });
}

self.onmessage = async (event) => {
  const message = event.data || {};
  if (message.type === "run") {
    // Test and benchmark hook: run Python source in the worker and return its (JSON string) result.
    try {
      const result = await pyodide.runPythonAsync(message.code);
      report("result", { id: message.id, value: result === undefined ? null : String(result) });
    } catch (error) {
      report("result", { id: message.id, error: String(error) });
    }
  }
};

boot().catch((error) => report("failed", { message: String(error && error.stack ? error.stack : error) }));
