// A replay worker for the relay (server/browser_assets/engines.py): Pyodide under Node, booted from the same npm package,
// lock file and wheels the page loads, calling the same Python module the page's worker calls (runtime.worker), so
// a unit trained here on the CPU gives the bytes a browser's worker gives. Long-lived: it boots once and then
// trains one job after another until its standard input closes (the relay stopped, or was killed: then it exits
// too, and a restarted relay starts workers of its own).
//
// Framing, both ways: a 4-byte little-endian length, then that many bytes. A request is three frames: the JSON
// header {"task": <GET /api/task's JSON>, "job": <the assignment>, "source": {"module", "text"} of a task given as a file
// and not built into a wheel}, the round's weights message, the unit's data
// message (empty for a unit without data). The answer is two frames: {"ok": true, "metrics": ...} and the result
// message, or {"ok": false, "error": "..."} and an empty frame. Python's output goes to standard error.
// Usage: node pyodide_replay.cjs <pyodide npm package dir> <wheels dir>
"use strict";
const path = require("path");

const [pyodideDir, wheelsDir] = process.argv.slice(2).map((dir) => path.resolve(dir) + path.sep);
const { loadPyodide } = require(path.join(pyodideDir, "pyodide.js"));
const SOURCES = "/peertrain_sources"; // task modules sent as source text, importable by their module name

function frame(bytes) {
  const head = Buffer.alloc(4);
  head.writeUInt32LE(bytes.length, 0);
  return Buffer.concat([head, Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength)]);
}

// Frames from standard input, in order; null at its end.
function reader() {
  let buffered = Buffer.alloc(0);
  let ended = false;
  let waiting = null;
  process.stdin.on("data", (chunk) => { buffered = Buffer.concat([buffered, chunk]); if (waiting) waiting(); });
  process.stdin.on("end", () => { ended = true; if (waiting) waiting(); });
  return async function next() {
    for (;;) {
      if (buffered.length >= 4) {
        const size = buffered.readUInt32LE(0);
        if (buffered.length >= 4 + size) {
          const out = buffered.subarray(4, 4 + size);
          buffered = buffered.subarray(4 + size);
          return out;
        }
      }
      if (ended) return null;
      await new Promise((resolve) => { waiting = resolve; });
      waiting = null;
    }
  };
}

(async () => {
  const pyodide = await loadPyodide({
    indexURL: pyodideDir,
    packageCacheDir: wheelsDir,
    lockFileURL: path.join(wheelsDir, "pyodide-lock.json"),
    stdout: (line) => process.stderr.write(line + "\n"),
    stderr: (line) => process.stderr.write(line + "\n"),
  });
  await pyodide.loadPackage(["numpy", "peertrain-runtime"], { messageCallback: () => {} });
  const entry = pyodide.pyimport("runtime.worker");
  const versions = JSON.parse(entry.boot(""));
  process.stdout.write(frame(Buffer.from(JSON.stringify({ ready: true, pyodide: pyodide.version, ...versions }))));
  const next = reader();
  const loadedWheels = new Set();
  const loadedSources = new Set();
  pyodide.FS.mkdirTree(SOURCES);
  pyodide.runPython(`import sys; sys.path.append(${JSON.stringify(SOURCES)})`);
  let peer = null; // the task's peer, kept while jobs come for the same task (its fingerprint)
  let fingerprint = null;
  for (;;) {
    const header = await next();
    if (header === null) break;
    const weights = await next();
    const unit = await next();
    if (weights === null || unit === null) break;
    let answer;
    let result = new Uint8Array(0);
    try {
      const { task, job, source } = JSON.parse(header.toString("utf8"));
      if (source && !loadedSources.has(source.module)) { // a task from a file that no wheel was built of (yet)
        pyodide.FS.mkdirTree(`${SOURCES}/${source.module}`);
        pyodide.FS.writeFile(`${SOURCES}/${source.module}/__init__.py`, source.text);
        loadedSources.add(source.module);
      }
      if (task.wheel && !loadedWheels.has(task.wheel)) {
        // (by its name in the lock file, as the page installs it: serve built it into wheels/ before the relay started)
        await pyodide.loadPackage([task.wheel], { messageCallback: () => {} });
        loadedWheels.add(task.wheel);
      }
      if (fingerprint !== task.fingerprint) {
        if (peer) peer.destroy();
        peer = entry.build_peer(JSON.stringify(task));
        fingerprint = task.fingerprint;
      }
      // (each method looked up on a Python object is a proxy of its own: destroyed after use, or thousands of
      // replays would keep thousands of them)
      const setWeights = peer.set_weights;
      const train = peer.train;
      try {
        setWeights(new Uint8Array(weights));
        const out = train(JSON.stringify(job), unit.length ? new Uint8Array(unit) : undefined);
        try {
          const [bytes, metrics] = out.toJs();
          result = bytes;
          answer = { ok: true, metrics: JSON.parse(metrics) };
        } finally {
          out.destroy();
        }
      } finally {
        setWeights.destroy();
        train.destroy();
      }
    } catch (error) {
      answer = { ok: false, error: String((error && error.message) || error).slice(-4000) };
    }
    process.stdout.write(frame(Buffer.from(JSON.stringify(answer))));
    process.stdout.write(frame(result));
  }
  process.exit(0);
})().catch((error) => {
  process.stderr.write(String((error && error.stack) || error) + "\n");
  process.exit(1);
});
