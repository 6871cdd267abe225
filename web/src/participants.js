// "Who takes part": a row per peer of the session, from the status stream.
import { $, peer } from "./peer.js";

function ago(seconds) {
  return seconds < 90 ? `${seconds.toFixed(0)} s ago` : `${(seconds / 60).toFixed(0)} min ago`;
}

export function showParticipants(session) {
  const rows = (session.participants || []).map((p) => {
    const tr = document.createElement("tr");
    tr.dataset.peer = p.peer;
    // One of this page's workers? (the table shows the first characters of a peer's id)
    const mine = peer.workers.find((record) => record.peerId && record.peerId.startsWith(p.peer));
    if (mine) tr.dataset.mine = String(mine.index + 1); // (style.css marks the row "this page, worker N")
    for (const value of [p.peer, p.device || "–", String(p.units_done),
      p.median_unit_seconds === null ? "–" : `${p.median_unit_seconds.toFixed(1)} s`, ago(p.last_seen_seconds),
      String(p.refusals), p.banned ? "banned" : "no"]) {
      const td = document.createElement("td");
      td.textContent = value;
      if (mine) td.dataset.mine = String(mine.index + 1);
      tr.append(td);
    }
    return tr;
  });
  $("participants").tBodies[0].replaceChildren(...rows);
}
