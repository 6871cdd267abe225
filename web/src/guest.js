// A polite guest (issue 37): the volunteer's say over their machine, as BOINC and Folding@home give it. "Your
// machine" holds the settings, remembered in this browser: the cores (workers.js keeps that count), a CPU share,
// pause on battery (on by default), train only while the page is left alone, and the Pause button (not remembered:
// a page opened again trains). The rules are checked here, in the page, and act through the workers:
//   - a pause (by you, on battery, waiting for idle) is the cores control's 0 without changing the count given: each
//     worker finishes and uploads the unit in hand (or hands back one it was given but had not started) and leaves,
//     so the relay frees its leases at once; resuming joins again with the same credentials, as the same peer;
//   - the CPU share is a duty cycle each worker keeps itself (worker.js): after a unit of T seconds of training it
//     rests T (1 - s) / s before asking for the next, so no lease is held while it rests.
// Nothing here is in the training path: the workers ask, train, upload and rest on their own, and only a change of
// the rules reaches them. That is what keeps a background tab useful: Chromium throttles a hidden page's own timers
// (a 50 ms timer fired 0.5-0.8 s late; chained ones wait up to a minute after five minutes hidden, so the idle rule's
// wait may end that late) but not its dedicated workers. Measured (`peertrain bench hidden-tab`, bytetext, two
// cores): 30.8 units per minute hidden against 30.7 visible (1.00x), 31.7 against 31.6 after 330 s hidden (1.00x),
// and 15.9 against 16.7 (0.96x) at a CPU share of 50 %. So the page changes nothing when hidden: lowering the share there would give
// up half the work for no measured gain, the volunteer's own share and rules already say how much of the machine it
// may use, and where the system allows Chromium gives a hidden tab's renderer a lower priority, so the person's work
// in front comes first.
//
// ?idle-minutes=N turns "only while left alone" on with N minutes (fractions too) and ?share=P sets the CPU share in
// percent (10, 20, ..., 100), for this visit only (tests, benches, a kiosk); neither is remembered.
import { $, params, peer, setActivity, showValue } from "./peer.js";
import { sendShare, setCores, showWorkers } from "./workers.js";

const STORED = "peertrain.guest";
const DEFAULTS = { pauseOnBattery: true, idleOnly: false, idleMinutes: 5, share: 100 };
const SHARES = [100, 90, 80, 70, 60, 50, 40, 30, 20, 10]; // percent of a given core's time
// Input on the page that means someone is using it (pointer moves too: a person reading moves the mouse).
const INPUT_EVENTS = ["pointerdown", "pointermove", "keydown", "touchstart", "wheel", "scroll"];

const guest = {
  settings: { ...DEFAULTS },
  byYou: false, // the Pause button
  battery: null, // the BatteryManager (or what stands for it), null where the browser gives none
  batteryMissing: false,
  lastInput: performance.now(),
  idleTimer: null,
  detector: null, // an IdleDetector, where the browser has the Idle Detection API and the volunteer granted it
  detectorStop: null, // (an AbortController that stops it)
  systemIdle: false, // the detector's last word: no input anywhere on this computer for the idle time, or locked
};

function stored() {
  try { return JSON.parse(localStorage.getItem(STORED) || "{}") || {}; } catch { return {}; }
}

// One setting changed by the volunteer: remembered alone (a setting given in the URL for this visit stays out).
function remember(key, value) {
  guest.settings[key] = value;
  try { localStorage.setItem(STORED, JSON.stringify({ ...stored(), [key]: value })); } catch { /* not remembered */ }
  apply();
}

function loadSettings() {
  const kept = stored();
  const settings = { ...DEFAULTS };
  if (typeof kept.pauseOnBattery === "boolean") settings.pauseOnBattery = kept.pauseOnBattery;
  if (typeof kept.idleOnly === "boolean") settings.idleOnly = kept.idleOnly;
  if (Number(kept.idleMinutes) > 0) settings.idleMinutes = Number(kept.idleMinutes);
  if (SHARES.includes(Number(kept.share))) settings.share = Number(kept.share);
  const idleMinutes = Number(params.get("idle-minutes"));
  if (params.has("idle-minutes") && idleMinutes > 0) Object.assign(settings, { idleOnly: true, idleMinutes });
  const share = Number(params.get("share"));
  if (SHARES.includes(share)) settings.share = share;
  return settings;
}

const minutes = (value) => (value >= 1 ? `${Number(value.toFixed(1))} min` : `${Math.round(value * 60)} s`);
const onBattery = () => Boolean(guest.battery) && !guest.battery.charging;
const idleLeftMs = () => guest.settings.idleMinutes * 60_000 - (performance.now() - guest.lastInput);

// Why the page does not train now ("" when it may), in the words the page shows.
function pauseReason() {
  const s = guest.settings;
  if (guest.byYou) return "paused by you";
  if (s.pauseOnBattery && onBattery()) return "paused: on battery";
  if (s.idleOnly && guest.detector) {
    if (!guest.systemIdle) return `paused: waiting for ${minutes(detectorMinutes())} without input on this computer`;
  } else if (s.idleOnly && idleLeftMs() > 0) {
    return `paused: waiting for ${minutes(s.idleMinutes)} without input`;
  }
  return "";
}

// The Idle Detection API (Chromium, where the volunteer grants it): the whole computer's idle state (input anywhere,
// a locked screen), where the page's own input says nothing about someone working in another window or tab. It is
// asked for when the volunteer turns the rule on (the permission needs that click) and used again on a later visit
// while still granted; refused or missing, the rule counts input on this page, as before. Its shortest idle time is
// a minute.
const detectorMinutes = () => Math.max(1, guest.settings.idleMinutes);

