// The chat page of k3 serve (docs/web.md): conversations kept in localStorage, replies
// streamed from POST /v1/chat/completions (the public API only: this is also a worked
// example of a client) and rendered as sanitised Markdown, the reasoning in a collapsible
// block, tool calls shown as such, and the engine panel beside it (panel.js).

import { renderMarkdown } from "./markdown.js";
import { readEvents } from "./sse.js";
import { startPanel } from "./panel.js";

const $ = (id) => document.getElementById(id);
const STORE = "k3.conversations";
const SETTINGS = "k3.settings";
const KEY = "k3.apiKey";
const CURRENT = "k3.current";
const SETTING_IDS = ["system", "thinking", "effort", "temperature", "top_p", "top_k", "max_tokens", "seed", "tools"]
  .concat(["tool_choice", "schema"]);

/** { id, title, messages: [{ role, content, reasoning?, tool_calls?, usage?, finish?, error? }] }[] */
let conversations = load(STORE, []);
let current = conversations.find((c) => c.id === localStorage.getItem(CURRENT))?.id ?? conversations[0]?.id ??
  newConversation().id;
/** The reply being generated: its AbortController. */
let generation = null;

function load(key, fallback) {
  try {
    return JSON.parse(localStorage.getItem(key) ?? "null") ?? fallback;
  } catch {
    return fallback;
  }
}

function save() {
  localStorage.setItem(STORE, JSON.stringify(conversations));
  if (current) localStorage.setItem(CURRENT, current);
}

function newConversation() {
  const c = {
    id: `c${Date.now().toString(36)}${Math.random().toString(36).slice(2, 6)}`,
    title: "New chat",
    messages: [],
  };
  conversations.unshift(c);
  return c;
}

const conversation = () => conversations.find((c) => c.id === current);

/** The request headers: JSON, and the API key when one was given. */
function headers() {
  const key = sessionStorage.getItem(KEY);
  return { "content-type": "application/json", ...(key ? { authorization: `Bearer ${key}` } : {}) };
}

/** Asks for the API key (once per tab); resolves when one is entered. */
let asking = null;
function askKey() {
  asking ??= new Promise((resolve) => {
    const dialog = $("key-dialog");
    $("key-form").onsubmit = (e) => {
      e.preventDefault();
      sessionStorage.setItem(KEY, $("key-input").value);
      dialog.close();
      asking = null;
      resolve();
    };
    dialog.showModal();
    $("key-input").focus();
  });
  return asking;
}

/** fetch() that asks for the API key on a 401 and tries again with it. */
async function api(path, init = {}) {
  for (;;) {
    const res = await fetch(path, { ...init, headers: headers() });
    if (res.status !== 401) return res;
    await askKey();
  }
}

// --- settings -------------------------------------------------------------------------

function readSettings() {
  const s = {};
  for (const id of SETTING_IDS) {
    const el = $(id);
    s[id] = el.type === "checkbox" ? el.checked : el.value;
  }
  return s;
}

function restoreSettings() {
  const s = load(SETTINGS, {});
  for (const id of SETTING_IDS) {
    if (!(id in s)) continue;
    const el = $(id);
    if (el.type === "checkbox") el.checked = s[id];
    else el.value = s[id];
  }
}

/** The request body for the conversation's messages, or throws a message for the user. */
function requestBody(messages) {
  const s = readSettings();
  const body = {
    messages: [
      ...(s.system.trim() ? [{ role: "system", content: s.system }] : []),
      ...messages.map((m) =>
        m.role === "assistant"
          ? { role: "assistant", content: m.content, ...(m.tool_calls?.length ? { tool_calls: m.tool_calls } : {}) }
          : { role: m.role, content: m.content }
      ),
    ],
    stream: true,
    stream_options: { include_usage: true },
    chat_template_kwargs: { thinking: s.thinking, ...(s.thinking && s.effort ? { thinking_effort: s.effort } : {}) },
  };
  for (const [name, int] of [["temperature", false], ["top_p", false], ["top_k", true], ["max_tokens", true]]) {
    if (s[name] !== "") body[name] = int ? parseInt(s[name], 10) : Number(s[name]);
  }
  if (s.seed !== "") body.seed = parseInt(s.seed, 10);
  if (s.tools.trim()) {
    try {
      body.tools = JSON.parse(s.tools);
    } catch (e) {
      throw new Error(`the tools are not JSON: ${e.message}`);
    }
    if (s.tool_choice === "first") {
      const name = body.tools[0]?.function?.name;
      if (!name) throw new Error("'the first tool, forced' needs a tool with a function name");
      body.tool_choice = { type: "function", function: { name } };
    } else if (s.tool_choice) body.tool_choice = s.tool_choice;
  }
  if (s.schema.trim()) {
    let schema;
    try {
      schema = JSON.parse(s.schema);
    } catch (e) {
      throw new Error(`the JSON schema is not JSON: ${e.message}`);
    }
    body.response_format = { type: "json_schema", json_schema: { name: "answer", schema } };
  }
  return body;
}

