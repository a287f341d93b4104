// The engine panel: reads GET /v1/status/stream (docs/web.md) and draws it with plain SVG:
// the memory plan as one bar, one bar per forward pass split into read wait and compute,
// the queue and this key's sequences with their prefill progress, the state cache's hits.

import { readEvents } from "./sse.js";

const SVG = "http://www.w3.org/2000/svg";
/** Passes drawn at once (the newest at the right). */
const PASSES_SHOWN = 60;

const $ = (id) => document.getElementById(id);
/** Bytes in the unit that reads best (GB = 1e9 bytes, as k3's plan prints them). */
const size = (bytes) =>
  bytes >= 1e9
    ? `${(bytes / 1e9).toFixed(bytes >= 1e10 ? 0 : 2)} GB`
    : bytes >= 1e6
    ? `${(bytes / 1e6).toFixed(1)} MB`
    : `${(bytes / 1e3).toFixed(1)} kB`;
const ms = (seconds) => (seconds * 1000).toFixed(1);

function svgRect(attrs, title) {
  const r = document.createElementNS(SVG, "rect");
  for (const [k, v] of Object.entries(attrs)) r.setAttribute(k, String(v));
  if (title) {
    const t = document.createElementNS(SVG, "title");
    t.textContent = title;
    r.append(t);
  }
  return r;
}

/** The `plan` event: the bar and its legend. */
function drawPlan(plan) {
  const bar = $("memory-bar"), legend = $("memory-legend");
  const whole = plan.parts.reduce((a, p) => a + p.bytes, 0) || 1;
  bar.replaceChildren();
  legend.replaceChildren();
  let x = 0;
  plan.parts.forEach((part, i) => {
    const w = (300 * part.bytes) / whole;
    const text = `${part.name} ${size(part.bytes)}`;
    if (w > 0) bar.append(svgRect({ x, y: 0, width: w, height: 16, class: `mem-${i}` }, text));
    x += w;
    const li = document.createElement("li");
    li.dataset.part = part.name;
    li.dataset.bytes = String(part.bytes);
    li.innerHTML = `<span class="swatch mem-${i}"></span>`;
    li.append(text);
    legend.append(li);
  });
  bar.setAttribute(
    "aria-label",
    `memory plan, ${plan.mode}: ${plan.parts.map((p) => `${p.name} ${size(p.bytes)}`).join(", ")}`,
  );
}

/** The `status` event: queue, sequences, state cache. */
function drawStatus(s, lastPrefill) {
  $("queue").textContent = `${s.active} in flight, ${s.queued} waiting` +
    (s.other_sequences > 0 ? ` (${s.other_sequences} of other keys)` : "") + `; ${s.passes} passes`;
  const list = $("sequences");
  const items = s.sequences.map((q) => {
    const li = document.createElement("li");
    li.dataset.seq = q.id;
    li.dataset.phase = q.phase;
    if (q.phase === "prefill") {
      const eta = q.eta_seconds === null ? "" : `, about ${q.eta_seconds.toFixed(1)} s left`;
      const layer = q.layer === null ? "" : `, layer ${q.layer}`;
      li.append(`${q.id}: reading the prompt, ${q.prefilled} of ${q.prompt_tokens} tokens${layer}${eta}`);
      li.append(prefillBar(q.prefilled, q.prompt_tokens, q.id));
    } else if (q.phase === "decode") {
      li.append(`${q.id}: prompt ${q.prompt_tokens} tokens read; ${q.generated} generated`);
    } else li.append(`${q.id}: waiting for a slot`);
    return li;
  });
  if (items.length === 0 && lastPrefill) {
    const li = document.createElement("li");
    li.append(`last prompt: ${lastPrefill.done} of ${lastPrefill.total} tokens read`);
    li.append(prefillBar(lastPrefill.done, lastPrefill.total, lastPrefill.id));
    items.push(li);
  }
  list.replaceChildren(...items);
  const c = s.state_cache;
  $("state-cache").textContent = c === null
    ? "off"
    : `${c.hits} hits (${c.diskHits} from disk), ${c.misses} misses; ${c.cachedTokens} tokens not prefilled; ` +
      `${c.entries} kept, ${size(c.bytes)}`;
}

function prefillBar(done, total, id) {
  const p = document.createElement("progress");
  p.className = "prefill";
  p.max = total;
  p.value = done;
  p.dataset.seq = id;
  p.setAttribute("aria-label", `prompt read: ${done} of ${total} tokens`);
  return p;
}

