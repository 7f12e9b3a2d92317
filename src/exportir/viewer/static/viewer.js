// exportir graph viewer. Reads the page's JSON (script#exportir-data), lays graphs out top to
// bottom with dagre, draws them as SVG. Every text from the data goes in through textContent or
// setAttribute, never as markup.
(function () {
  "use strict";
  const SVG = "http://www.w3.org/2000/svg";
  const DATA = JSON.parse(document.getElementById("exportir-data").textContent);
  const GRAPHS = new Map(DATA.graphs.map((g) => [g.id, g]));
  const VISIBLE_LIMIT = 120;   // beyond this many boxes, module groups start collapsed
  const CHAR_W = 6.7, LINE_H = 14, MAX_CHARS = 44;

  const el = (id) => document.getElementById(id);
  const canvas = el("canvas"), panel = el("details"), memoryBox = el("memory");
  const state = { graph: null, collapsed: new Set(), selected: null, view: null, layoutMs: 0,
                  visible: 0, clusters: null, memorySelected: null };

  function h(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  }
  function s(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = text;
    return node;
  }
  const clip = (t) => (t.length > MAX_CHARS ? t.slice(0, MAX_CHARS - 1) + "\u2026" : t);
  const detail = (n, key) => { const d = n.details.find((r) => r[0] === key); return d ? d[1] : ""; };

  // ---------------------------------------------------------------- module groups (clusters)
  function buildClusters(graph) {
    const clusters = new Map();  // id -> {id, path, type, parent, depth, members: count}
    const of = [];               // node index -> chain of cluster ids, outermost first
    for (const n of graph.nodes) {
      const chain = [];
      let parent = null;
      n.module.forEach(([path, type], depth) => {
        const id = (parent ? parent + "\u0000" : "") + path;
        if (!clusters.has(id)) clusters.set(id, { id, path, type, parent, depth, members: 0 });
        clusters.get(id).members += 1;
        chain.push(id);
        parent = id;
      });
      of.push(chain);
    }
    return { clusters, of };
  }

  function ownerOf(chain) {  // the outermost collapsed group holding a node, if any
    for (const c of chain) if (state.collapsed.has(c)) return c;
    return null;
  }

  function visibleCount(graph, clusters, collapsed) {
    const seen = new Set();
    let count = 0;
    clusters.of.forEach((chain) => {
      const owner = chain.find((c) => collapsed.has(c));
      if (owner === undefined) count += 1;
      else if (!seen.has(owner)) { seen.add(owner); count += 1; }
    });
    return count;
  }

  // Small graphs open whole; larger ones open module groups down to the deepest level at
  // which the picture stays under VISIBLE_LIMIT boxes (every group deeper is folded).
  function defaultCollapsed(graph, clusters) {
    if (graph.nodes.length <= VISIBLE_LIMIT) return new Set();
    const all = [...clusters.clusters.values()];
    const deepest = Math.max(0, ...all.map((c) => c.depth + 1));
    let best = new Set(all.filter((c) => c.depth === 0).map((c) => c.id));
    for (let depth = 1; depth <= deepest; depth++) {
      const folded = new Set(all.filter((c) => c.depth === depth).map((c) => c.id));
      if (visibleCount(graph, clusters, folded) > VISIBLE_LIMIT) break;
      best = folded;
    }
    return best;
  }

  // ---------------------------------------------------------------- layout
  function boxSize(lines) {
    const chars = Math.max(...lines.map((t) => t.length), 4);
    return { width: Math.round(chars * CHAR_W + 18), height: lines.length * LINE_H + 12 };
  }

  function nodeLines(n) {
    const lines = [clip(n.label)];
    const value = detail(n, "value");
    if (value) lines.push(clip(value));
    return lines;
  }

  function layout() {
    const graph = state.graph, clusters = state.clusters;
    const g = new dagre.graphlib.Graph({ compound: true, multigraph: false });
    g.setGraph({ rankdir: "TB", nodesep: 18, ranksep: 30, edgesep: 8, marginx: 20, marginy: 20 });
    g.setDefaultEdgeLabel(() => ({}));
    const boxOf = new Map();  // node index -> dagre id
    const boxes = new Map();  // dagre id -> description
    graph.nodes.forEach((n, i) => {
      const chain = clusters.of[i];
      const owner = ownerOf(chain);
      if (owner !== null) {
        const id = "c:" + owner;
        boxOf.set(i, id);
        if (!boxes.has(id)) {
          const c = clusters.clusters.get(owner);
          const lines = [clip(c.path), clip(c.type + " \u00b7 " + c.members + " nodes \u25b8")];
          boxes.set(id, { kind: "cluster", cluster: c, lines, ...boxSize(lines) });
          g.setNode(id, boxes.get(id));
          if (c.parent) g.setParent(id, "g:" + c.parent);
        }
        return;
      }
      const id = "n:" + i;
      boxOf.set(i, id);
      const lines = nodeLines(n);
      boxes.set(id, { kind: n.kind, node: n, lines, ...boxSize(lines) });
      g.setNode(id, boxes.get(id));
      if (chain.length) g.setParent(id, "g:" + chain[chain.length - 1]);
    });
    for (const c of clusters.clusters.values()) {
      if (ownerOf(chainOfCluster(c)) !== null) continue;
      g.setNode("g:" + c.id, { label: c.path, group: c });
      if (c.parent) g.setParent("g:" + c.id, "g:" + c.parent);
    }
    graph.nodes.forEach((n, i) => {
      for (const j of n.inputs) {
        const u = boxOf.get(j), v = boxOf.get(i);
        if (u && v && u !== v) g.setEdge(u, v);
      }
    });
    const t0 = performance.now();
    dagre.layout(g);
    state.layoutMs = Math.round(performance.now() - t0);
    state.visible = boxes.size;
    return { g, boxes };
  }

  function chainOfCluster(c) {
    const chain = [];
    for (let x = c; x; x = x.parent ? state.clusters.clusters.get(x.parent) : null) chain.unshift(x.id);
    return chain;
  }

  // ---------------------------------------------------------------- drawing
  function draw() {
    const { g, boxes } = layout();
    canvas.textContent = "";
    const root = s("g", { id: "viewport" });
    const groups = s("g"), edges = s("g"), nodes = s("g");
    root.append(groups, edges, nodes);
    canvas.append(defs(), root);
    state.groups = new Map();
    for (const id of g.nodes()) {
      if (!id.startsWith("g:")) continue;
      const d = g.node(id), c = d.group;
      state.groups.set(c.id, { x: d.x, y: d.y, width: d.width, height: d.height });
      const box = s("g", { class: "group depth" + (c.depth % 3), "data-cluster": c.path });
      box.append(s("rect", { x: d.x - d.width / 2, y: d.y - d.height / 2, width: d.width, height: d.height }));
      const label = s("text", { x: d.x - d.width / 2 + 6, y: d.y - d.height / 2 + 11 },
                      "\u25be " + c.path + " (" + c.type + ")");
      label.addEventListener("click", (e) => { e.stopPropagation(); collapse(c.id); });
      box.append(label);
      groups.append(box);
    }
    for (const e of g.edges()) {
      const pts = g.edge(e).points;
      const d = pts.map((p, k) => (k ? "L" : "M") + p.x.toFixed(1) + " " + p.y.toFixed(1)).join(" ");
      edges.append(s("path", { class: "edge", d, "marker-end": "url(#arrow)" }));
    }
    for (const [id, b] of boxes) {
      const d = g.node(id);
      const node = s("g", { class: "node " + b.kind, transform: `translate(${d.x - d.width / 2},${d.y - d.height / 2})` });
      node.append(s("rect", { width: d.width, height: d.height }));
      b.lines.forEach((t, k) => node.append(s("text", { x: 9, y: 16 + k * LINE_H, class: k ? "sub" : "" }, t)));
      const tip = b.node ? [b.node.name, detail(b.node, "target"), detail(b.node, "source")] : [b.cluster.path, b.cluster.type];
      node.append(s("title", {}, tip.filter(Boolean).join("\n")));
      if (b.kind === "cluster") {
        node.setAttribute("data-cluster", b.cluster.path);
        node.addEventListener("click", (e) => { e.stopPropagation(); expand(b.cluster.id); });
      } else {
        node.setAttribute("data-name", b.node.name);
        node.addEventListener("click", (e) => { e.stopPropagation(); select(b.node.id); });
      }
      b.element = node;
      b.x = d.x;
      b.y = d.y;
      nodes.append(node);
    }
    state.boxes = boxes;
    const info = g.graph();
    state.size = { width: Math.max(info.width || 0, 100), height: Math.max(info.height || 0, 100) };
    if (!state.view) fit();
    applyView();
    highlight();
    publish();
  }

  function defs() {
    const d = s("defs");
    const m = s("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" });
    m.append(s("path", { d: "M0 0 L10 5 L0 10 z", fill: "#8d95a5" }));
    d.append(m);
    return d;
  }

  // ---------------------------------------------------------------- pan and zoom
  // The whole picture when it stays legible (or when asked), else its top at a readable scale,
  // centred on the first box of the top rank.
  function fit(whole) {
    const r = canvas.getBoundingClientRect();
    const k = Math.min(r.width / state.size.width, r.height / state.size.height, 1.5) || 1;
    state.view = { k, x: (r.width - state.size.width * k) / 2, y: Math.max(0, (r.height - state.size.height * k) / 2) };
    if (k >= 0.35 || whole) return;
    let top = null;
    for (const b of state.boxes.values()) if (b.x !== undefined && (!top || b.y < top.y - 1)) top = b;
    const cx = top ? top.x : state.size.width / 2;
    state.view = { k: 0.6, x: r.width / 2 - cx * 0.6, y: 10 };
  }
  function applyView() {
    const v = state.view, vp = el("viewport");
    if (vp) vp.setAttribute("transform", `translate(${v.x},${v.y}) scale(${v.k})`);
  }
  canvas.addEventListener("wheel", (e) => {
    e.preventDefault();
    const r = canvas.getBoundingClientRect(), v = state.view;
    const k = Math.min(4, Math.max(0.05, v.k * Math.exp(-e.deltaY * 0.0015)));
    const px = e.clientX - r.left, py = e.clientY - r.top;
    state.view = { k, x: px - (px - v.x) * (k / v.k), y: py - (py - v.y) * (k / v.k) };
    applyView();
  }, { passive: false });
  let drag = null;
  canvas.addEventListener("mousedown", (e) => { drag = { x: e.clientX, y: e.clientY, v: { ...state.view } }; canvas.classList.add("dragging"); });
  window.addEventListener("mousemove", (e) => {
    if (!drag) return;
    state.view = { ...drag.v, x: drag.v.x + e.clientX - drag.x, y: drag.v.y + e.clientY - drag.y };
    applyView();
  });
  window.addEventListener("mouseup", () => { drag = null; canvas.classList.remove("dragging"); });

  function centerOn(id) {
    const b = state.boxes && state.boxes.get(id);
    if (!b || b.x === undefined) return;
    const r = canvas.getBoundingClientRect();
    const k = Math.min(Math.max(state.view.k, 0.6), 0.85);
    state.view = { k, x: r.width / 2 - b.x * k, y: r.height / 3 - b.y * k };
    applyView();
  }

  // ---------------------------------------------------------------- groups and selection
  function expand(clusterId) {
    state.collapsed.delete(clusterId);
    const c = state.clusters.clusters.get(clusterId);
    showCluster(c);
    draw();
    const at = state.groups.get(clusterId);  // keep the opened group in sight
    if (at) {
      const r = canvas.getBoundingClientRect(), k = state.view.k;
      const x = r.width / 2 - at.x * k, y = r.height / 3 - (at.y - at.height / 2) * k;
      const fits = at.width * k <= r.width && at.height * k <= r.height;
      state.view = fits ? { k, x, y: r.height / 2 - at.y * k } : { k, x, y };
      applyView();
    }
  }
  function collapse(clusterId) {
    state.collapsed.add(clusterId);
    draw();
  }
  function setAll(collapsed) {
    state.collapsed = new Set(collapsed ? state.clusters.clusters.keys() : []);
    state.view = null;
    draw();
  }

  function select(index) {
    const graph = state.graph, n = graph.nodes[index];
    state.selected = index;
    const owner = ownerOf(state.clusters.of[index]);
    if (owner !== null) {  // open the groups hiding it
      for (const c of state.clusters.of[index]) state.collapsed.delete(c);
      draw();
    }
    highlight();
    panel.textContent = "";
    panel.append(h("h2", {}, n.name));
    const table = h("table", { id: "detail-table" });
    table.append(row("kind", n.kind));
    for (const [k, v] of n.details) table.append(row(k, v));
    const reads = n.inputs.map((j) => graph.nodes[j].name).join(", ");
    if (reads) table.append(row("reads", reads));
    const users = graph.nodes.filter((m) => m.inputs.includes(index)).map((m) => m.name).join(", ");
    if (users) table.append(row("users", users));
    panel.append(table);
    for (const [caption, target] of n.opens) {
      const b = h("button", { "data-opens": target }, "open " + caption + " \u2192");
      b.addEventListener("click", () => show(target));
      panel.append(b);
    }
    notes();
    publish();
  }

  function showCluster(c) {
    panel.textContent = "";
    panel.append(h("h2", {}, c.path));
    const table = h("table");
    table.append(row("module", c.type), row("nodes", String(c.members)));
    panel.append(table);
    notes();
  }

  function row(k, v) {
    const tr = h("tr");
    tr.append(h("th", {}, k), h("td", {}, v));
    return tr;
  }

  function highlight() {
    if (!state.boxes) return;
    for (const b of state.boxes.values()) {
      if (!b.element) continue;
      const on = b.node && b.node.id === state.selected;
      b.element.classList.toggle("selected", Boolean(on));
    }
  }

  function notes() {
    const graph = state.graph;
    const box = h("div", { class: "notes" });
    box.append(h("div", { class: "hint" }, graph.title));
    if (graph.notes.length) {
      const table = h("table");
      for (const [k, v] of graph.notes) table.append(row(k, v));
      box.append(table);
    }
    if (graph.parent) {
      const b = h("button", { id: "back" }, "\u2190 back to " + GRAPHS.get(graph.parent).title);
      b.addEventListener("click", () => show(graph.parent));
      box.append(b);
    }
    panel.append(box);
  }

  // ---------------------------------------------------------------- memory plan
  const MEM_COLORS = ["#7aa2e3", "#e3a87a", "#8fcf94", "#d58fcf", "#e3d77a", "#7ad0d6", "#c9a3f0", "#f09a9a"];
  function drawMemory() {
    const mem = state.graph.memory;
    memoryBox.textContent = "";
    el("memory-toggle").style.display = mem ? "" : "none";
    if (!mem) { memoryBox.classList.remove("shown"); return; }
    const total = mem.arenas.reduce((a, b) => a + b, 0) || 1;
    const steps = Math.max(mem.instructions.length, 1);
    const W = Math.max(600, Math.min(steps * 8, 4000)), H = 180, left = 60, top = 8;
    memoryBox.append(h("h2", {}, "Memory plan: " + mem.buffers.length + " planned tensors, " + total +
                      " bytes in " + mem.arenas.length + " arena(s); x = instruction, y = offset"));
    const svg = s("svg", { id: "memory-plan", width: W + left + 20, height: H + top + 24 });
    const base = [];
    mem.arenas.reduce((acc, size) => { base.push(acc); return acc + size; }, 0);
    svg.append(s("line", { class: "axis", x1: left, y1: top + H, x2: left + W, y2: top + H }));
    svg.append(s("line", { class: "axis", x1: left, y1: top, x2: left, y2: top + H }));
    svg.append(s("text", { class: "axis-label", x: 4, y: top + 10 }, String(total) + " B"));
    svg.append(s("text", { class: "axis-label", x: 4, y: top + H }, "0"));
    svg.append(s("text", { class: "axis-label", x: left, y: top + H + 16 }, "@0"));
    svg.append(s("text", { class: "axis-label", x: left + W - 30, y: top + H + 16 }, "@" + (steps - 1)));
    const xs = W / steps, ys = H / total;
    mem.buffers.forEach(([name, arena, offset, nbytes, first, last, type], k) => {
      const y0 = (base[arena] || 0) + offset;
      const r = s("rect", {
        class: "buffer", x: left + first * xs, width: Math.max((last - first + 1) * xs, 1.5),
        y: top + H - (y0 + nbytes) * ys, height: Math.max(nbytes * ys, 1), fill: MEM_COLORS[k % MEM_COLORS.length],
        "data-name": name,
      });
      r.append(s("title", {}, name + " " + type + "\n" + mem.instructions[first] + " .. " + mem.instructions[last]));
      r.addEventListener("click", () => {
        svg.querySelectorAll(".buffer.selected").forEach((x) => x.classList.remove("selected"));
        r.classList.add("selected");
        panel.textContent = "";
        panel.append(h("h2", {}, "tensor " + name));
        const table = h("table", { id: "detail-table" });
        table.append(row("type", type), row("arena", String(arena)), row("offset", String(offset)),
                     row("bytes", String(nbytes)), row("first use", mem.instructions[first] || ""),
                     row("last use", mem.instructions[last] || ""));
        panel.append(table);
        for (const [caption, pc] of [["first use", first], ["last use", last]]) {
          const node = mem.nodes[pc];
          if (node === undefined) continue;
          const b = h("button", { "data-node": String(node) }, "show " + caption + " \u2192");
          b.addEventListener("click", () => { select(node); centerOn("n:" + node); });
          panel.append(b);
        }
        notes();
      });
      svg.append(r);
    });
    memoryBox.append(svg);
  }

  // ---------------------------------------------------------------- graphs, tabs, API
  function show(id) {
    const graph = GRAPHS.get(id);
    if (!graph) return;
    state.graph = graph;
    state.clusters = buildClusters(graph);
    state.collapsed = defaultCollapsed(graph, state.clusters);
    state.selected = null;
    state.view = null;
    tabs();
    panel.textContent = "";
    panel.append(h("p", { class: "hint" }, "Click a box for its op, shapes, dtypes and source line. " +
      "Click a dashed box to open a module group, a group's title to fold it. Drag to pan, wheel to zoom."));
    notes();
    draw();
    drawMemory();
  }

  function tabs() {
    const nav = el("tabs");
    nav.textContent = "";
    let top = state.graph;
    const trail = [];
    while (top.parent) { trail.unshift(top); top = GRAPHS.get(top.parent); }
    for (const g of DATA.graphs.filter((x) => !x.parent)) {
      const b = h("button", { class: g.id === top.id ? "active" : "", "data-graph": g.id }, g.title);
      b.addEventListener("click", () => show(g.id));
      nav.append(b);
    }
    for (const g of trail) nav.append(h("span", { class: "crumb" }, "\u203a " + g.title));
  }

  function publish() {
    const graph = state.graph;
    document.body.dataset.graph = graph.id;
    document.body.dataset.nodeCount = String(graph.nodes.length);
    document.body.dataset.visibleCount = String(state.visible);
    document.body.dataset.selected = state.selected === null ? "" : graph.nodes[state.selected].name;
    el("stats").textContent = graph.nodes.length + " nodes, " + state.visible + " boxes shown, layout " + state.layoutMs + " ms";
  }

  function find(name) {  // the node of that name, else the first whose name contains it
    let i = state.graph.nodes.findIndex((n) => n.name === name);
    if (i < 0 && name) i = state.graph.nodes.findIndex((n) => n.name.includes(name));
    if (i < 0) return false;
    select(i);
    centerOn("n:" + i);
    return true;
  }

  el("fit").addEventListener("click", () => { fit(true); applyView(); });
  el("expand-all").addEventListener("click", () => setAll(false));
  el("collapse-all").addEventListener("click", () => setAll(true));
  el("memory-toggle").addEventListener("click", () => memoryBox.classList.toggle("shown"));
  el("search").addEventListener("keydown", (e) => { if (e.key === "Enter") find(e.target.value.trim()); });

  window.exportirViewer = {
    graphs: DATA.graphs.map((g) => ({ id: g.id, title: g.title, parent: g.parent, nodes: g.nodes.length })),
    show, find, expandAll: () => setAll(false), collapseAll: () => setAll(true),
    expand: (path) => {  // open the group of module `path` (and the groups around it)
      const c = [...state.clusters.clusters.values()].find((x) => x.path === path);
      if (!c) return false;
      for (const id of chainOfCluster(c)) state.collapsed.delete(id);
      expand(c.id);
      return true;
    },
    get nodeCount() { return state.graph.nodes.length; },
    get visibleCount() { return state.visible; },
    get layoutMs() { return state.layoutMs; },
  };
  document.title = DATA.title;
  el("title").textContent = DATA.title;
  show(DATA.graphs[0].id);
  document.body.dataset.ready = "1";
})();
