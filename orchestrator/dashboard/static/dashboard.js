// Live updates for the box and fleet pages (SSE) and charts (uPlot). The tables are complete without this file.
"use strict";
(function () {
  const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];
  const plots = new Map();

  function draw(el, data, opts) {
    const old = plots.get(el);
    if (old) { old.destroy(); }
    el.textContent = "";
    if (!data || !data.x.length) { el.textContent = "no data yet"; el.className = "chart dim"; return; }
    const series = [{}].concat(data.series.map((s, i) => ({
      label: s.label + (s.winner ? " (winner)" : ""), stroke: COLORS[i % COLORS.length],
      width: s.winner ? 3 : 1.5, spanGaps: false, points: { show: true, size: 6 }})));
    const plot = new uPlot(Object.assign({ width: Math.min(900, window.innerWidth - 60), height: 240, series },
                                         opts), [data.x].concat(data.series.map(s => s.values)), el);
    plots.set(el, plot);
  }

  function drawCharts(charts) {
    charts = charts || {};
    document.querySelectorAll('.chart[data-chart="downtime"]').forEach(el => {
      const c = charts[el.dataset.host];
      draw(el, c && c.downtime, { axes: [{}, { label: "downtime (s)" }] });
    });
    document.querySelectorAll('.chart[data-chart^="bench_"]').forEach(el => {
      const c = charts[el.dataset.host];
      const data = c && c[el.dataset.chart];
      const key = JSON.stringify(data);
      if (el.dataset.drawn === key) { return; }  // redraw only when the numbers change
      el.dataset.drawn = key;
      draw(el, data, { scales: { x: { time: false, distr: 3, log: 2 } },
                       axes: [{ label: "concurrency" }, { label: el.dataset.axis }] });
    });
  }

  const box = document.querySelector("main[data-live]");  // the box page, or a controller's fleet page
  if (box) {
    drawCharts(JSON.parse(box.dataset.charts));
    const source = new EventSource(box.dataset.live);
    source.addEventListener("sections", ev => {
      const msg = JSON.parse(ev.data);
      if (msg.error) { document.getElementById("updated").textContent = msg.error; return; }
      for (const [id, html] of Object.entries(msg.html)) {
        const el = document.getElementById(id);
        if (el && el.innerHTML !== html) { el.innerHTML = html; }
      }
      document.getElementById("updated").textContent = "live, as of " + msg.at;
      drawCharts(msg.charts);
    });
    source.onerror = () => { document.getElementById("updated").textContent = "reconnecting…"; };
  }

  document.querySelectorAll('.chart[data-chart="tune"]').forEach(el => {
    draw(el, JSON.parse(el.dataset.tune), {
      scales: { x: { time: false, distr: 3, log: 2 } },
      axes: [{ label: "concurrency" }, { label: el.dataset.axis }],
    });
  });
})();
