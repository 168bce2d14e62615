// metrale report: draws the charts of the page from the JSON in #report-data. Every number it
// shows arrives formatted (metrale.fmt on the Python side); this script only places them.
"use strict";
(function () {
  const data = JSON.parse(document.getElementById("report-data").textContent);
  const NS = "http://www.w3.org/2000/svg";
  const COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                   "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
  const tip = document.getElementById("tip");

  function el(name, attrs, parent) {
    const node = document.createElementNS(NS, name);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (parent) parent.appendChild(node);
    return node;
  }

  function text(parent, x, y, content, attrs) {
    const node = el("text", Object.assign({ x: x, y: y }, attrs || {}), parent);
    node.textContent = content;
    return node;
  }

  // A value to a pixel on an axis [lo, hi] -> [a, b], linear or log.
  function scale(axis, a, b) {
    if (axis.log) {
      const l0 = Math.log10(axis.lo), l1 = Math.log10(axis.hi);
      return (v) => a + (Math.log10(Math.max(v, axis.lo)) - l0) / (l1 - l0) * (b - a);
    }
    return (v) => a + (v - axis.lo) / ((axis.hi - axis.lo) || 1) * (b - a);
  }

  function showTip(evt, content) {
    tip.textContent = content;
    tip.style.display = "block";
    tip.style.left = (evt.clientX + 12) + "px";
    tip.style.top = (evt.clientY + 12) + "px";
  }

  function hideTip() { tip.style.display = "none"; }

  function openCell(id) {
    const target = document.getElementById(id);
    if (target) { target.open = true; target.scrollIntoView({ block: "start" }); }
  }

  function frame(panel, width, height) {
    const box = document.createElement("div");
    box.className = "chart";
    const svg = el("svg", { width: width, height: height, viewBox: `0 0 ${width} ${height}`,
                            role: "img", "aria-label": panel.title });
    box.appendChild(svg);
    text(svg, 8, 16, panel.title, { class: "title" });
    return [box, svg];
  }

  function yAxis(svg, axis, y, left, right) {
    for (const [value, label] of axis.ticks) {
      const py = y(value);
      el("line", { x1: left, x2: right, y1: py, y2: py, class: "grid" }, svg);
      text(svg, left - 6, py + 4, label, { "text-anchor": "end" });
    }
  }

  // One panel of the per-stage chart: a point at p50 per cell, a whisker p10–p90.
  function stagePanel(panel, runtimes) {
    const left = 64, right = 16, top = 28, bottom = 56;
    const step = 34, width = Math.max(300, left + right + step * panel.points.length);
    const height = 260;
    const [box, svg] = frame(panel, width, height);
    const y = scale(panel.y, height - bottom, top);
    yAxis(svg, panel.y, y, left, width - right);
    el("line", { x1: left, x2: width - right, y1: height - bottom, y2: height - bottom,
                 class: "axis" }, svg);
    panel.points.forEach((p, i) => {
      const px = left + step * (i + 0.5);
      const colour = COLOURS[runtimes.indexOf(p.runtime) % COLOURS.length];
      const label = text(svg, px, height - bottom + 14, p.label, { "text-anchor": "end",
        transform: `rotate(-35 ${px} ${height - bottom + 14})` });
      label.style.fontSize = "10px";
      if (p.p50 === null) {
        text(svg, px, height - bottom - 6, "–", { "text-anchor": "middle", class: "err" });
        return;
      }
      const g = el("g", { class: "pt", "data-cell": p.id }, svg);
      el("line", { x1: px, x2: px, y1: y(p.p10), y2: y(p.p90), stroke: colour,
                   class: "whisker" }, g);
      el("circle", { cx: px, cy: y(p.p50), r: 5, fill: colour }, g);
      el("rect", { x: px - step / 2, y: top, width: step, height: height - top - bottom,
                   fill: "transparent" }, g);
      g.addEventListener("mousemove", (evt) => showTip(evt, p.tip));
      g.addEventListener("mouseleave", hideTip);
      g.addEventListener("click", () => openCell(p.id));
    });
    return box;
  }

  // One panel of curves (serve: latency against achieved throughput), one line per series.
  function curvePanel(panel) {
    const left = 64, right = 16, top = 28, bottom = 44, width = 420, height = 280;
    const [box, svg] = frame(panel, width, height);
    const x = scale(panel.x, left, width - right);
    const y = scale(panel.y, height - bottom, top);
    yAxis(svg, panel.y, y, left, width - right);
    for (const [value, label] of panel.x.ticks) {
      const px = x(value);
      el("line", { x1: px, x2: px, y1: top, y2: height - bottom, class: "grid" }, svg);
      text(svg, px, height - bottom + 14, label, { "text-anchor": "middle" });
    }
    text(svg, (left + width - right) / 2, height - 8, panel.x_label, { "text-anchor": "middle" });
    if (panel.mark !== null) {
      el("line", { x1: x(panel.mark), x2: x(panel.mark), y1: top, y2: height - bottom,
                   stroke: "#d62728", "stroke-dasharray": "4 3" }, svg);
      const knee = text(svg, x(panel.mark) - 4, top + 10, "knee", { "text-anchor": "end" });
      knee.style.fill = "#d62728";
    }
    panel.series.forEach((s, k) => {
      const colour = COLOURS[k % COLOURS.length];
      const pts = s.points.map((p) => `${x(p[0])},${y(p[1])}`).join(" ");
      el("polyline", { points: pts, fill: "none", stroke: colour, "stroke-width": 2,
                       "stroke-dasharray": s.dashed ? "5 3" : "none" }, svg);
      s.points.forEach((p) => {
        const g = el("g", { class: "pt" }, svg);
        el("circle", { cx: x(p[0]), cy: y(p[1]), r: 4, fill: colour }, g);
        g.addEventListener("mousemove", (evt) => showTip(evt, p[2]));
        g.addEventListener("mouseleave", hideTip);
      });
      const legend = text(svg, left + 8, top + 12 + 14 * k, s.name, {});
      legend.style.fill = colour;
    });
    return box;
  }

  const stages = document.getElementById("stage-charts");
  if (stages) for (const panel of data.panels) stages.appendChild(stagePanel(panel, data.runtimes));
  for (const group of data.curves) {
    const host = document.getElementById(group.host);
    if (host) for (const panel of group.panels) host.appendChild(curvePanel(panel));
  }
  for (const row of document.querySelectorAll("tr.cellrow")) {
    row.addEventListener("click", () => openCell(row.dataset.cell));
  }

  // `#selftest`: hover every point as a pointer would and record what the tooltip said, so a
  // headless browser can check the page's interaction from its DOM alone.
  if (location.hash === "#selftest") {
    const seen = [];
    for (const g of document.querySelectorAll("#stage-charts g.pt")) {
      g.dispatchEvent(new MouseEvent("mousemove", { clientX: 10, clientY: 10, bubbles: true }));
      seen.push(tip.style.display === "block" ? tip.textContent : "");
      g.dispatchEvent(new MouseEvent("mouseleave"));
    }
    document.body.dataset.tips = JSON.stringify(seen);
  }
  document.body.dataset.rendered = String(document.querySelectorAll("svg").length);
})();
