// Local differential privacy, the volunteer's own choice on a local task: this page's workers clip each update and
// add Gaussian noise to it before it is uploaded (runtime/peer.py: set_local_privacy). The relay's status lists what
// each noise level costs in epsilon after 1, 2, ... uploads (dp-accounting on the host); the page counts this page's
// uploads (its peers' accepted and refused results) and shows the epsilon reached.
import { $, peer } from "./peer.js";

let chosen = 0; // the noise multiplier chosen (0: no local noise)
let told = new WeakMap(); // worker -> the noise multiplier it was last told (new workers are told on the next status)
let latest = null; // the last status

function workers() {
  if (Array.isArray(peer.workers)) return peer.workers.map((record) => record.worker).filter(Boolean);
  return peer.worker ? [peer.worker] : [];
}

function myIds() {
  const ids = Array.isArray(peer.workers) ? peer.workers.map((record) => record.peerId) : [];
  if (peer.peerId) ids.push(peer.peerId);
  return [...new Set(ids.filter(Boolean))];
}

function uploads(session) {
  const ids = myIds();
  return (session.participants || []).filter((p) => ids.some((id) => id.startsWith(p.peer)))
    .reduce((sum, p) => sum + (p.units_done || 0) + (p.refusals || 0), 0);
}

function tell(local) {
  for (const worker of workers()) {
    if (told.get(worker) === chosen) continue;
    worker.postMessage({ type: "localPrivacy", noise_multiplier: chosen, clip: local.clip });
    told.set(worker, chosen);
  }
}

function describe(local, sent) {
  if (!chosen) return "off: your updates go as trained (the session's own privacy, above, is all there is).";
  const row = local.choices.find((c) => c.noise_multiplier === chosen);
  const eps = row.epsilon;
  const now = sent === 0 ? "0 so far" : sent <= eps.length ? `${eps[sent - 1].toFixed(2)} after your ${sent} upload${sent === 1 ? "" : "s"}`
    : `more than ${eps[eps.length - 1].toFixed(2)} after your ${sent} uploads`;
  return `on: each update is clipped to norm ${local.clip} and noise of ${chosen} times that is added in this browser `
    + `before it leaves, so whoever sees it (the relay too) learns little about your files: your epsilon is ${now} `
    + `(delta ${local.delta}), ${eps[eps.length - 1].toFixed(2)} after ${eps.length}. The cost: your noise is not `
    + "averaged with anyone's before it leaves, so the model learns less from you than from the same update under "
    + "the session's own privacy (about the square root of the number of peers in a round times more noise), and "
    + "your training losses are not reported.";
}

export function showLocalPrivacy(session) {
  const local = session.privacy && session.privacy.local;
  $("local-dp-section").hidden = !local;
  if (!local) return;
  const select = $("local-dp");
  if (!select.options.length) {
    select.append(new Option("off", "0"), ...local.choices.map((c) => new Option(`noise ${c.noise_multiplier}`, String(c.noise_multiplier))));
    select.addEventListener("change", () => {
      chosen = Number(select.value);
      told = new WeakMap();
      tell(latest.privacy.local);
      $("local-dp-note").textContent = describe(latest.privacy.local, uploads(latest));
    });
  }
  latest = session;
  tell(local);
  $("local-dp-note").textContent = describe(local, uploads(session));
}
