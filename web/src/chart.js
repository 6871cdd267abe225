// The metrics chart (Chart.js, the UMD build the page loads from /vendor/chart.umd.js) and the round timing.
import { $, peer } from "./peer.js";

let chart = null;

// The metrics the chart can show: every validation metric the session has reported, and for a local task the
// peers' federated evaluation of the same metrics (``federated_<name>``).
const FEDERATED = "federated_";

function metricNames(session) {
  const names = new Set(Object.keys(session.initial_metrics || {}));
  for (const entry of session.history) {
    for (const key of Object.keys(entry.metrics || {})) names.add(key);
    for (const key of Object.keys((entry.federated || {}).metrics || {})) names.add(FEDERATED + key);
  }
  return [...names];
}

function chosenMetric(session) {
  const select = $("metric-select");
  const names = metricNames(session);
  const judged = (session.evaluation === "federated" ? FEDERATED : "") + session.metric;
  if (select.options.length !== names.length) {
    const keep = select.value || (session.evaluation === "federated" ? FEDERATED : "") + (session.task.plot_metric || session.metric);
    select.replaceChildren(...names.map((name) => new Option(name, name)));
    select.value = names.includes(keep) ? keep : judged;
  }
  return select.value || judged;
}

// x = rounds merged into the weights the point judges: the host validates after each merge (x = round + 1); a
// round's federated evaluation judges the weights that round started from (x = its of_round).
function hostPoints(session, name) {
  const points = new Map();
  if (session.initial_metrics && session.initial_metrics[name] !== undefined) points.set(0, session.initial_metrics[name]);
  for (const entry of session.history) if ((entry.metrics || {})[name] !== undefined) points.set(entry.round + 1, entry.metrics[name]);
  return points;
}

function federatedPoints(session, name) {
  const points = new Map();
  for (const entry of session.history) {
    const federated = entry.federated;
    if (federated && (federated.metrics || {})[name] !== undefined) points.set(federated.of_round, federated.metrics[name]);
  }
  return points;
}

export function drawChart(session) {
  const metric = chosenMetric(session);
  const name = metric.startsWith(FEDERATED) ? metric.slice(FEDERATED.length) : metric;
  // Async mode validates every few merges: the chart has a point per validation, at its merge.
  const host = hostPoints(session, name);
  const federated = federatedPoints(session, name);
  const training = new Map(session.history.map((entry) => [entry.round + 1, (entry.train || {}).train_loss ?? (entry.train || {}).mean_return ?? null]));
  const labels = [...new Set([...host.keys(), ...federated.keys()])].sort((a, b) => a - b);
  const at = (points) => labels.map((label) => (points.has(label) ? points.get(label) : null));
  const best = session.best && session.best.round !== null && session.best.round !== undefined ? session.best.round + 1 : 0;
  // The initial point and the best round are drawn larger.
  const radius = labels.map((label) => (label === 0 || (label === best && name === session.metric) ? 6 : 2));
  $("metric-name").textContent = metric;
  peer.chartMetric = metric;
  peer.chartPoints = labels.length;
  if (typeof Chart === "undefined") return;
  const datasets = [];
  if (host.size) datasets.push({ label: name, data: at(host), borderColor: "#2f6fdf", tension: 0.1, pointRadius: radius, yAxisID: "y", spanGaps: true });
  if (federated.size) {
    datasets.push({ label: `${name}, federated (peers' held-out examples)`, data: at(federated), borderColor: "#1b7f3b",
      tension: 0.1, pointRadius: radius, yAxisID: "y", spanGaps: true });
  }
  datasets.push({ label: "local training loss (mean of the units)", data: at(training), borderColor: "#d9822b",
    borderDash: [4, 3], tension: 0.1, pointRadius: 1, yAxisID: "y1", spanGaps: true });
  if (!chart) {
    chart = new Chart($("chart"), {
      type: "line",
      data: { labels, datasets },
      options: { animation: false, responsive: true, scales: { x: { title: { display: true, text: "round" } },
        y: { position: "left" }, y1: { position: "right", grid: { drawOnChartArea: false } } } },
    });
  } else {
    chart.data.labels = labels;
    chart.data.datasets = datasets;
    chart.update();
  }
}

export function showTiming(session) {
  const times = session.history.map((entry) => entry.time).filter((t) => typeof t === "number");
  if (times.length < 2) { $("timing").textContent = "Round timing: after two rounds"; return; }
  const gaps = times.slice(1).map((t, i) => t - times[i]).sort((a, b) => a - b);
  const median = gaps[Math.floor(gaps.length / 2)];
  const left = Math.max(0, session.num_rounds - session.round);
  $("timing").textContent = session.done ? `Round timing: ${median.toFixed(1)} s per round (median)`
    : `Round timing: ${median.toFixed(1)} s per round (median); about ${Math.ceil((median * left) / 60)} min left for ${left} round${left === 1 ? "" : "s"}`;
}
