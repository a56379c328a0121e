// The attention explorer's script: reads the JSON that transformer/analysis/explore.py embeds in the page and
// draws it. No libraries, no network. Data layout (per prompt): attention[l][h][t][s] * attention_scale
// (an integer) for query t and key column s, each row cut after its last visible key; key_positions[s]
// (null: a key every query sees: the sink's column and the registers', in front of the tokens);
// register_share and sink_share [l][h] (null when the model has none); top[maskKey] = [[id, label, p], ...]
// for the precomputed head masks only (maskKey: '1' on / '0' off per head, layer by layer).
"use strict";
const data = JSON.parse(document.getElementById("explorer-data").textContent);
const L = data.model.num_layers, H = data.model.num_heads;
const state = {prompt: 0, layer: 0, head: 0, on: Array.from({length: L}, () => Array(H).fill(true))};
const $ = (id) => document.getElementById(id);

// Magma-like colours on a square-root scale, so that small weights stay visible.
const STOPS = [[0, 0, 4], [28, 16, 68], [79, 18, 123], [129, 37, 129], [181, 54, 122],
               [229, 80, 100], [251, 135, 97], [254, 194, 135], [252, 253, 191]];
function colour(v) {
  const x = Math.sqrt(Math.min(Math.max(v, 0), 1)) * (STOPS.length - 1);
  const i = Math.min(Math.floor(x), STOPS.length - 2), f = x - i;
  return STOPS[i].map((c, k) => Math.round(c + f * (STOPS[i + 1][k] - c)));
}
const MASKED = [238, 238, 238];  // a key after the query: not attended to at all

function prompt() { return data.prompts[state.prompt]; }
function visible(p, t, s) { const pos = p.key_positions[s]; return pos === null || pos <= t; }
function weight(p, l, h, t, s) { const row = p.attention[l][h][t]; return s < row.length ? row[s] / p.attention_scale : 0; }
// A key column as the map and the pointer name it: a token with its position, or a sink or register.
function keyName(p, s) { const pos = p.key_positions[s]; return pos === null ? p.key_labels[s] : `${p.key_labels[s]} ${pos}`; }
function maskKey() { return state.on.map((row) => row.map((x) => (x ? "1" : "0")).join("")).join(""); }

function drawThumb(canvas, p, l, h) {
  const T = p.query_labels.length, S = p.key_labels.length;
  canvas.width = S; canvas.height = T;
  const ctx = canvas.getContext("2d"), img = ctx.createImageData(S, T);
  for (let t = 0; t < T; t++) for (let s = 0; s < S; s++) {
    const c = visible(p, t, s) ? colour(weight(p, l, h, t, s)) : MASKED, o = 4 * (t * S + s);
    img.data[o] = c[0]; img.data[o + 1] = c[1]; img.data[o + 2] = c[2]; img.data[o + 3] = 255;
  }
  ctx.putImageData(img, 0, 0);
}

