// ray_ckpt dashboard: renders /api/data (or the data inlined by `--export`) with plain SVG/DOM.
"use strict";

(function () {
  var SVG = "http://www.w3.org/2000/svg";
  var POLL_MS = 2000;
  var LIVE_ONLY = "no data (live cluster needed)";
  var PHASE_COLORS = {
    detect: "#e15759",
    restart: "#f28e2b",
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
    if (x1 === x0) { x0 -= opts.xTime ? 30 : 1; x1 += opts.xTime ? 30 : 1; }
    if (opts.xPad) { var pad = (x1 - x0) * opts.xPad; x0 -= pad; x1 += pad; }
    var yt = ticks(0, Math.max.apply(null, ys) * 1.1 || 1, 5);
    var y1 = yt.values[yt.values.length - 1];
    var xt = ticks(x0, x1, Math.max(2, Math.floor((W - m.left - m.right) / 110)), opts.xInteger ? 1 : 0);
    function sx(v) { return m.left + ((v - x0) / (x1 - x0)) * (W - m.left - m.right); }
    function sy(v) { return H - m.bottom - (v / y1) * (H - m.top - m.bottom); }
    var root = svg("svg", { width: W, height: H, viewBox: "0 0 " + W + " " + H, role: "img" });
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
        var dot = svg("circle", { cx: sx(p.x), cy: sy(p.y), r: opts.dot || 3.5, fill: s.color, "class": "point",
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
    var recs = data.recoveries || [];
    var resumes = recs.map(function (r) { return r.time_to_resume_s; }).filter(isNum);
    var lost = recs.reduce(function (a, r) { return a + (r.steps_lost || 0); }, 0);
    var protection = null;
    if (data.protection) {
      Object.keys(data.protection).forEach(function (job) {
        var v = data.protection[job].value;
        if (isNum(v)) protection = protection === null ? v : Math.min(protection, v);
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
      card("Median time to resume", fmtSeconds(median(resumes)), resumes.length ? "over " + resumes.length +
        " recoveries" : "no recorded kill"),
      card("Last time to resume", fmtSeconds(resumes.length ? resumes[resumes.length - 1] : null),
        recs.length ? "job " + recs[recs.length - 1].job : ""),
      card("Steps lost", String(lost), "in all recoveries"),
      card("Save stall p50", fmtSeconds(median((data.save_stall || []).map(function (s) { return s.blocking_s; }))),
        (data.save_stall || []).length + " recorded saves"),
      card("Protection", protection === null ? "–" : String(protection), data.live ? "min over jobs" : LIVE_ONLY,
        protectionClass(protection)),
    ]);
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

  function renderRecoveries(data) {
    var body = document.querySelector("#panel-recoveries .body");
    var recs = data.recoveries || [];
    var phases = data.phases || Object.keys(PHASE_COLORS);
    renderLegend(phases);
    if (!recs.length) return noData(body, "no data (no recovery recorded yet)");
    var W = width(body, 900), rowH = 40, labelW = 240, totalW = 90, top = 6;
    var H = top + recs.length * rowH + 30;
    var maxTotal = Math.max.apply(null, recs.map(function (r) {
      return (r.phases_total_s || 0) + (isNum(r.other_s) ? r.other_s : 0);
    })) || 1;
    var xt = ticks(0, maxTotal, Math.max(2, Math.floor((W - labelW - totalW) / 90)));
    var xMax = Math.max(maxTotal, xt.values[xt.values.length - 1]);
    function sx(v) { return labelW + (v / xMax) * (W - labelW - totalW); }
    var root = svg("svg", { width: W, height: H, viewBox: "0 0 " + W + " " + H, id: "recovery-bars" });
    var axis = svg("g", { "class": "axis" });
    xt.values.forEach(function (v) {
      axis.appendChild(svg("line", { "class": "gridline", x1: sx(v), x2: sx(v), y1: top, y2: H - 26 }));
      axis.appendChild(svg("text", { x: sx(v), y: H - 12, "text-anchor": "middle", text: fmtTickSeconds(v, xt.step) }));
    });
    root.appendChild(axis);
    recs.forEach(function (r, i) {
      var y = top + i * rowH;
      var g = svg("g", {
        "class": "recovery", "data-index": r.index, "data-job": r.job, "data-attempt": r.attempt,
        "data-kill-time": r.kill_time, "data-time-to-resume": r.time_to_resume_s, "data-steps-lost": r.steps_lost,
        "data-killed-nodes": (r.killed_nodes || []).join(","),
      });
      var label = "#" + (i + 1) + "  " + r.job + "  " + (r.kill_time !== null ? fmtTime(r.kill_time) : "no kill recorded");
      g.appendChild(svg("text", { x: 0, y: y + 17, "class": "label-strong", text: label }));
      g.appendChild(svg("text", { x: 0, y: y + 31, text: (r.killed_nodes || []).length + " node(s) killed · step " + r.step +
        " · " + r.steps_lost + " step(s) lost" }));
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
      var total = isNum(r.time_to_resume_s) ? r.time_to_resume_s : r.phases_total_s;
      g.appendChild(svg("text", { x: sx(x) + 6, y: y + rowH / 2 + 3, "class": "bar-total", text: fmtSeconds(total) }));
      root.appendChild(g);
    });
    clear(body).appendChild(root);
    // the numbers, as a table
    var head = el("tr", {}, [el("th", { text: "#" }), el("th", { "class": "left", text: "job" }),
      el("th", { "class": "left", text: "killed at" }), el("th", { "class": "left", text: "killed nodes" })]
      .concat(phases.map(function (p) { return el("th", { text: p }); }))
      .concat([el("th", { text: "time to resume" }), el("th", { text: "steps lost" }), el("th", { text: "moved" }),
        el("th", { "class": "left", text: "sources" })]));
    var rows = recs.map(function (r, i) {
      var sources = {};
      Object.keys(r.sources || {}).forEach(function (rank) { var s = r.sources[rank]; sources[s] = (sources[s] || 0) + 1; });
      return el("tr", { "class": "recovery-row", "data-index": r.index }, [
        el("td", { text: String(i + 1) }),
        el("td", { "class": "left", text: r.job }),
        el("td", { "class": "left", text: r.kill_time !== null ? fmtTime(r.kill_time) : "–" }),
        el("td", { "class": "left mono", text: (r.killed_nodes || []).map(shortNode).join(", ") || "–" }),
      ].concat(phases.map(function (p) {
        return el("td", { "data-phase": p, "data-seconds": isNum(r.phases_s[p]) ? r.phases_s[p] : null,
          text: fmtSeconds(r.phases_s[p]) });
      })).concat([
        el("td", { text: fmtSeconds(r.time_to_resume_s) }),
        el("td", { text: String(r.steps_lost) }),
        el("td", { text: fmtBytes(r.bytes_moved) }),
        el("td", { "class": "left", text: Object.keys(sources).map(function (s) { return sources[s] + "× " + s; }).join(", ") }),
      ]));
    });
    body.appendChild(el("div", { "class": "table-wrap" }, [el("table", {}, [el("thead", {}, [head]),
      el("tbody", {}, rows)])]));
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

  function renderMemory(data) {
    var body = document.querySelector("#panel-memory .body");
    if (!data.live || !data.memory) return noData(body, LIVE_ONLY);
    if (!data.memory.length) return noData(body, "no data (no store is running)");
    clear(body);
    data.memory.forEach(function (n) {
      var share = isNum(n.used_bytes) && n.budget_bytes ? n.used_bytes / n.budget_bytes : 0;
      var fillCls = "fill" + (share >= 0.95 ? " full" : share >= 0.8 ? " high" : "");
      body.appendChild(el("div", { "class": "memory-row" + (n.alive ? "" : " dead"), "data-node": n.node_id }, [
        el("span", { "class": "node", title: n.node_id, text: shortNode(n.node_id) + (n.alive ? "" : " (dead)") }),
        el("div", { "class": "track", title: n.error || "" }, [
          el("div", { "class": fillCls, style: "width:" + Math.min(100, share * 100).toFixed(2) + "%" }),
        ]),
        el("span", { "class": "numbers", text: n.error ? "unreachable" : fmtBytes(n.used_bytes) + " / " +
          fmtBytes(n.budget_bytes) + " · " + (n.shards || 0) + " shards" }),
      ]));
    });
  }

  function renderProtection(data) {
    var body = document.querySelector("#panel-protection .body");
    if (!data.live || !data.protection) return noData(body, LIVE_ONLY);
    var jobs = Object.keys(data.protection).sort();
    if (!jobs.length) return noData(body, "no data (no job has committed a step)");
    var grid = el("div", { "class": "protection-grid" });
    jobs.forEach(function (job) {
      var p = data.protection[job];
      var v = p.value;
      var text = !isNum(v) ? "nothing committed" : v < 0 ? "LOST: some rank cannot be rebuilt from memory" :
        v === 0 ? "one more node failure may lose it" : "survives " + v + " more node failure" + (v > 1 ? "s" : "");
      grid.appendChild(el("div", { "class": "protection-card", "data-job": job, "data-protection": isNum(v) ? v : null }, [
        el("div", { "class": "job", text: job }),
        el("div", { "class": "level " + protectionClass(v), text: isNum(v) ? String(v) : "–" }),
        el("div", { "class": "sub", text: text }),
        el("div", { "class": "sub", text: "latest committed step " + (p.latest_committed === null ? "–" : p.latest_committed) +
          " · " + (p.committed_steps || []).length + " kept" }),
      ]));
    });
    clear(body).appendChild(grid);
  }

  function renderPlacement(data) {
    var body = document.querySelector("#panel-placement .body");
    if (!data.live || !data.placement) return noData(body, LIVE_ONLY);
    var jobs = Object.keys(data.placement).sort();
    if (!jobs.length) return noData(body, "no data (no job has committed a step)");
    clear(body);
    jobs.forEach(function (job) {
      var p = data.placement[job];
      var k = p.data_shards;
      var caption = el("caption", {}, [job + " — step " + p.step + " ", el("small", {
        text: "RS(" + k + "," + p.parity_shards + ") · protection " + (isNum(p.protection) ? p.protection : "–") +
          " · " + p.nodes.filter(function (n) { return !n.alive; }).length + " dead node(s)" })]);
      var head = el("tr", {}, [el("th", { text: "rank" })].concat(p.nodes.map(function (n) {
        return el("th", { "class": "mono" + (n.alive ? "" : " dead"), title: n.node_id,
          text: shortNode(n.node_id) + (n.alive ? "" : " ✕") });
      })));
      var byKey = {};
      p.cells.forEach(function (c) { byKey[c.rank + "|" + c.node_id] = c; });
      var rows = p.ranks.map(function (rank) {
        return el("tr", {}, [el("th", { text: String(rank) })].concat(p.nodes.map(function (n) {
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
      " node deaths) · jobs: " + (data.summary.jobs.join(", ") || "–") + (data.error ? " · live error: " + data.error : "");
  }

  function render() {
    var data = state.data;
    if (!data) return;
    [renderHeader, renderSummary, renderRecoveries, renderResume, renderStall, renderMemory, renderProtection,
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
