// "Who takes part": a row per volunteer (a key its page proves: identity.js; a peer without one is a row of its
// own), with its name or an anonymous handle, team, workers connected, units, credit, from the status stream.
import { gflop, ownEntry } from "./credit.js";
import { $ } from "./peer.js";

const HEADINGS = ["Volunteer", "Team", "Workers", "Units", "Credit (GFLOP)", "Device", "Median unit", "Last seen",
  "Refused", "Banned"];

function ago(seconds) {
  return seconds < 90 ? `${seconds.toFixed(0)} s ago` : `${(seconds / 60).toFixed(0)} min ago`;
}

export function showParticipants(session) {
  const table = $("participants");
  if (table.tHead.rows[0].cells.length !== HEADINGS.length) {
    const head = document.createElement("tr");
    for (const heading of HEADINGS) {
      const th = document.createElement("th");
      th.scope = "col";
      th.textContent = heading;
      head.append(th);
    }
    table.tHead.replaceChildren(head);
  }
  const own = ownEntry(session);
  const rows = (session.volunteers || []).map((v) => {
    const tr = document.createElement("tr");
    tr.dataset.volunteer = v.volunteer;
    tr.dataset.peers = v.peers.join(" ");
    if (own && own.volunteer === v.volunteer) tr.dataset.mine = "1"; // (style.css marks the row "you")
    for (const value of [v.name, v.team || "–", String(v.workers), String(v.units_done), gflop(v.credit),
      v.devices.join(", ") || "–", v.median_unit_seconds === null ? "–" : `${v.median_unit_seconds.toFixed(1)} s`,
      ago(v.last_seen_seconds), String(v.refusals), v.banned ? "banned" : "no"]) {
      const td = document.createElement("td");
      td.textContent = value;
      tr.append(td);
    }
    return tr;
  });
  table.tBodies[0].replaceChildren(...rows);
}
