// The session as the relay streams it (server-sent events): its facts, round progress, defenses, samples, and
// the sections that follow it (chart, participants, local files, "Try the model", download).
import { drawChart, showTiming } from "./chart.js";
import { showCredit } from "./credit.js";
import { showDownload } from "./download.js";
import { showLocal } from "./local_files.js";
import { showLocalPrivacy } from "./local_privacy.js";
import { showParticipants } from "./participants.js";
import { $, fmt, maybeJoin, mayJoin, peer } from "./peer.js";
import { showTry } from "./try_model.js";

const KINDS = { data: "data chunks", experience: "plays its own episodes", local: "trains on each peer's own files" };

function showFederated(session) {
  const local = session.task.kind === "local";
  $("federated-label").hidden = !local;
  $("federated").hidden = !local;
  const last = [...session.history].reverse().find((entry) => entry.federated);
  if (!local) return;
  const judged = session.evaluation === "federated" ? " (this session's metric: the host holds no validation split)" : " (beside the host's validation)";
  $("federated").textContent = !last ? `none yet${judged}`
    : `${Object.entries(last.federated.metrics).map(([k, v]) => `${k} ${fmt(v)}`).join(", ")} on ${last.federated.examples} held-out examples of ${last.federated.results} result${last.federated.results === 1 ? "" : "s"}, of the weights after ${last.federated.of_round} round${last.federated.of_round === 1 ? "" : "s"}${judged}`;
}

// Differential privacy (server/session/privacy.py): the session's epsilon after the last round, the planned one at the
// end and the budget, in words; or that the session adds none.
function showPrivacy(session) {
  const p = session.privacy || { enabled: false, words: "not reported by this relay" };
  if (!p.enabled) { $("privacy").textContent = p.words; return; }
  const eps = (value) => (value === null || value === undefined ? "–" : value.toFixed(2));
  const budget = p.budget === null ? "no budget set" : `the session stops before passing epsilon ${eps(p.budget)}`;
  $("privacy").textContent = `differential privacy: epsilon ${eps(p.epsilon)} at delta ${p.delta} so far`
    + ` (${p.words}); ${eps(p.planned_epsilon)} if the session runs to its end; ${budget}.`
    + ` Each update is clipped to norm ${Number(p.clip).toPrecision(3)}`
    + (p.adaptive_quantile ? ` (following the ${p.adaptive_quantile} quantile of update norms)` : "")
    + ` and noise of ${p.noise_multiplier} times that is added to the sum of updates, so the model says little about any one person's data; smaller epsilon is stronger.`;
}

function showSession(session) {
  peer.session = session;
  $("task-name").textContent = `${session.task.name} (${KINDS[session.task.kind] || session.task.kind})`;
  $("task-boundary").textContent = session.task.crosses_boundary;
  $("merge").textContent = `${session.merge} · ${session.plan.participants_per_round} units per round · ${session.plan.passes} passes`;
  const p = session.peers;
  $("peers").textContent = `${p.connected} connected (${p.joined} joined); `
    + (p.needed > 1 ? `a round starts once ${p.needed} are connected (the host's choice)` : "no start gate: one peer alone trains every unit in turn");
  $("round").textContent = `${Math.min(session.round + 1, session.num_rounds)} of ${session.num_rounds}`;
  $("round-progress").max = session.round_progress.slots || 1;
  // (a finished session's round is past its last: its bar is full, not the empty bar of a round never opened)
  $("round-progress").value = session.done ? $("round-progress").max : session.round_progress.done;
  $("finished-next").hidden = !session.done;
  // session.waiting: what the relay says the session waits for and why (null: a peer asking now gets work)
  $("session-status").textContent = session.done ? `finished: ${session.stopped || "all rounds done"}`
    : session.merging ? "merging and validating the round"
    : session.waiting ? session.waiting
    : `training: ${session.round_progress.done}/${session.round_progress.slots} units back`
      + (session.round_progress.copies ? `, ${session.round_progress.copies} backup or second cop${session.round_progress.copies > 1 ? "ies" : "y"} out` : "");
  const last = session.history[session.history.length - 1];
  $("async").textContent = session.mode !== "async" ? "off (rounds wait for their units)"
    : `weights version ${session.round}; ${session.round_progress.done} of ${session.round_progress.slots} results in the buffer; `
      + (last && last.staleness ? `last merge: results ${last.staleness.join(", ")} versions stale` : "no merge yet");
  $("backups").textContent = last && last.backups
    ? `round ${last.round + 1}: units ${last.backups.units.join(", ")} got a backup; ${last.backups.won.length ? `the backup of ${last.backups.won.join(", ")} came first` : "the originals came first"}`
    : "none in the last round";
  const refused = Object.entries(session.counters).filter(([k]) => k.startsWith("refused."));
  $("refusals").textContent = refused.length ? refused.map(([k, v]) => `${k.slice(8)}: ${v}`).join(", ") : "0";
  const defenses = session.defenses || { guards: [], not_covered: [] };
  $("defenses").replaceChildren(...defenses.guards.map((text) => {
    const li = document.createElement("li");
    li.textContent = text;
    return li;
  }));
  $("not-covered").textContent = defenses.not_covered.join("; ");
  showPrivacy(session);
  showLocalPrivacy(session);
  $("samples").replaceChildren(...session.samples.map((sample) => {
    const li = document.createElement("li");
    li.textContent = sample.text;
    if (sample.ok !== null) li.className = sample.ok ? "ok" : "wrong";
    return li;
  }));
  showLocal(session);
  showFederated(session);
  drawChart(session);
  showTiming(session);
  showParticipants(session);
  showCredit(session);
  showDownload(session);
  showTry(session);
  $("join").disabled = !mayJoin();
  maybeJoin();
}

// Follows the session's status stream; a relay without a session says so.
export function follow() {
  fetch("/api/session").then((response) => {
    if (response.status === 404) { $("no-session").hidden = false; $("session-facts").hidden = true; return; }
    const events = new EventSource("/api/events");
    events.onmessage = (event) => showSession(JSON.parse(event.data));
  });
}