// The selected map: one cell per (query, key), the tokens as axis labels.
const map = {cell: 0, left: 0, top: 0};
function drawMap() {
  const p = prompt(), T = p.query_labels.length, S = p.key_labels.length;
  const canvas = $("map"), ctx = canvas.getContext("2d");
  map.cell = Math.max(4, Math.min(22, Math.floor(520 / Math.max(T, S))));
  const font = Math.min(12, map.cell), every = Math.ceil(9 / map.cell);  // label every n-th token when cells are small
  ctx.font = `${font}px ui-monospace, monospace`;
  const width = (names) => Math.max(...names.map((x) => ctx.measureText(x).width));
  map.left = Math.ceil(width(p.query_labels.map((x, t) => `${x} ${t}`))) + 8;
  map.top = Math.ceil(width(p.key_labels.map((x, s) => keyName(p, s)))) + 8;
  canvas.width = map.left + S * map.cell + 2; canvas.height = map.top + T * map.cell + 2;
  Object.assign(canvas.dataset, map);  // the cell grid's geometry, for tests and tools
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, canvas.width, canvas.height);
  for (let t = 0; t < T; t++) for (let s = 0; s < S; s++) {
    const c = visible(p, t, s) ? colour(weight(p, state.layer, state.head, t, s)) : MASKED;
    ctx.fillStyle = `rgb(${c[0]},${c[1]},${c[2]})`;
    ctx.fillRect(map.left + s * map.cell, map.top + t * map.cell, map.cell, map.cell);
  }
  ctx.font = `${font}px ui-monospace, monospace`; ctx.fillStyle = "#222"; ctx.textBaseline = "middle";
  ctx.textAlign = "right";
  p.query_labels.forEach((x, t) => { if (t % every === 0) ctx.fillText(`${x} ${t}`, map.left - 4, map.top + (t + 0.5) * map.cell); });
  ctx.save(); ctx.rotate(-Math.PI / 2); ctx.textAlign = "left";
  p.key_labels.forEach((x, s) => {  // the sink and the registers always labelled, tokens every n-th
    const pos = p.key_positions[s];
    if (pos === null || pos % every === 0) ctx.fillText(keyName(p, s), -map.top + 4, map.left + (s + 0.5) * map.cell);
  });
  ctx.restore();
  $("map-title").firstChild.textContent = `layer ${state.layer + 1}, head ${state.head + 1}: ` +
    "rows are queries (attending), columns keys (attended to)";
  $("stat-share").textContent = p.first_token_share[state.layer][state.head].toFixed(4);
  $("stat-entropy").textContent = p.entropy[state.layer][state.head].toFixed(4);
  for (const [id, shares] of [["register", p.register_share], ["sink", p.sink_share]]) {
    $(`stat-${id}-part`).style.display = shares ? "" : "none";
    $(`stat-${id}`).textContent = shares ? shares[state.layer][state.head].toFixed(4) : "";
  }
}

function pointAt(event) {
  const p = prompt(), T = p.query_labels.length, S = p.key_labels.length;
  const t = Math.floor((event.offsetY - map.top) / map.cell), s = Math.floor((event.offsetX - map.left) / map.cell);
  const readout = $("readout");
  if (t < 0 || s < 0 || t >= T || s >= S) { readout.textContent = "point at a cell"; return; }
  const what = visible(p, t, s) ? weight(p, state.layer, state.head, t, s).toFixed(4) : "masked (the key comes after the query)";
  const pos = p.key_positions[s];
  const key = pos === null ? (p.key_labels[s] === "sink" ? "sink (attends to nothing)" : p.key_labels[s])
                           : `key ${pos} "${p.key_labels[s]}"`;
  readout.textContent = `query ${t} "${p.query_labels[t]}" \u2192 ${key}: ${what}`;
  readout.dataset.query = t; readout.dataset.key = s;
}

function drawTopK() {
  const key = maskKey(), top = prompt().top[key], body = $("topk").tBodies[0], status = $("mask-status");
  body.replaceChildren();
  const mask = data.masks.find((m) => m.key === key);
  status.dataset.key = key;
  if (!top) {
    status.className = "uncovered";
    status.textContent = "This combination of heads off was not precomputed, so no numbers are shown " +
      "(they would not be what the model computes). Covered: " + data.coverage + ".";
    return;
  }
  status.className = "";
  status.textContent = `heads: ${mask.name}`;
  top.forEach(([id, label, prob], i) => {
    const row = body.insertRow();
    row.insertCell().textContent = i + 1;
    const token = row.insertCell(); token.className = "token"; token.textContent = label; token.dataset.id = id;
    const cell = row.insertCell(); cell.className = "prob"; cell.textContent = prob.toFixed(4); cell.dataset.p = prob;
    const bar = row.insertCell(); bar.className = "barcell";
    bar.appendChild(document.createElement("div")).style.width = `${Math.round(120 * prob)}px`;
  });
}

