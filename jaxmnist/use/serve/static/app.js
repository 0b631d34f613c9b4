// The page of `jaxmnist serve`: draw or upload, POST to /api/predict, show the answer.
// Drawing sends the pad as PNG while the stroke goes on, at most one request in flight:
// a change made meanwhile is sent when the answer arrives. Clear and uploads start a
// new generation: answers to older requests are dropped, never shown over the new
// state. body.dataset.state is "busy" while anything is outstanding, "idle" when the
// shown answer is current. Sizes, channels and class names come from /api/model (the
// model's dataset); whatever the pad's size, the server makes what it sends into the
// model's input, as `jaxmnist predict` does, and the answer shows that input.
"use strict";

const $ = (id) => document.getElementById(id);
const pad = $("pad");
const ctx = pad.getContext("2d");
const seen = $("seen").getContext("2d");
let model = null;
let inFlight = false;
let pending = null; // a body to send once the request in flight returns
let blobs = 0; // pad snapshots being encoded as PNG
let generation = 0; // bumped by Clear and uploads; older answers are stale
let stroke = null; // the last point of the stroke being drawn

function updateState() {
  document.body.dataset.state = inFlight || pending || blobs ? "busy" : "idle";
}

function setStatus(text) {
  $("status").textContent = text;
}

function clearPad() {
  generation += 1;
  pending = null;
  updateState();
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, pad.width, pad.height);
  seen.fillStyle = "#000";
  seen.fillRect(0, 0, model.width, model.height);
  showProbabilities(null);
  setStatus("");
}

function buildBars() {
  const bars = $("bars");
  bars.replaceChildren();
  model.class_names.forEach((name, i) => {
    const label = document.createElement("div");
    label.className = "label";
    label.textContent = name;
    const track = document.createElement("div");
    track.className = "track";
    const fill = document.createElement("div");
    fill.className = "fill";
    track.append(fill);
    const value = document.createElement("div");
    value.className = "value";
    value.textContent = "–";
    for (const el of [label, track, value]) el.dataset.cls = i;
    bars.append(label, track, value);
  });
}

function percent(fraction, digits) {
  return `${(100 * fraction).toFixed(digits)}%`;
}

function showProbabilities(result) {
  const top = $("top");
  const best = result ? result.top[0].class : -1;
  for (const el of $("bars").children) {
    const i = Number(el.dataset.cls);
    el.classList.toggle("best", i === best);
    const p = result ? result.probabilities[i] : 0;
    if (el.className.startsWith("track")) el.firstChild.style.width = `${(100 * p).toFixed(1)}%`;
    if (el.classList.contains("value")) el.textContent = result ? percent(p, 1) : "–";
  }
  const first = result && result.top[0];
  top.textContent = result ? `${first.name} (${percent(first.probability, 1)})` : "–";
  top.dataset.class = result ? String(best) : "";
  if (result) showSeen(result.input);
}

// rows: height x width gray values, or height x width x channels (RGB: the first three).
function showSeen(rows) {
  const image = seen.createImageData(model.width, model.height);
  rows.forEach((row, y) =>
    row.forEach((v, x) => {
      const k = 4 * (model.width * y + x);
      const [r, g, b] = Array.isArray(v) ? (v.length >= 3 ? v : [v[0], v[0], v[0]]) : [v, v, v];
      image.data[k] = r;
      image.data[k + 1] = g;
      image.data[k + 2] = b;
      image.data[k + 3] = 255;
    }),
  );
  seen.putImageData(image, 0, 0);
}

function setUpSeen() {
  const canvas = $("seen");
  canvas.width = model.width;
  canvas.height = model.height;
  // The shown image keeps the input's proportions: its longer side is the CSS size.
  const longer = Math.max(model.width, model.height);
  canvas.style.width = `${(112 * model.width) / longer}px`;
  canvas.style.height = `${(112 * model.height) / longer}px`;
  const size = model.image_size;
  canvas.setAttribute("aria-label", `The ${size} image the model saw`);
  $("seen-caption").textContent = `What the model saw (${size.replace(/x/g, "×")})`;
}

