// The page: starts the worker and shows what it reports. All Python runs in the worker.
const stateEl = document.getElementById("state");
const stepsEl = document.getElementById("steps");
const progressEl = document.getElementById("progress");
const versionsEl = document.getElementById("versions");
const errorEl = document.getElementById("error");

const peer = { state: "starting", versions: null, steps: [], worker: null, pending: new Map(), nextId: 1 };
window.peertrain = peer;

function setState(state) {
  peer.state = state;
  stateEl.textContent = state;
  document.body.dataset.state = state;
}

function showStep({ index, name, total, detail }) {
  while (stepsEl.children.length <= index) {
    const li = document.createElement("li");
    stepsEl.appendChild(li);
  }
  [...stepsEl.children].forEach((li, i) => {
    li.className = i < index ? "done" : i === index ? "active" : "";
  });
  stepsEl.children[index].textContent = detail ? `${name}: ${detail}` : name;
  progressEl.max = total;
  progressEl.value = index;
  peer.steps[index] = name;
  setState("loading");
}

function showVersions(versions, seconds) {
  versionsEl.replaceChildren();
  for (const [key, value] of Object.entries({ ...versions, "boot seconds": seconds.toFixed(1) })) {
    const dt = document.createElement("dt");
    dt.textContent = key;
    const dd = document.createElement("dd");
    dd.textContent = value;
    versionsEl.append(dt, dd);
  }
}

// Run Python in the worker; resolves with the value (a string) or rejects with the error.
peer.run = (code) =>
  new Promise((resolve, reject) => {
    const id = peer.nextId++;
    peer.pending.set(id, { resolve, reject });
    peer.worker.postMessage({ type: "run", id, code });
  });

function onMessage(event) {
  const message = event.data;
  if (message.type === "step") {
    showStep(message);
  } else if (message.type === "ready") {
    [...stepsEl.children].forEach((li) => (li.className = "done"));
    progressEl.value = progressEl.max;
    peer.versions = message.versions;
    showVersions(message.versions, message.seconds);
    setState("ready");
  } else if (message.type === "failed") {
    errorEl.hidden = false;
    errorEl.textContent = message.message;
    setState("failed");
  } else if (message.type === "result") {
    const waiting = peer.pending.get(message.id);
    peer.pending.delete(message.id);
    if (waiting) (message.error ? waiting.reject(new Error(message.error)) : waiting.resolve(message.value));
  } else if (message.type === "log") {
    console[message.level === "error" ? "error" : "log"](message.message);
  }
}

peer.worker = new Worker("/src/worker.js");
peer.worker.onmessage = onMessage;
peer.worker.onerror = (event) => {
  errorEl.hidden = false;
  errorEl.textContent = `worker error: ${event.message}`;
  setState("failed");
};
