// The page's entry module: starts the worker, follows the session live (server-sent events) and wires the
// page's controls. Each concern is a module of its own:
//   peer.js          this peer's state (window.peertrain) and the join
//   boot.js          a worker: its start, the table of handlers for its messages, run/ask requests
//   workers.js       how many workers train (the "Cores" control), their start and their leaving
//   guest.js         the volunteer's rules ("Your machine"): CPU share, pause on battery, only when idle, Pause
//   session_view.js  the session's facts, progress, defenses and samples, and the sections that follow it
//   chart.js         the metrics chart and the round timing
//   participants.js  "Who takes part": a row per volunteer
//   identity.js      the volunteer's key (IndexedDB, WebCrypto) that each worker proves when it joins
//   credit.js        "What you gave": the key's panel, the credit, the leaderboard and the teams
//   local_files.js   the file picker of local tasks
//   try_model.js     "Try the model"; task_views.js draws an answer's episode by task name (drawings/)
//   download.js      "Download the model"
import { drawChart } from "./chart.js";
import { startIdentity } from "./credit.js";
import { download } from "./download.js";
import { startGuest } from "./guest.js";
import { listenForFiles } from "./local_files.js";
import { $, join, peer } from "./peer.js";
import { follow } from "./session_view.js";
import { tryModel } from "./try_model.js";
import { startWorkers } from "./workers.js";

startIdentity();
startWorkers();
startGuest();
$("join").addEventListener("click", join);
$("try-form").addEventListener("submit", tryModel);
$("download-form").addEventListener("submit", download);
$("metric-select").addEventListener("change", () => { if (peer.session) drawChart(peer.session); });
listenForFiles();
follow();
