// ray_ckpt dashboard: renders /api/data (or the data inlined by `--export`) with plain SVG/DOM.
"use strict";

(function () {
  var SVG = "http://www.w3.org/2000/svg";
  var POLL_MS = 2000;
  var MAX_JOB_CARDS = 4;  // per-job cards shown at most (the jobs sorted by name)
  var NO_STATUS = "no data (no status snapshot in the events and no live cluster)";
  var PHASE_COLORS = {
    detect: "#e15759",
    restart: "#f28e2b",
    replace: "#ff9da7",
    rendezvous: "#9c755f",
    locate: "#edc948",
    fetch: "#4e79a7",
    decode: "#76b7b2",
    load: "#59a14f",
    first_step: "#b07aa1",
  };
  var OTHER_COLOR = "#c9d1da";
  var PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac"];
  var state = { data: null };

  // ---- small helpers ------------------------------------------------------------------

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    setAttrs(node, attrs);
    append(node, children);
    return node;
  }

  function svg(tag, attrs, children) {
    var node = document.createElementNS(SVG, tag);
    setAttrs(node, attrs);
    append(node, children);
    return node;
  }

  function setAttrs(node, attrs) {
    Object.keys(attrs || {}).forEach(function (key) {
      var value = attrs[key];
      if (value === null || value === undefined || value === false) return;
      if (key === "text") node.textContent = String(value);
      else node.setAttribute(key, String(value));
    });
  }

  function append(node, children) {
    (children || []).forEach(function (child) {
      if (child === null || child === undefined) return;
      node.appendChild(typeof child === "string" ? document.createTextNode(child) : child);
    });
  }

  function clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
    return node;
  }

  function isNum(v) {
    return typeof v === "number" && isFinite(v);
  }

  function fmtSeconds(v) {
    if (!isNum(v)) return "–";
    var a = Math.abs(v);
    if (a < 1) return (v * 1000).toFixed(a < 0.01 ? 2 : a < 0.1 ? 1 : 0) + " ms";
    return v.toFixed(a < 10 ? 2 : a < 100 ? 1 : 0) + " s";
  }

  // an axis tick in seconds, with as many decimals as the tick step needs
  function fmtTickSeconds(v, step) {
    if (v === 0) return "0";
    if (step >= 1) return v.toFixed(0) + " s";
    if (step >= 0.1) return v.toFixed(1) + " s";
    if (step >= 0.01) return v.toFixed(2) + " s";
    return (v * 1000).toFixed(step >= 0.001 ? 0 : 1) + " ms";
  }

  function fmtBytes(v) {
    if (!isNum(v)) return "–";
    var units = ["B", "KiB", "MiB", "GiB", "TiB"];
    var i = 0;
    while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
    return (i === 0 ? v.toFixed(0) : v.toFixed(1)) + " " + units[i];
  }

  function fmtTime(t) {
    if (!isNum(t)) return "–";
    var d = new Date(t * 1000);
    function two(n) { return (n < 10 ? "0" : "") + n; }
    return two(d.getHours()) + ":" + two(d.getMinutes()) + ":" + two(d.getSeconds());
  }

  function fmtDateTime(t) {
    if (!isNum(t)) return "–";
    var d = new Date(t * 1000);
    return d.getFullYear() + "-" + ("0" + (d.getMonth() + 1)).slice(-2) + "-" + ("0" + d.getDate()).slice(-2) +
      " " + fmtTime(t);
  }

  function shortNode(id) {
    return id ? String(id).slice(0, 8) : "?";
  }

  // "host (1a2b3c4d)" when the host is known, else the short id
  function nodeName(id) {
    var info = ((state.data && state.data.nodes) || {})[id];
    return info && info.host ? info.host + " (" + shortNode(id) + ")" : shortNode(id);
  }

  // the ranks that last ran on a node: "gpt-small r0, r1" (only "r0, r1" of ``job`` when given)
  function nodeRanks(id, job) {
    var info = ((state.data && state.data.nodes) || {})[id];
    var byJob = {};
    ((info && info.ranks) || []).forEach(function (r) { (byJob[r.job] = byJob[r.job] || []).push("r" + r.rank); });
    if (job !== undefined) return (byJob[job] || []).join(", ");
    return Object.keys(byJob).sort().map(function (name) { return name + " " + byJob[name].join(", "); }).join("; ");
  }

  function nodeTitle(id) {
    var info = ((state.data && state.data.nodes) || {})[id] || {};
    return [id, info.host, info.address, nodeRanks(id) ? "ranks: " + nodeRanks(id) : ""].filter(Boolean).join("\n");
  }

  // nodes ordered by host name (then id); dead or store-less ones last when ``goneLast``
  function byHost(list, goneLast) {
    function key(n) {
      var info = ((state.data && state.data.nodes) || {})[n.node_id] || {};
      return (goneLast && (!n.alive || n.store === false) ? "1" : "0") + (info.host || "~") + " " + n.node_id;
    }
    return list.slice().sort(function (a, b) { return key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : 0; });
  }

  function sourceNote(part) {
    if (!part || part.source !== "snapshot") return "";
    return "from the status snapshot of " + fmtDateTime(part.time) + (part.job ? " (job " + part.job + ")" : "");
  }

  function median(values) {
    var v = values.filter(isNum).slice().sort(function (a, b) { return a - b; });
    if (!v.length) return null;
    var mid = Math.floor(v.length / 2);
    return v.length % 2 ? v[mid] : (v[mid - 1] + v[mid]) / 2;
  }

  function noData(body, text) {
    clear(body).appendChild(el("div", { "class": "nodata", text: text }));
  }

  function width(node, fallback) {
    var w = node.clientWidth || (node.parentNode && node.parentNode.clientWidth) || fallback;
    return Math.max(320, w);
  }

  // "nice" axis ticks between lo and hi
  function ticks(lo, hi, count, minStep) {
    if (!(hi > lo)) hi = lo + 1;
    var span = hi - lo;
    var step = Math.pow(10, Math.floor(Math.log10(span / count)));
    var err = (count * step) / span;
    if (err <= 0.15) step *= 10;
    else if (err <= 0.35) step *= 5;
    else if (err <= 0.75) step *= 2;
    if (minStep && step < minStep) step = minStep;
    var out = [];
    for (var v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(+v.toFixed(10));
    return { values: out, step: step };
  }

  // ---- charts -------------------------------------------------------------------------

  // series: [{name, color, points: [{x, y, title}]}]; opts: {xTime, yFormat, xFormat, xLabel, yLabel}
  function lineChart(body, series, opts) {
    var W = width(body, 560), H = opts.height || 240;
    var m = { left: 58, right: 16, top: 12, bottom: 38 };
    var pts = [];
    series.forEach(function (s) { pts = pts.concat(s.points); });
    var xs = pts.map(function (p) { return p.x; }), ys = pts.map(function (p) { return p.y; });
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs);
    var xt;
    if (x1 === x0) {
      // one x value (one point, or every point at the same x): the point centred, one tick at its value
      var half = opts.xTime ? 30 : Math.max(1, Math.abs(x0) * 0.1);
      xt = { values: [x0], step: half };
      x0 -= half;
      x1 += half;
    } else {
      if (opts.xPad) { var pad = (x1 - x0) * opts.xPad; x0 -= pad; x1 += pad; }
      if (opts.xMin !== undefined) x0 = Math.max(opts.xMin, x0);
      xt = ticks(x0, x1, Math.max(2, Math.floor((W - m.left - m.right) / 110)), opts.xInteger ? 1 : 0);
    }
    // y from 0 (these series are durations); a constant 0 series gets a 0..1 axis
    var yMax = Math.max.apply(null, ys);
    var yt = ticks(0, yMax > 0 ? yMax * 1.1 : 1, 5);
    var y1 = yt.values[yt.values.length - 1];
    if (y1 < yMax * 1.1) { y1 = +(y1 + yt.step).toFixed(10); yt.values.push(y1); }  // headroom above the top point
    function sx(v) { return m.left + ((v - x0) / (x1 - x0)) * (W - m.left - m.right); }
    function sy(v) { return H - m.bottom - (v / y1) * (H - m.top - m.bottom); }
    var root = svg("svg", { width: W, height: H, viewBox: "0 0 " + W + " " + H, role: "img", "class": "chart",
      "data-x-ticks": xt.values.filter(function (v) { return v >= x0 && v <= x1; }).join(","),
      "data-y-ticks": yt.values.join(","), "data-plot-left": m.left, "data-plot-right": W - m.right });
    var grid = svg("g", { "class": "axis" });
    yt.values.forEach(function (v) {
      grid.appendChild(svg("line", { "class": "gridline", x1: m.left, x2: W - m.right, y1: sy(v), y2: sy(v) }));
      grid.appendChild(svg("text", { x: m.left - 6, y: sy(v) + 4, "text-anchor": "end", text: opts.yFormat(v, yt.step) }));
    });
    xt.values.forEach(function (v) {
      if (v < x0 || v > x1) return;
      grid.appendChild(svg("line", { x1: sx(v), x2: sx(v), y1: H - m.bottom, y2: H - m.bottom + 4 }));
      grid.appendChild(svg("text", { x: sx(v), y: H - m.bottom + 16, "text-anchor": "middle", text: opts.xFormat(v) }));
    });
    grid.appendChild(svg("line", { x1: m.left, x2: W - m.right, y1: H - m.bottom, y2: H - m.bottom }));
    grid.appendChild(svg("text", { x: (m.left + W - m.right) / 2, y: H - 4, "text-anchor": "middle", text: opts.xLabel }));
    grid.appendChild(svg("text", {
      x: 12, y: (m.top + H - m.bottom) / 2, "text-anchor": "middle",
      transform: "rotate(-90 12 " + (m.top + H - m.bottom) / 2 + ")", text: opts.yLabel,
    }));
    root.appendChild(grid);
    series.forEach(function (s) {
      var g = svg("g", { "class": "series", "data-series": s.name });
      var sorted = s.points.slice().sort(function (a, b) { return a.x - b.x; });
      if (sorted.length > 1 && opts.lines !== false) {
        var d = sorted.map(function (p, i) { return (i ? "L" : "M") + sx(p.x).toFixed(1) + " " + sy(p.y).toFixed(1); });
        g.appendChild(svg("path", { d: d.join(" "), fill: "none", stroke: s.color, "stroke-width": 1.8 }));
      }
      sorted.forEach(function (p) {
        var dot = svg("circle", { cx: sx(p.x).toFixed(1), cy: sy(p.y).toFixed(1), r: opts.dot || 3.5, fill: s.color, "class": "point",
          "data-x": p.x, "data-y": p.y });
        dot.appendChild(svg("title", { text: p.title }));
        g.appendChild(dot);
        if (p.label) {
          g.appendChild(svg("text", { x: sx(p.x), y: sy(p.y) - 8, "text-anchor": "middle", "class": "label-strong",
            text: p.label }));
        }
      });
      root.appendChild(g);
    });
    clear(body).appendChild(root);
    if (series.length > 1) {
      var legend = el("div", { "class": "legend" });
      series.slice(0, 12).forEach(function (s) {
        legend.appendChild(el("span", {}, [el("span", { "class": "swatch", style: "background:" + s.color }), s.name]));
      });
      if (series.length > 12) legend.appendChild(el("span", { text: "+" + (series.length - 12) + " more" }));
      body.appendChild(legend);
    }
  }

  // ---- panels -------------------------------------------------------------------------

  function renderSummary(data) {
    var box = clear(document.getElementById("summary"));
    var all = data.recoveries || [];
    var recs = all.filter(function (r) { return !r.failed; });
    var failed = all.filter(function (r) { return r.failed; });
    var resumes = recs.map(function (r) { return r.time_to_resume_s; }).filter(isNum);
    var lost = recs.reduce(function (a, r) { return a + (r.steps_lost || 0); }, 0);
    var protection = null, protectionSource = null;
    if (data.protection) {
      Object.keys(data.protection).forEach(function (job) {
        var v = data.protection[job].value;
        if (isNum(v) && (protection === null || v < protection)) {
          protection = v;
          protectionSource = data.protection[job];
        }
      });
    }
    function card(label, value, sub, cls) {
      return el("div", { "class": "card" }, [
        el("div", { "class": "label", text: label }),
        el("div", { "class": "value " + (cls || ""), text: value }),
        el("div", { "class": "sub", text: sub || "" }),
      ]);
    }
    append(box, [
      card("Recoveries", String(recs.length), (data.summary.kills || 0) + " kills, " + (data.summary.node_deaths || 0) +
        " node deaths"),
      card("Failed recoveries", String(failed.length), failed.length ? "last: " + shorten(failed[failed.length - 1].error, 60) :
        "no restore raised", failed.length ? "bad" : "ok"),
    ].concat(resumeCards(recs, card)).concat([
      card("Last time to resume", fmtSeconds(resumes.length ? resumes[resumes.length - 1] : null),
        recs.length ? "job " + recs[recs.length - 1].job : ""),
      card("Steps lost", String(lost), "in all recoveries"),
      card("Save stall p50", fmtSeconds(median((data.save_stall || []).map(function (s) { return s.blocking_s; }))),
        (data.save_stall || []).length + " recorded saves"),
      card("Protection", protection === null ? "–" : String(protection), protection === null ?
        (data.live ? "nothing committed" : NO_STATUS) : protectionSource.source === "snapshot" ?
        "min over jobs, snapshot of " + fmtTime(protectionSource.time) : "min over jobs", protectionClass(protection)),
    ]).concat(intervalCards(data.intervals || {}, card)));
  }

  // the median time to resume of each job (jobs are often modes of one comparison: never pooled)
  function resumeCards(recs, card) {
    var byJob = {};
    recs.forEach(function (r) {
      if (isNum(r.time_to_resume_s)) (byJob[r.job] = byJob[r.job] || []).push(r.time_to_resume_s);
    });
    var jobs = Object.keys(byJob).sort();
    if (!jobs.length) return [card("Time to resume", "–", "no recorded kill")];
    return jobs.slice(0, MAX_JOB_CARDS).map(function (job) {
      var n = byJob[job].length;
      return card("Time to resume, " + job, fmtSeconds(median(byJob[job])),
        "median over " + n + (n === 1 ? " recovery" : " recoveries"));
    });
  }

  // the interval every="auto" chose last, per job
  function intervalCards(intervals, card) {
    return Object.keys(intervals).sort().slice(0, MAX_JOB_CARDS).map(function (job) {
      var chosen = intervals[job];
      return card("Save interval, " + job, "every " + chosen.interval, "every=\"auto\": " + chosen.reason);
    });
  }

  function protectionClass(v) {
    if (!isNum(v)) return "";
    return v >= 1 ? "ok" : v === 0 ? "warn" : "bad";
  }

  function renderLegend(phases) {
    var legend = clear(document.getElementById("phase-legend"));
    phases.forEach(function (p) {
      legend.appendChild(el("span", {}, [el("span", { "class": "swatch", style: "background:" + PHASE_COLORS[p] }), p]));
    });
    legend.appendChild(el("span", {}, [el("span", { "class": "swatch", style: "background:" + OTHER_COLOR }),
      "other (not in a measured phase)"]));
  }

  function shorten(text, n) {
    text = String(text || "");
    return text.length > n ? text.slice(0, n - 1) + "…" : text;
  }

  // the x scale of a horizontal bar chart of seconds W wide: a label column of labelW, then the
  // bars from 0 to max (maxTotal rounded up to a tick), then totalW for each bar's total
  function secondsScale(maxTotal, W, labelW, totalW) {
    var xt = ticks(0, maxTotal, Math.max(2, Math.floor((W - labelW - totalW) / 90)));
    var max = Math.max(maxTotal, xt.values[xt.values.length - 1]);
    return { ticks: xt, max: max, x: function (v) { return labelW + (v / max) * (W - labelW - totalW); } };
  }

  // that scale's axis: a grid line from top down to the tick labels at each tick, for a chart H high
  function secondsAxis(scale, top, H) {
    var axis = svg("g", { "class": "axis" });
    scale.ticks.values.forEach(function (v) {
      axis.appendChild(svg("line", { "class": "gridline", x1: scale.x(v), x2: scale.x(v), y1: top, y2: H - 26 }));
      axis.appendChild(svg("text", { x: scale.x(v), y: H - 12, "text-anchor": "middle",
        text: fmtTickSeconds(v, scale.ticks.step) }));
    });
    return axis;
  }

  function renderRecoveries(data) {
    var body = document.querySelector("#panel-recoveries .body");
    var recs = data.recoveries || [];
    var phases = data.phases || Object.keys(PHASE_COLORS);
    renderLegend(phases);
    if (!recs.length) return noData(body, "no data (no recovery recorded yet)");
    var W = width(body, 900), rowH = 40, labelW = 260, totalW = 90, top = 6;
    var H = top + recs.length * rowH + 30;
    var maxTotal = Math.max.apply(null, recs.map(function (r) {
      return (r.phases_total_s || 0) + (isNum(r.other_s) ? r.other_s : 0);
    })) || 1;
    var scale = secondsScale(maxTotal, W, labelW, totalW), sx = scale.x;
    var root = svg("svg", { width: W, height: H, viewBox: "0 0 " + W + " " + H, id: "recovery-bars" });
    root.appendChild(secondsAxis(scale, top, H));
    recs.forEach(function (r, i) {
      var y = top + i * rowH;
      var g = svg("g", {
        "class": "recovery" + (r.failed ? " failed" : ""), "data-index": r.index, "data-job": r.job,
        "data-attempt": r.attempt, "data-kill-time": r.kill_time, "data-time-to-resume": r.time_to_resume_s,
        "data-steps-lost": r.steps_lost, "data-killed-nodes": (r.killed_nodes || []).join(","),
        "data-failed": r.failed ? "true" : "false", "data-error": r.error,
      });
      if (r.failed) {
        g.appendChild(svg("rect", { "class": "failed-row", x: -4, y: y + 1, width: W + 4, height: rowH - 4 }));
      }
      var label = "#" + (i + 1) + "  " + r.job + "  " + (r.kill_time !== null ? fmtTime(r.kill_time) : "no kill recorded");
      g.appendChild(svg("text", { x: 0, y: y + 17, "class": "label-strong", text: label }));
      var second = (r.killed_nodes || []).length + " node(s) killed · " + (r.failed ? "restore FAILED" : "step " + r.step +
        " · " + r.steps_lost + " step(s) lost");
      g.appendChild(svg("text", { x: 0, y: y + 31, "class": r.failed ? "failed-text" : null, text: second }));
      var x = 0;
      phases.forEach(function (p) {
        var v = r.phases_s[p];
        if (!isNum(v)) return;
        var rect = svg("rect", {
          "class": "phase", "data-phase": p, "data-seconds": v, x: sx(x), y: y + 4,
          width: Math.max(0, sx(x + v) - sx(x)), height: rowH - 10, fill: PHASE_COLORS[p] || "#999",
        });
        rect.appendChild(svg("title", { text: p + ": " + fmtSeconds(v) }));
        g.appendChild(rect);
        var inside = p + " " + fmtSeconds(v);
        if (sx(x + v) - sx(x) > inside.length * 6.2 + 8) {
          g.appendChild(svg("text", { x: (sx(x) + sx(x + v)) / 2, y: y + rowH / 2 + 3, "text-anchor": "middle",
            "class": "in-bar", text: inside }));
        }
        x += v;
      });
      if (isNum(r.other_s) && r.other_s > 0.0005) {
        var gap = svg("rect", {
          "class": "phase other", "data-phase": "other", "data-seconds": r.other_s, x: sx(x), y: y + 4,
          width: Math.max(0, sx(x + r.other_s) - sx(x)), height: rowH - 10, fill: OTHER_COLOR,
        });
        gap.appendChild(svg("title", { text: "not in a measured phase: " + fmtSeconds(r.other_s) }));
        g.appendChild(gap);
        x += r.other_s;
      }
      if (r.failed) {
        var mark = svg("text", { x: sx(x) + 6, y: y + rowH / 2 + 3, "class": "failed-text failed-mark",
          text: "✕ FAILED: " + shorten(r.error, Math.max(20, Math.floor((W - sx(x) - 24) / 7.2) - 10)) });
        mark.appendChild(svg("title", { text: Object.keys(r.errors || {}).map(function (rank) {
          return "rank " + rank + ": " + r.errors[rank];
        }).join("\n") }));
        g.appendChild(mark);
      } else {
        var total = isNum(r.time_to_resume_s) ? r.time_to_resume_s : r.phases_total_s;
        g.appendChild(svg("text", { x: sx(x) + 6, y: y + rowH / 2 + 3, "class": "bar-total", text: fmtSeconds(total) }));
      }
      root.appendChild(g);
    });
    clear(body).appendChild(root);
    // the numbers, as a table
    var head = el("tr", {}, [el("th", { text: "#" }), el("th", { "class": "left", text: "job" }),
      el("th", { "class": "left", text: "outcome" }), el("th", { "class": "left", text: "killed at" }),
      el("th", { "class": "left", text: "killed nodes" })]
      .concat(phases.map(function (p) { return el("th", { text: p }); }))
      .concat([el("th", { text: "time to resume" }), el("th", { text: "steps lost" }), el("th", { text: "moved" }),
        el("th", { "class": "left", text: "sources" })]));
    var rows = recs.map(function (r, i) {
      var sources = {};
      Object.keys(r.sources || {}).forEach(function (rank) {
        var s = (r.errors || {})[rank] ? "failed" : r.sources[rank];
        sources[s] = (sources[s] || 0) + 1;
      });
      return el("tr", { "class": "recovery-row" + (r.failed ? " failed" : ""), "data-index": r.index }, [
        el("td", { text: String(i + 1) }),
        el("td", { "class": "left", text: r.job }),
        el("td", { "class": "left outcome" + (r.failed ? " bad" : " ok"), title: r.error || "",
          text: r.failed ? "failed: " + shorten(r.error, 70) : "resumed" }),
        el("td", { "class": "left", text: r.kill_time !== null ? fmtTime(r.kill_time) : "–" }),
        el("td", { "class": "left", text: (r.killed_nodes || []).map(nodeName).join(", ") || "–" }),
      ].concat(phases.map(function (p) {
        return el("td", { "data-phase": p, "data-seconds": isNum(r.phases_s[p]) ? r.phases_s[p] : null,
          text: fmtSeconds(r.phases_s[p]) });
      })).concat([
        el("td", { text: fmtSeconds(r.time_to_resume_s) }),
        el("td", { text: isNum(r.steps_lost) ? String(r.steps_lost) : "–" }),
        el("td", { text: fmtBytes(r.bytes_moved) }),
        el("td", { "class": "left", text: Object.keys(sources).map(function (s) { return sources[s] + "× " + s; }).join(", ") }),
      ]));
    });
    body.appendChild(el("div", { "class": "table-wrap" }, [el("table", {}, [el("thead", {}, [head]),
      el("tbody", {}, rows)])]));
  }

  // the restore alone (locate → load), on its own axis: next to a restart of seconds it is a sliver
  function renderRestoreZoom(data) {
    var body = document.querySelector("#panel-restore .body");
    var phases = data.restore_phases || ["locate", "fetch", "decode", "load"];
    var legend = clear(document.getElementById("restore-legend"));
    phases.forEach(function (p) {
      legend.appendChild(el("span", {}, [el("span", { "class": "swatch", style: "background:" + PHASE_COLORS[p] }), p]));
    });
    var recs = data.recoveries || [];
    if (!recs.length) return noData(body, "no data (no recovery recorded yet)");
    var W = width(body, 900), rowH = 30, labelW = 260, totalW = 90, top = 6;
    var H = top + recs.length * rowH + 30;
    var maxTotal = Math.max.apply(null, recs.map(function (r) { return r.restore_total_s || 0; })) || 0.001;
    var scale = secondsScale(maxTotal, W, labelW, totalW), sx = scale.x;
    var root = svg("svg", { width: W, height: H, viewBox: "0 0 " + W + " " + H, id: "restore-bars",
      "data-x-max": scale.max });
    root.appendChild(secondsAxis(scale, top, H));
    recs.forEach(function (r, i) {
      var y = top + i * rowH;
      var g = svg("g", { "class": "restore" + (r.failed ? " failed" : ""), "data-index": r.index,
        "data-failed": r.failed ? "true" : "false" });
      g.appendChild(svg("text", { x: 0, y: y + 18, "class": "label-strong", text: "#" + (i + 1) + "  " + r.job + "  " +
        (r.kill_time !== null ? fmtTime(r.kill_time) : "no kill recorded") }));
      var x = 0;
      phases.forEach(function (p) {
        var v = r.phases_s[p];
        if (!isNum(v)) return;
        var w = Math.max(0, sx(x + v) - sx(x));
        var rect = svg("rect", { "class": "phase", "data-phase": p, "data-seconds": v, "data-width": w.toFixed(1),
          x: sx(x), y: y + 3, width: w, height: rowH - 8, fill: PHASE_COLORS[p] || "#999" });
        rect.appendChild(svg("title", { text: p + ": " + fmtSeconds(v) }));
        g.appendChild(rect);
        var inside = p + " " + fmtSeconds(v);
        if (w > inside.length * 6.2 + 8) {
          g.appendChild(svg("text", { x: sx(x) + w / 2, y: y + rowH / 2 + 3, "text-anchor": "middle", "class": "in-bar",
            text: inside }));
        }
        x += v;
      });
      g.appendChild(svg("text", { x: sx(x) + 6, y: y + rowH / 2 + 3, "class": r.failed ? "failed-text" : "bar-total",
        text: r.failed ? (x > 0 ? fmtSeconds(x) + " · " : "") + "✕ restore failed" : fmtSeconds(x) }));
      root.appendChild(g);
    });
    clear(body).appendChild(root);
  }

  function renderResume(data) {
    var body = document.querySelector("#panel-resume .body");
    var points = data.time_to_resume || [];
    if (!points.length) return noData(body, "no data (no recovery after a recorded kill yet)");
    var jobs = {};
    points.forEach(function (p) { (jobs[p.job] = jobs[p.job] || []).push(p); });
    var series = Object.keys(jobs).sort().map(function (job, i) {
      return { name: job, color: PALETTE[i % PALETTE.length], points: jobs[job].map(function (p) {
        return { x: p.time, y: p.value, label: fmtSeconds(p.value),
          title: job + " · attempt " + p.attempt + " · killed " + fmtDateTime(p.time) + " · " + fmtSeconds(p.value) };
      }) };
    });
    lineChart(body, series, { xTime: true, xFormat: fmtTime, yFormat: fmtTickSeconds, xLabel: "kill time",
      yLabel: "time to resume", dot: 5, xPad: 0.06 });
  }

  function renderStall(data) {
    var body = document.querySelector("#panel-stall .body");
    var saves = data.save_stall || [];
    if (!saves.length) return noData(body, "no data (no save recorded yet)");
    var groups = {};
    saves.forEach(function (s) {
      if (!isNum(s.step) || !isNum(s.blocking_s)) return;
      var key = s.job + " rank " + s.rank;
      (groups[key] = groups[key] || []).push(s);
    });
    var names = Object.keys(groups).sort();
    if (!names.length) return noData(body, "no data (no save recorded yet)");
    var series = names.map(function (name, i) {
      return { name: name, color: PALETTE[i % PALETTE.length], points: groups[name].map(function (s) {
        return { x: s.step, y: s.blocking_s * 1000,
          title: name + " · step " + s.step + " · attempt " + s.attempt + " · blocked " + fmtSeconds(s.blocking_s) };
      }) };
    });
    lineChart(body, series, { xTime: false, xInteger: true, xFormat: function (v) { return String(Math.round(v)); },
      yFormat: function (v) { return v === 0 ? "0" : (v >= 10 ? v.toFixed(0) : v.toFixed(1)) + " ms"; },
      xLabel: "step", yLabel: "save() blocked", dot: 2.5 });
  }

  function sourceLine(body, part) {
    var note = sourceNote(part);
    if (note) body.appendChild(el("div", { "class": "source-note", text: note }));
  }

  function renderMemory(data) {
    var body = document.querySelector("#panel-memory .body");
    if (!data.memory) return noData(body, NO_STATUS);
    if (!data.memory.length) return noData(body, "no data (no store is running)");
    clear(body);
    sourceLine(body, data.memory_source);
    byHost(data.memory, false).forEach(function (n) {
      var share = isNum(n.used_bytes) && n.budget_bytes ? n.used_bytes / n.budget_bytes : 0;
      var fillCls = "fill" + (share >= 0.95 ? " full" : share >= 0.8 ? " high" : "");
      var ranks = nodeRanks(n.node_id);
      var info = (data.nodes || {})[n.node_id] || {};
      body.appendChild(el("div", { "class": "memory-row" + (n.alive ? "" : " dead"), "data-node": n.node_id,
        "data-host": info.host || null, "data-ranks": ranks || null }, [
        el("div", { "class": "node", title: nodeTitle(n.node_id) }, [
          el("div", { "class": "host", text: (info.host || shortNode(n.node_id)) + (n.alive ? "" : " (dead)") }),
          el("div", { "class": "ids", text: (info.host ? shortNode(n.node_id) : "") + (ranks ? (info.host ? " · " : "") +
            ranks : "") }),
        ]),
        el("div", { "class": "track", title: n.error || "" }, [
          el("div", { "class": fillCls, style: "width:" + Math.min(100, share * 100).toFixed(2) + "%" }),
        ]),
        el("span", { "class": "numbers", text: n.error ? (isNum(n.used_bytes) ? fmtBytes(n.used_bytes) + " · " : "") +
          n.error : !isNum(n.used_bytes) && !n.alive ? "node dead" : fmtBytes(n.used_bytes) + " / " +
          fmtBytes(n.budget_bytes) + " · " + (n.shards || 0) + " shards" }),
      ]));
    });
  }

  function renderProtection(data) {
    var body = document.querySelector("#panel-protection .body");
    if (!data.protection) return noData(body, NO_STATUS);
    var jobs = Object.keys(data.protection).sort();
    if (!jobs.length) return noData(body, "no data (no job has committed a step)");
    var grid = el("div", { "class": "protection-grid" });
    jobs.forEach(function (job) {
      var p = data.protection[job];
      var v = p.value;
      var text = !isNum(v) ? "nothing committed" : v < 0 ? "LOST: some rank cannot be rebuilt from memory" :
        v === 0 ? "one more node failure may lose it" : "survives " + v + " more node failure" + (v > 1 ? "s" : "");
      var kept = p.committed_steps ? " · " + p.committed_steps.length + " kept" : "";
      var lines = [
        el("div", { "class": "job", text: job }),
        el("div", { "class": "level " + protectionClass(v), text: isNum(v) ? String(v) : "–" }),
        el("div", { "class": "sub", text: text }),
        el("div", { "class": "sub", text: "latest committed step " + (p.latest_committed === null ? "–" : p.latest_committed) +
          kept }),
      ];
      if (p.source === "snapshot") {
        lines.push(el("div", { "class": "sub", text: "snapshot of " + fmtDateTime(p.time) + (isNum(p.recorded) &&
          p.recorded !== v ? " (then " + p.recorded + "; nodes lost since)" : "") }));
      }
      grid.appendChild(el("div", { "class": "protection-card", "data-job": job, "data-protection": isNum(v) ? v : null,
        "data-source": p.source || null }, lines));
    });
    clear(body).appendChild(grid);
  }

  function renderPlacement(data) {
    var body = document.querySelector("#panel-placement .body");
    if (!data.placement) return noData(body, NO_STATUS);
    var jobs = Object.keys(data.placement).sort();
    if (!jobs.length) return noData(body, "no data (no job has committed a step)");
    clear(body);
    jobs.forEach(function (job) {
      var p = data.placement[job];
      var k = p.data_shards;
      var columns = byHost(p.nodes, true);
      var gone = p.nodes.filter(function (n) { return !n.alive || n.store === false; }).length;
      var caption = el("caption", {}, [job + " — step " + p.step + " ", el("small", {
        text: "RS(" + k + "," + p.parity_shards + ") · protection " + (isNum(p.protection) ? p.protection : "–") +
          " · " + gone + " node(s) dead or without a store" + (sourceNote(p) ? " · " + sourceNote(p) : "") })]);
      var head = el("tr", {}, [el("th", { text: "rank" })].concat(columns.map(function (n) {
        var info = (data.nodes || {})[n.node_id] || {};
        var mark = !n.alive ? " ✕" : n.store === false ? " (no store)" : "";
        var ranks = nodeRanks(n.node_id, job);
        return el("th", { "class": "node-head" + (n.alive && n.store !== false ? "" : " dead"), title: nodeTitle(n.node_id),
          "data-node": n.node_id, "data-host": info.host || null }, [
          el("div", { "class": "host", text: (info.host || shortNode(n.node_id)) + mark }),
          el("div", { "class": "mono", text: info.host ? shortNode(n.node_id) : "" }),
          el("div", { "class": "runs", text: ranks ? "runs " + ranks : "" }),
        ]);
      })));
      var byKey = {};
      p.cells.forEach(function (c) { byKey[c.rank + "|" + c.node_id] = c; });
      var rows = p.ranks.map(function (rank) {
        return el("tr", {}, [el("th", { text: String(rank) })].concat(columns.map(function (n) {
          var c = byKey[rank + "|" + n.node_id];
          if (!c) return el("td", {});
          var chips = c.indices.map(function (i) {
            return el("span", { "class": "chip " + (i < k ? "data" : "parity"), text: (i < k ? "d" : "p") + i });
          });
          if (c.local) chips.push(el("span", { "class": "chip local", text: "L" }));
          if (c.lost) chips.push(el("span", { "class": "lost-tag", text: "lost" }));
          return el("td", { "class": c.lost ? "lost" : "", "data-rank": rank, "data-node": n.node_id,
            "data-indices": c.indices.join(","), "data-lost": c.lost ? "true" : "false" }, chips);
        })));
      });
      if (p.unlisted_ranks) {
        rows.push(el("tr", {}, [el("td", { colspan: String(columns.length + 1), "class": "note",
          text: p.unlisted_ranks + " ranks: the placement of a job this large is not listed rank by rank" })]));
      }
      body.appendChild(el("div", { "class": "table-wrap placement" }, [el("table", { "data-job": job }, [caption,
        el("thead", {}, [head]), el("tbody", {}, rows)])]));
    });
  }

  function renderHeader(data) {
    var source = [];
    if (data.live) source.push("live" + (data.namespace ? " · namespace " + data.namespace : ""));
    if (data.sources && data.sources.length) source.push("events: " + data.sources.join(", "));
    if (window.RAY_CKPT_DATA) source.push("exported report");
    document.getElementById("source").textContent = source.join(" · ") || "no source";
    document.getElementById("updated").textContent = "data of " + fmtDateTime(data.generated_at);
    document.getElementById("footer").textContent = data.summary.events + " events (" + data.summary.saves +
      " saves, " + data.summary.restores + " restores, " + data.summary.kills + " kills, " + data.summary.node_deaths +
      " node deaths, " + (data.summary.status_snapshots || 0) + " status snapshots) · jobs: " + (data.summary.jobs.join(", ") || "–") +
      (data.window && data.window.dropped_events ? " · " + data.window.dropped_events + " older events dropped (since " +
        fmtDateTime(data.window.oldest_time) + " shown; RAY_CKPT_DASHBOARD_EVENTS_MAX_BYTES, _MAX_AGE_S)" : "") +
      (data.error ? " · live error: " + data.error : "");
  }

  function render() {
    var data = state.data;
    if (!data) return;
    [renderHeader, renderSummary, renderRecoveries, renderRestoreZoom, renderResume, renderStall, renderMemory, renderProtection,
      renderPlacement].forEach(function (panel) {
      try {
        panel(data);
      } catch (error) {
        window.rayCkptReportError("render " + panel.name + ": " + (error && error.stack ? error.stack : error));
      }
    });
    document.body.setAttribute("data-rendered", String((+document.body.getAttribute("data-rendered") || 0) + 1));
  }

  function setConnection(ok, detail) {
    var node = document.getElementById("connection");
    node.className = ok ? "" : "down";
    node.textContent = ok ? "" : "dashboard server unreachable" + (detail ? " (" + detail + ")" : "");
  }

  function poll() {
    fetch("api/data", { cache: "no-store" })
      .then(function (response) {
        if (!response.ok) throw new Error("HTTP " + response.status);
        return response.json();
      })
      .then(function (data) {
        state.data = data;
        setConnection(true);
        render();
      })
      .catch(function (error) { setConnection(false, error && error.message); })
      .then(function () { window.setTimeout(poll, POLL_MS); });
  }

  var resizeTimer = null;
  window.addEventListener("resize", function () {
    window.clearTimeout(resizeTimer);
    resizeTimer = window.setTimeout(render, 150);
  });

  if (window.RAY_CKPT_DATA) {
    state.data = window.RAY_CKPT_DATA;
    render();
  } else {
    poll();
  }
})();