// --- rendering ------------------------------------------------------------------------

/** One message's element (created once; its parts updated in place while it streams). */
function messageElement(m) {
  const el = document.createElement("article");
  el.className = `msg ${m.role}`;
  const who = document.createElement("span");
  who.className = "who";
  who.textContent = m.role === "user" ? "You" : m.role === "assistant" ? "k3" : m.role;
  el.append(who);
  if (m.role !== "assistant") {
    el.append(m.content);
    return el;
  }
  const reasoning = document.createElement("details");
  reasoning.className = "reasoning";
  reasoning.innerHTML = '<summary>Reasoning</summary><div class="text"></div>';
  const body = document.createElement("div");
  body.className = "content";
  const tools = document.createElement("div");
  tools.className = "tools";
  const meta = document.createElement("div");
  meta.className = "meta";
  el.append(reasoning, body, tools, meta);
  updateMessage(el, m, false);
  return el;
}

/** Refreshes a reply's element from `m`; `streaming` keeps the reasoning open. */
function updateMessage(el, m, streaming) {
  const reasoning = el.querySelector(".reasoning");
  reasoning.hidden = !m.reasoning;
  if (m.reasoning) {
    reasoning.querySelector(".text").textContent = m.reasoning;
    reasoning.querySelector("summary").textContent = streaming && !m.content && !m.tool_calls?.length
      ? "Reasoning…"
      : `Reasoning (${m.reasoning.length} characters)`;
    if (streaming && !m.content) reasoning.open = true;
  }
  el.querySelector(".content").innerHTML = renderMarkdown(m.content ?? "");
  const tools = el.querySelector(".tools");
  tools.replaceChildren(...(m.tool_calls ?? []).map((call) => {
    const box = document.createElement("div");
    box.className = "tool-call";
    const name = document.createElement("strong");
    name.textContent = `Tool call: ${call.function.name}`;
    const args = document.createElement("pre");
    args.textContent = call.function.arguments;
    box.append(name, args);
    return box;
  }));
  const meta = el.querySelector(".meta");
  meta.className = m.error ? "meta error" : "meta";
  meta.textContent = m.error ? m.error : usageLine(m);
}

function usageLine(m) {
  const parts = [];
  if (m.finish) parts.push(m.finish === "stopped" ? "stopped by you" : `finish: ${m.finish}`);
  const u = m.usage;
  if (u) {
    const cached = u.prompt_tokens_details?.cached_tokens;
    const reasoning = u.completion_tokens_details?.reasoning_tokens;
    parts.push(
      `${u.prompt_tokens} prompt tokens${cached !== undefined ? ` (${cached} cached)` : ""}, ` +
        `${u.completion_tokens} completion tokens${reasoning ? ` (${reasoning} reasoning)` : ""}`,
    );
  }
  return parts.join(" · ");
}

function renderAll() {
  const c = conversation();
  const select = $("conversations");
  select.replaceChildren(...conversations.map((x) => new Option(x.title, x.id, false, x.id === current)));
  $("log").replaceChildren(...c.messages.map(messageElement));
  $("log").scrollTop = $("log").scrollHeight;
  updateButtons();
}

function updateButtons() {
  const c = conversation();
  $("send").disabled = generation !== null;
  $("stop").disabled = generation === null;
  $("regenerate").disabled = generation !== null || !c.messages.some((m) => m.role === "user");
}

// --- generation -----------------------------------------------------------------------

