// Local tasks: the file picker. The chosen files are read here (File API) and their bytes handed to the worker;
// nothing is uploaded.
import { $, maybeJoin, mayJoin, peer } from "./peer.js";

// What the session's task asks for (shown only for a local task).
export function showLocal(session) {
  const local = session.task.local;
  $("local-section").hidden = !local;
  if (!local) return;
  $("local-hint").textContent = local.hint ? `Choose ${local.hint}. A unit trains on at most ${local.max_examples_per_unit} of your examples.` : "";
  if (local.accept && !$("local-files").accept) $("local-files").accept = local.accept;
}

async function readFiles(files) {
  const chosen = [];
  for (const { file, name } of files) chosen.push({ name: name || file.webkitRelativePath || file.name, bytes: await file.arrayBuffer() });
  if (!chosen.length) return;
  $("local-summary").textContent = `reading ${chosen.length} file${chosen.length === 1 ? "" : "s"}…`;
  peer.localFiles.push(...chosen); // (kept for a worker started later; each worker is sent its own copy)
  for (const record of peer.workers) record.worker.postMessage({ type: "files", files: chosen });
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

// The worker's "local" message: what it made of the files (a summary, or why it could not read them).
export function showLocalFiles(message) {
  if (message.error) { $("local-summary").textContent = `the files could not be read: ${message.error}`; return; }
  showLocalSummary(message.summary);
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

// The two pickers (files, a folder), the drop zone and "Forget the files".
export function listenForFiles() {
  for (const id of ["local-files", "local-folder"]) {
    $(id).addEventListener("change", (event) => { readFiles([...event.target.files].map((file) => ({ file }))); event.target.value = ""; });
  }
  $("local-drop").addEventListener("dragover", (event) => { event.preventDefault(); $("local-drop").classList.add("over"); });
  $("local-drop").addEventListener("dragleave", () => $("local-drop").classList.remove("over"));
  $("local-drop").addEventListener("drop", (event) => { dropped(event); });
  $("local-clear").addEventListener("click", () => {
    peer.localFiles = [];
    for (const record of peer.workers) record.worker.postMessage({ type: "clearFiles" });
  });
}
