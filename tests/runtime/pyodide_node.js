// Runs Python from stdin in Pyodide under Node (no browser), with numpy and the runtime wheel from wheels/;
// prints the value of the last expression. Used by tests of Pyodide-only code paths (the wasm matmul kernel).
"use strict";
const path = require("path");
const root = path.resolve(__dirname, "..", "..");
const { loadPyodide } = require(path.join(root, "web", "node_modules", "pyodide", "pyodide.js"));

(async () => {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  const pyodide = await loadPyodide({
    indexURL: path.join(root, "web", "node_modules", "pyodide") + path.sep,
    packageCacheDir: path.join(root, "wheels") + path.sep,
    lockFileURL: path.join(root, "wheels", "pyodide-lock.json"),
    stdout: (line) => process.stderr.write(line + "\n"),
  });
  await pyodide.loadPackage(["numpy", "peertrain-runtime"], { messageCallback: () => {} });
  process.stdout.write(String(pyodide.runPython(Buffer.concat(chunks).toString("utf8"))));
})().catch((error) => {
  process.stderr.write(String(error && error.stack ? error.stack : error) + "\n");
  process.exit(1);
});