function buildGrid() {
  const p = prompt(), grid = $("grid");
  grid.replaceChildren();
  grid.style.gridTemplateColumns = `auto repeat(${H}, 100px)`;
  for (let l = 0; l < L; l++) {
    const head = grid.appendChild(document.createElement("div"));
    head.className = "rowhead"; head.textContent = `layer ${l + 1} `;
    const all = head.appendChild(document.createElement("button"));
    all.className = "layer-toggle"; all.dataset.layer = l;
    all.textContent = state.on[l].some((x) => x) ? "all off" : "all on";
    all.onclick = () => { const v = !state.on[l].some((x) => x); state.on[l].fill(v); update(); };
    for (let h = 0; h < H; h++) {
      const thumb = grid.appendChild(document.createElement("div"));
      thumb.className = "thumb" + (l === state.layer && h === state.head ? " selected" : "") + (state.on[l][h] ? "" : " off");
      thumb.dataset.layer = l; thumb.dataset.head = h;
      drawThumb(thumb.appendChild(document.createElement("canvas")), p, l, h);
      const caption = thumb.appendChild(document.createElement("div"));
      const toggle = caption.appendChild(document.createElement("input"));
      toggle.type = "checkbox"; toggle.className = "toggle"; toggle.checked = state.on[l][h];
      toggle.dataset.layer = l; toggle.dataset.head = h; toggle.title = "switch this head on or off";
      toggle.onclick = (e) => { e.stopPropagation(); state.on[l][h] = toggle.checked; update(); };
      caption.appendChild(document.createTextNode(` L${l + 1} H${h + 1}`));
      const stats = thumb.appendChild(document.createElement("div"));
      stats.className = "stats";
      stats.textContent = `1st ${p.first_token_share[l][h].toFixed(2)} \u00b7 ent ${p.entropy[l][h].toFixed(2)}`;
      if (p.sink_share) {  // a line of its own: the thumbnail is narrow
        const sink = thumb.appendChild(document.createElement("div"));
        sink.className = "stats"; sink.textContent = `sink ${p.sink_share[l][h].toFixed(2)}`;
      }
      thumb.onclick = () => { state.layer = l; state.head = h; update(); };
    }
  }
}

function buildButtons() {
  for (const [id, n, field] of [["layer-buttons", L, "layer"], ["head-buttons", H, "head"]]) {
    const bar = $(id);
    for (let i = 0; i < n; i++) {
      const b = bar.appendChild(document.createElement("button"));
      b.textContent = i + 1; b.dataset[field] = i;
      b.onclick = () => { state[field] = i; update(); };
    }
  }
  const select = $("prompt");
  data.prompts.forEach((p, i) => select.add(new Option(`${i + 1}: ${p.text.slice(0, 60)}`, i)));
  select.onchange = () => { state.prompt = Number(select.value); update(); };
  if (data.prompts.length < 2) $("prompt-bar").style.display = "none";
}

function update() {
  document.querySelectorAll("#layer-buttons button").forEach((b) => b.classList.toggle("selected", Number(b.dataset.layer) === state.layer));
  document.querySelectorAll("#head-buttons button").forEach((b) => b.classList.toggle("selected", Number(b.dataset.head) === state.head));
  buildGrid(); drawMap(); drawTopK();
  $("readout").textContent = "point at a cell";
}

const m = data.model;
$("model").textContent = `${m.num_layers} layers x ${m.num_heads} heads, d_model ${m.d_model}, ${m.attention}, ` +
  `${m.position} positions, vocabulary ${m.vocab_size}` + (m.attention_sink ? ", attention sink" : "") +
  (m.num_registers ? `, ${m.num_registers} register${m.num_registers > 1 ? "s" : ""}` : "");
$("covered").textContent = `Switching heads off shows the model's real next-token distribution with those heads ` +
  `masked, for the combinations computed in advance: ${data.coverage}.`;
$("map").addEventListener("mousemove", pointAt);
$("map").addEventListener("mouseleave", () => { $("readout").textContent = "point at a cell"; });
buildButtons();
update();