async function send(body, type) {
  if (inFlight) {
    pending = { body, type, generation };
    updateState();
    return;
  }
  inFlight = true;
  updateState();
  const sent = generation;
  try {
    const response = await fetch("/api/predict", {
      method: "POST",
      headers: { "Content-Type": type },
      body,
    });
    const result = await response.json();
    if (sent !== generation) return; // cleared or replaced while it was out
    if (response.ok) {
      showProbabilities(result);
      setStatus("");
    } else {
      setStatus(result.error || `the server answered ${response.status}`);
    }
  } catch (err) {
    if (sent === generation) setStatus(`no answer from the server (${err.message})`);
  } finally {
    inFlight = false;
    const next = pending;
    pending = null;
    if (next && next.generation === generation) send(next.body, next.type);
    updateState();
  }
}

function sendPad() {
  blobs += 1;
  updateState();
  const drawn = generation;
  pad.toBlob((blob) => {
    blobs -= 1;
    if (drawn === generation) send(blob, "image/png");
    updateState();
  }, "image/png");
}

function sendFile(file) {
  if (!file) return;
  if (file.size > model.max_body_bytes) {
    setStatus(`${file.name} is over ${model.max_body_bytes / 1048576} MB`);
    return;
  }
  generation += 1;
  pending = null;
  if (!$("draw").hidden) {
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, pad.width, pad.height);
  }
  send(file, file.type || "application/octet-stream");
}

function at(event) {
  const r = pad.getBoundingClientRect();
  return [
    ((event.clientX - r.left) * pad.width) / r.width,
    ((event.clientY - r.top) * pad.height) / r.height,
  ];
}

function drawTo(point) {
  ctx.beginPath();
  ctx.moveTo(...stroke);
  ctx.lineTo(...point);
  ctx.stroke();
  stroke = point;
}

function setUpPad() {
  ctx.lineWidth = 20;
  ctx.lineCap = "round";
  ctx.lineJoin = "round";
  ctx.strokeStyle = "#000";
  pad.addEventListener("pointerdown", (event) => {
    event.preventDefault();
    pad.setPointerCapture(event.pointerId);
    stroke = at(event);
    drawTo(stroke);
    sendPad();
  });
  pad.addEventListener("pointermove", (event) => {
    if (!stroke) return;
    const events = event.getCoalescedEvents ? event.getCoalescedEvents() : [];
    for (const e of events.length ? events : [event]) drawTo(at(e));
    sendPad();
  });
  const end = () => {
    if (!stroke) return;
    stroke = null;
    sendPad();
  };
  pad.addEventListener("pointerup", end);
  pad.addEventListener("pointercancel", end);
}

function setUpDrop(zone) {
  zone.addEventListener("dragover", (event) => {
    event.preventDefault();
    zone.classList.add("over");
  });
  zone.addEventListener("dragleave", () => zone.classList.remove("over"));
  zone.addEventListener("drop", (event) => {
    event.preventDefault();
    zone.classList.remove("over");
    sendFile(event.dataTransfer.files[0]);
  });
}

async function start() {
  try {
    const response = await fetch("/api/model");
    model = await response.json();
  } catch (err) {
    $("model").textContent = `Cannot reach the server (${err.message}).`;
    return;
  }
  const accuracy =
    model.test_accuracy == null ? "" : `, test accuracy ${percent(model.test_accuracy, 2)}`;
  // A run of several seeds: the ensemble of its members, or the member chosen.
  const seeds = model.seeds_in_run > 1 ? ` (${model.which})` : "";
  $("model").textContent =
    `${model.description} trained on ${model.display_name}${seeds}${accuracy}`;
  buildBars();
  setUpSeen();
  if (model.handwritten) {
    $("draw").hidden = false;
    setUpPad();
    setUpDrop(pad);
  } else {
    // Drawing clothes (or anything not handwritten) with a mouse would not look like the
    // dataset's images: ask for photos.
    $("drop").hidden = false;
    $("drop-text").textContent =
      `This model knows ${model.display_name}: ${model.class_names.join(", ")}. ` +
      "Drop a photo here, or choose one with the button below.";
    setUpDrop($("drop"));
  }
  $("file").addEventListener("change", (event) => {
    sendFile(event.target.files[0]);
    event.target.value = "";
  });
  $("clear").addEventListener("click", clearPad);
  clearPad();
}

start();