/** The pass bars: the last PASSES_SHOWN passes, heights relative to the slowest shown. */
function drawPasses(passes) {
  const svg = $("pass-bars");
  const top = Math.max(...passes.map((p) => p.seconds), 1e-9);
  const w = 300 / PASSES_SHOWN;
  const bars = [];
  passes.forEach((p, i) => {
    const read = p.trunk_read_wait_seconds + p.expert_read_wait_seconds;
    const x = (PASSES_SHOWN - passes.length + i) * w;
    const hRead = (80 * Math.min(read, p.seconds)) / top;
    const hCompute = (80 * Math.min(p.compute_seconds, p.seconds - Math.min(read, p.seconds))) / top;
    const title =
      `pass ${p.pass}: ${ms(p.seconds)} ms, read wait ${ms(read)} ms, compute ${ms(p.compute_seconds)} ms, ${
        size(p.trunk_bytes + p.expert_bytes)
      } read, ${p.expert_hits} expert hits, ${p.expert_misses} misses` +
      (p.tokens.length > 0 ? `; token ${p.tokens.map((t) => `${t.index} of ${t.id}`).join(", ")}` : "") +
      (p.prefill.length > 0 ? "; prompt" : "");
    const g = document.createElementNS(SVG, "g");
    g.setAttribute("class", "pass");
    g.dataset.pass = String(p.pass);
    g.dataset.seconds = String(p.seconds);
    g.dataset.readWait = String(read);
    g.dataset.compute = String(p.compute_seconds);
    g.dataset.bytes = String(p.trunk_bytes + p.expert_bytes);
    g.dataset.expertHits = String(p.expert_hits);
    g.dataset.tokens = p.tokens.map((t) => `${t.id}#${t.index}`).join(" ");
    g.append(svgRect({ x, y: 80 - hRead, width: w * 0.85, height: hRead, class: "read" }, title));
    g.append(svgRect({ x, y: 80 - hRead - hCompute, width: w * 0.85, height: hCompute, class: "compute" }, title));
    bars.push(g);
  });
  svg.replaceChildren(...bars);
  const p = passes[passes.length - 1];
  if (p) {
    $("last-pass").innerHTML = "";
    $("last-pass").append(
      span("read"),
      ` read wait ${ms(p.trunk_read_wait_seconds + p.expert_read_wait_seconds)} ms `,
      span("compute"),
      ` compute ${ms(p.compute_seconds)} ms of ${ms(p.seconds)} ms; ` +
        `${size(p.trunk_bytes + p.expert_bytes)} read, ${p.expert_hits} expert hits`,
    );
  }
}

function span(cls) {
  const s = document.createElement("span");
  s.className = `swatch ${cls}`;
  return s;
}

/**
 * Follows the status stream with `headers()` (the API key) until the page closes;
 * `onUnauthorized()` is called on a 401 and resolves when a new key is there.
 */
export async function startPanel(headers, onUnauthorized) {
  const passes = [];
  let lastPrefill = null;
  let status = null;
  let frame = 0;
  // Passes can come faster than frames: draw the bars once per frame; prefill progress
  // and the status are drawn as they come (each is a change a person waits for).
  const drawSoon = () => {
    if (!frame) {
      frame = requestAnimationFrame(() => {
        frame = 0;
        drawPasses(passes);
      });
    }
  };
  for (;;) {
    try {
      const res = await fetch("/v1/status/stream", { headers: headers() });
      if (res.status === 401) {
        $("engine-state").textContent = "waiting for the API key";
        await onUnauthorized();
        continue;
      }
      if (!res.ok) throw new Error(`status stream: HTTP ${res.status}`);
      $("engine-state").textContent = "live";
      await readEvents(res, (type, data) => {
        const event = JSON.parse(data);
        if (type === "plan") drawPlan(event);
        else if (type === "status") {
          status = event;
          drawStatus(status, lastPrefill);
        } else if (type === "pass") {
          passes.push(event);
          if (passes.length > PASSES_SHOWN) passes.shift();
          for (const p of event.prefill) lastPrefill = p;
          drawSoon();
        }
      });
      $("engine-state").textContent = "the server closed the status stream; reconnecting";
    } catch (e) {
      $("engine-state").textContent = `not connected (${e.message}); retrying`;
    }
    await new Promise((r) => setTimeout(r, 2000));
  }
}