/** Streams a reply to the conversation as it stands. */
async function generate() {
  const c = conversation();
  let body;
  try {
    body = requestBody(c.messages);
  } catch (e) {
    $("state").textContent = e.message;
    return;
  }
  const reply = { role: "assistant", content: "", reasoning: "", tool_calls: [] };
  c.messages.push(reply);
  const el = messageElement(reply);
  $("log").append(el);
  generation = new AbortController();
  updateButtons();
  $("state").textContent = "generating…";
  let frame = 0;
  const redraw = () => {
    if (frame) return;
    frame = requestAnimationFrame(() => {
      frame = 0;
      const log = $("log");
      const atEnd = log.scrollHeight - log.scrollTop - log.clientHeight < 40;
      updateMessage(el, reply, true);
      if (atEnd) log.scrollTop = log.scrollHeight;
    });
  };
  try {
    const res = await api("/v1/chat/completions", {
      method: "POST",
      body: JSON.stringify(body),
      signal: generation.signal,
    });
    if (!res.ok) {
      const text = await res.text();
      let message = text;
      try {
        message = JSON.parse(text).error.message;
      } catch { /* not OpenAI's error body */ }
      throw new Error(`HTTP ${res.status}: ${message}`);
    }
    await readEvents(res, (_type, data) => {
      if (data === "[DONE]") return;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message);
      if (chunk.usage) reply.usage = chunk.usage;
      const choice = chunk.choices?.[0];
      if (!choice) return;
      const d = choice.delta ?? {};
      if (d.reasoning_content) reply.reasoning += d.reasoning_content;
      if (d.content) reply.content += d.content;
      for (const t of d.tool_calls ?? []) {
        const call = reply.tool_calls[t.index] ??= {
          id: t.id,
          type: "function",
          function: { name: "", arguments: "" },
        };
        if (t.id) call.id = t.id;
        if (t.function?.name) call.function.name += t.function.name;
        if (t.function?.arguments) call.function.arguments += t.function.arguments;
      }
      if (choice.finish_reason) reply.finish = choice.finish_reason;
      redraw();
    });
    $("state").textContent = "";
  } catch (e) {
    if (generation.signal.aborted) {
      reply.finish = "stopped";
      $("state").textContent = "stopped";
    } else {
      reply.error = e.message;
      $("state").textContent = "failed";
    }
  } finally {
    cancelAnimationFrame(frame);
    generation = null;
    if (c.title === "New chat") c.title = (c.messages.find((m) => m.role === "user")?.content ?? "").slice(0, 40);
    save();
    updateMessage(el, reply, false);
    el.querySelector(".reasoning").open = false;
    renderAll();
    $("prompt").focus();
  }
}

function send() {
  const text = $("prompt").value;
  if (!text.trim() || generation) return;
  conversation().messages.push({ role: "user", content: text });
  $("prompt").value = "";
  save();
  renderAll();
  generate();
}

/** Drops the last reply (everything after the last message of the user) and asks again. */
function regenerate() {
  const c = conversation();
  if (generation) return;
  while (c.messages.length > 0 && c.messages[c.messages.length - 1].role !== "user") c.messages.pop();
  if (c.messages.length === 0) return;
  renderAll();
  generate();
}

// --- wiring ---------------------------------------------------------------------------

function wire() {
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    send();
  });
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      send();
    }
  });
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && generation && !$("key-dialog").open) generation.abort();
  });
  $("stop").addEventListener("click", () => generation?.abort());
  $("regenerate").addEventListener("click", regenerate);
  $("new-chat").addEventListener("click", () => {
    if (generation) return;
    current = newConversation().id;
    save();
    renderAll();
    $("prompt").focus();
  });
  $("delete-chat").addEventListener("click", () => {
    if (generation) return;
    conversations = conversations.filter((c) => c.id !== current);
    current = conversations[0]?.id ?? newConversation().id;
    save();
    renderAll();
  });
  $("conversations").addEventListener("change", (e) => {
    if (generation) return;
    current = e.target.value;
    save();
    renderAll();
  });
  $("settings").addEventListener("change", () => localStorage.setItem(SETTINGS, JSON.stringify(readSettings())));
}

async function main() {
  save();
  restoreSettings();
  wire();
  renderAll();
  startPanel(headers, askKey);
  try {
    const models = await (await api("/v1/models")).json();
    $("model-name").textContent = models.data?.[0]?.id ?? "";
  } catch { /* the name is decoration */ }
}

main();
