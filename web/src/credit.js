// "What you gave": the volunteer's key and name (identity.js), the credit the relay granted for its verified work,
// the leaderboard and the teams, from the status stream (server/relay/credit.py says how credit is counted: the
// relay's count of training FLOPs of each unit whose verification settled, in GFLOP; a ban takes it back).
import { forgetKey, rememberProfile, volunteerKey, volunteerProfile } from "./identity.js";
import { $, peer } from "./peer.js";

const MAX_CHARS = 40;

export const gflop = (value) => (value >= 100 ? value.toFixed(0) : value >= 1 ? value.toFixed(1) : value.toPrecision(2));

function element(tag, attributes = {}, text = "") {
  const node = document.createElement(tag);
  Object.assign(node, attributes);
  if (text) node.textContent = text;
  return node;
}

// Tell the relay about a new name or team through one of this page's joined workers (they all are this volunteer).
async function sendProfile(profile) {
  const joined = peer.workers.find((record) => record.peerId && record.token);
  if (!joined) return "saved in this browser; sent with your next join";
  const response = await fetch("/api/volunteer", { method: "POST", body: JSON.stringify(profile),
    headers: { Authorization: `Bearer ${joined.peerId}:${joined.token}`, "Content-Type": "application/json" } });
  const answer = await response.json().catch(() => ({}));
  return response.ok ? "saved" : `not saved: ${answer.message || response.status}`;
}

// The identity panel: who this browser is to the relay, its name and team, and forgetting the key.
export async function startIdentity() {
  const panel = $("volunteer-identity");
  if (!panel) return;
  let key = null;
  try {
    key = await volunteerKey();
  } catch { /* IndexedDB refused (a private window may): the workers join as anonymous peers */ }
  peer.volunteer = key ? key.volunteer : null;
  const profile = volunteerProfile();
  const name = element("input", { id: "volunteer-name", maxLength: MAX_CHARS, value: profile.name, autocomplete: "off" });
  const team = element("input", { id: "volunteer-team", maxLength: MAX_CHARS, value: profile.team, autocomplete: "off" });
  const note = element("span", { id: "volunteer-note", className: "note" });
  const save = element("button", { id: "volunteer-save", type: "button" }, "Save");
  const forget = element("button", { id: "volunteer-forget", type: "button" }, "Forget my key");
  const who = element("p", { id: "volunteer-who" }, key
    ? `To this relay you are volunteer-${key.volunteer.slice(0, 6)}: a key this browser keeps (it never leaves it) `
      + "proves it each time you join, so your credit and record follow you across reloads and tabs. Anonymous unless "
      + "you give a name."
    : "This browser keeps no key (its storage is off): you take part as an anonymous peer, and credit lasts this visit.");
  const nameLabel = element("label", {}, "Display name ");
  nameLabel.append(name);
  const teamLabel = element("label", {}, " Team ");
  teamLabel.append(team);
  panel.replaceChildren(who, nameLabel, teamLabel, " ", save, " ", forget, " ", note);
  save.addEventListener("click", async () => {
    const chosen = { name: name.value.trim(), team: team.value.trim() };
    rememberProfile(chosen.name, chosen.team);
    note.textContent = await sendProfile(chosen).catch((error) => `not saved: ${error.message}`);
  });
  forget.addEventListener("click", async () => {
    await forgetKey().catch(() => {});
    rememberProfile("", "");
    name.value = team.value = "";
    note.textContent = "forgotten: this browser's key is deleted; reload to join as a new volunteer";
    peer.volunteer = null;
  });
}

function table(id, caption, headings, rows) {
  const holder = $(id);
  if (!holder) return;
  if (!rows.length) { holder.replaceChildren(); return; }
  const tableNode = element("table");
  tableNode.append(element("caption", {}, caption));
  const head = element("tr");
  for (const heading of headings) head.append(element("th", { scope: "col" }, heading));
  tableNode.append(element("thead"), element("tbody"));
  tableNode.tHead.append(head);
  for (const { cells, mine } of rows) {
    const tr = element("tr");
    if (mine) tr.dataset.mine = "1";
    for (const cell of cells) tr.append(element("td", {}, String(cell)));
    tableNode.tBodies[0].append(tr);
  }
  const scroll = element("div", { className: "scroll" }); // (a phone's screen scrolls the table, not the page)
  scroll.append(tableNode);
  holder.replaceChildren(scroll);
}

// The volunteer's own entry: its key's, or (keyless) the one holding a peer of this page.
export function ownEntry(session) {
  const entries = session.volunteers || [];
  if (peer.volunteer) return entries.find((v) => v.volunteer === peer.volunteer) || null;
  const ids = peer.workers.map((record) => record.peerId).filter(Boolean);
  return entries.find((v) => v.peers.some((short) => ids.some((id) => id.startsWith(short)))) || null;
}

export function showCredit(session) {
  const credit = session.credit;
  if (!credit || !$("you-gave")) return;
  const own = ownEntry(session);
  $("you-gave").textContent = own && own.credit > 0
    ? `You gave ${gflop(own.credit)} GFLOP of verified training (${own.credited_units} units; rank ${own.rank} of ${credit.count}).`
    : "Your credit comes once your units are verified: their round merged and its checks settled.";
  table("leaderboard", "Leaderboard: credit for verified work", ["#", "Volunteer", "Team", "Credit (GFLOP)", "Recent (a day)", "Units"],
    credit.top.map((v) => ({ mine: own !== null && v.volunteer === own.volunteer,
      cells: [v.rank, v.name, v.team || "–", gflop(v.total), gflop(v.recent_average), v.units] })));
  table("teams", "Teams", ["#", "Team", "Credit (GFLOP)", "Volunteers", "Units"],
    credit.teams.map((t) => ({ mine: own !== null && t.team === own.team,
      cells: [t.rank, t.team, gflop(t.total), t.volunteers, t.units] })));
}