async function watchIdle(ask) {
  if (guest.detector || typeof window.IdleDetector !== "function") return;
  try {
    const state = ask ? await window.IdleDetector.requestPermission()
      : (await navigator.permissions.query({ name: "idle-detection" })).state;
    if (state !== "granted") return;
    const detector = new window.IdleDetector();
    const stop = new AbortController();
    const read = () => { guest.systemIdle = detector.userState === "idle" || detector.screenState === "locked"; };
    detector.addEventListener("change", () => { read(); apply(); });
    await detector.start({ threshold: detectorMinutes() * 60_000, signal: stop.signal });
    Object.assign(guest, { detector, detectorStop: stop });
    read();
  } catch { /* not allowed here (a frame, a policy): the page's own input stands */ }
  apply();
}

function stopWatchingIdle() {
  if (guest.detectorStop) guest.detectorStop.abort();
  Object.assign(guest, { detector: null, detectorStop: null, systemIdle: false });
}

// Re-check the rules; a change of the outcome starts or stops the workers (workers.js: setCores).
function apply() {
  const reason = pauseReason();
  if (guest.settings.idleOnly && !guest.detector && reason.startsWith("paused: waiting") && guest.idleTimer === null) {
    guest.idleTimer = setTimeout(() => { guest.idleTimer = null; apply(); }, Math.max(50, idleLeftMs() + 50));
  }
  const share = guest.settings.share / 100;
  if (share !== peer.share) { peer.share = share; sendShare(); }
  if (reason !== peer.pausedFor) {
    peer.pausedFor = reason;
    setCores(peer.cores);
    if (peer.joined && !peer.workers.some((record) => record.joined)) {
      setActivity(reason || "resuming", reason ? "paused" : "joining");
    }
  }
  document.body.dataset.guest = reason ? "paused" : "training";
  show();
}

// What "Join and train" will use, in one line, and the settings as they are.
function show() {
  const s = guest.settings;
  const cores = navigator.hardwareConcurrency || 1;
  const rules = [`${peer.cores} of this machine's ${cores} core${cores === 1 ? "" : "s"}, ${s.share} % of their time`,
    guest.batteryMissing ? "this browser does not say when it runs on battery"
      : s.pauseOnBattery ? "pauses on battery" : "trains on battery too",
    !s.idleOnly ? "whether or not you use this page" : guest.detector
      ? `only after ${minutes(detectorMinutes())} without input on this computer`
      : `only after ${minutes(s.idleMinutes)} without input on this page`];
  $("guest-use").textContent = `Uses ${rules.join("; ")}.`;
  $("pause").textContent = guest.byYou ? "Resume" : "Pause";
  $("pause").setAttribute("aria-pressed", String(guest.byYou));
  showValue("share", String(s.share));
  $("pause-on-battery").checked = s.pauseOnBattery;
  $("idle-only").checked = s.idleOnly;
  showValue("idle-minutes", String(s.idleMinutes));
  $("battery-note").textContent = guest.batteryMissing
    ? "this browser does not tell pages whether it runs on battery (Firefox and Safari keep it to themselves), so this cannot apply"
    : guest.battery ? `now ${guest.battery.charging ? "plugged in" : `on battery (${Math.round(guest.battery.level * 100)} %)`}` : "";
  showWorkers(); // (the status line: why the page pauses or rests)
}

// The Battery Status API, where the browser has it; "chargingchange" re-checks the rules.
async function watchBattery() {
  try {
    if (typeof navigator.getBattery !== "function") throw new Error("no Battery Status API");
    guest.battery = await navigator.getBattery();
    guest.battery.addEventListener("chargingchange", apply);
    guest.battery.addEventListener("levelchange", show);
  } catch {
    guest.battery = null;
    guest.batteryMissing = true;
    $("pause-on-battery").disabled = true;
  }
  apply();
}

// Input on the page: a person uses it. Only a pause it starts needs the rules checked at once; the timer that ends
// the wait is set in apply().
function noteInput() {
  guest.lastInput = performance.now();
  if (guest.settings.idleOnly && !peer.pausedFor) apply();
}

export function startGuest() {
  guest.settings = loadSettings();
  peer.guest = guest; // (window.peertrain.guest: the tests read the settings)
  $("share").replaceChildren(...SHARES.map((share) => new Option(`${share} %`, String(share))));
  $("share").addEventListener("change", () => remember("share", Number($("share").value)));
  $("pause-on-battery").addEventListener("change", () => remember("pauseOnBattery", $("pause-on-battery").checked));
  $("idle-only").addEventListener("change", () => {
    guest.lastInput = performance.now(); // (the click itself was input)
    remember("idleOnly", $("idle-only").checked);
    if ($("idle-only").checked) watchIdle(true);
    else stopWatchingIdle();
  });
  $("idle-minutes").addEventListener("change", () => {
    const value = Number($("idle-minutes").value);
    if (value > 0) remember("idleMinutes", value);
    showValue("idle-minutes", String(guest.settings.idleMinutes), true);
    if (guest.detector) { stopWatchingIdle(); watchIdle(false); } // (a new idle time: a new threshold)
  });
  $("pause").addEventListener("click", () => { guest.byYou = !guest.byYou; apply(); });
  $("cores").addEventListener("change", show); // (after workers.js's own listener has set the count)
  for (const type of INPUT_EVENTS) window.addEventListener(type, noteInput, { capture: true, passive: true });
  document.addEventListener("visibilitychange", apply); // (a hidden page's timers run late: check on the way back)
  apply();
  watchBattery();
  if (guest.settings.idleOnly) watchIdle(false);
}
