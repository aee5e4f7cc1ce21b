// Solo playground: streams /v1/chat/completions or /v1/completions and shows TTFT, decode tok/s and the
// fraction of the decode roofline (from /playground/info). Plain browser JavaScript, no build step.
"use strict";

const $ = (id) => document.getElementById(id);
// generation: bumped by Clear and a mode switch, which also stop the reply in flight; a reply that ends after
// that leaves the history, the transcript and the stats alone.
const state = { mode: "chat", messages: [], info: null, controller: null, retry: null, generation: 0 };

function apiKey() { return $("api-key").value.trim(); }

function headers() {
  const h = { "Content-Type": "application/json" };
  if (apiKey()) h["Authorization"] = "Bearer " + apiKey();
  return h;
}

function showError(text) { $("error").textContent = text || ""; }

async function apiError(response) {
  try {
    const body = await response.json();
    return (body.error && body.error.message) || response.statusText;
  } catch (e) {
    return response.status + " " + response.statusText;
  }
}

async function loadInfo() {
  clearTimeout(state.retry);  // (one retry pending at most, however many calls failed)
  state.retry = null;
  let response;
  try {
    response = await fetch("playground/info", { headers: headers() });
  } catch (e) {  // the server stopped or cannot be reached: say so, and try again
    state.info = null;
    $("model-info").textContent = "the server cannot be reached; retrying…";
    state.retry = setTimeout(loadInfo, 3000);
    return;
  }
  if (response.status === 401) {
    $("model-info").textContent = "this server needs an API key: type it under Server";
    return;
  }
  if (response.status === 503) {
    state.retry = setTimeout(loadInfo, 1000);
    $("model-info").textContent = "loading the model…";
    return;
  }
  if (!response.ok) { $("model-info").textContent = await apiError(response); return; }
  const info = await response.json();
  state.info = info;
  const quant = info.quantize ? ", " + info.quantize : "";
  $("model-info").textContent = `${info.model} · ${info.device} (${info.backend}, ${info.dtype}${quant}) · ` +
    `context ${info.context}`;
  $("roofline-note").textContent = `roofline ${info.roofline_tokens_per_s.toFixed(0)} tok/s: ` +
    `${(info.bytes_per_token / 1e6).toFixed(1)} MB per token at ${info.roofline_context} tokens of context over ` +
    `${info.bandwidth_gbps.toFixed(1)} GB/s probed by the server` +
    (info.server_mean_decode_tokens_per_s ? `; server mean ${info.server_mean_decode_tokens_per_s.toFixed(1)} tok/s` : "");
  if (!info.chat && state.mode === "chat") setMode("completion");
  $("mode-chat").disabled = !info.chat;
  $("mode-chat").title = info.chat ? "" : "this model has no chat template";
}

function setMode(mode) {
  state.mode = mode;
  for (const b of document.querySelectorAll(".mode")) b.classList.toggle("active", b.dataset.mode === mode);
  $("prompt").placeholder = mode === "chat" ? "Type a message (Enter sends, Shift+Enter adds a line)"
    : "Type the text to continue (Enter sends, Shift+Enter adds a line)";
  clearTranscript();
}

function clearTranscript() {
  if (state.controller) state.controller.abort();
  state.controller = null;
  state.generation += 1;
  state.messages = [];
  $("transcript").textContent = "";
  $("send").disabled = false;
  $("stop").disabled = true;
  showError("");
}

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  const label = document.createElement("span");
  label.className = "role";
  label.textContent = role;
  const body = document.createElement("span");
  body.className = "text";
  body.textContent = text;
  div.append(label);
  if (role === "assistant") {  // a thinking model's reasoning (reasoning_content), folded away once it answers
    const thinking = document.createElement("details");
    thinking.className = "thinking";
    thinking.hidden = true;
    thinking.open = true;
    const summary = document.createElement("summary");
    summary.textContent = "thinking";
    const thought = document.createElement("span");
    thought.className = "thought";
    thinking.append(summary, thought);
    div.append(thinking);
  }
  div.append(body);
  $("transcript").append(div);
  $("transcript").scrollTop = $("transcript").scrollHeight;
  return body;
}

function showSpeed(ttft, tokens, decodeS) {
  $("ttft").textContent = ttft == null ? "–" : (ttft * 1000).toFixed(0) + " ms";
  $("tokens").textContent = String(tokens);
  // A reply that arrived in one read (a fast model, speculative steps) has no decode time of its own here: its
  // tokens over the time from the first token's arrival is then the whole time to it, a lower bound.
  const rate = decodeS > 0 ? (tokens - 1) / decodeS : ttft > 0 ? tokens / ttft : 0;
  if (tokens > 1 && rate > 0) {
    $("tps").textContent = rate.toFixed(1) + " tok/s";
    if (state.info && state.info.roofline_tokens_per_s) {
      const frac = rate / state.info.roofline_tokens_per_s;
      $("roofline-pct").textContent = (100 * frac).toFixed(0) + "%";
      $("roofline-bar").style.width = Math.min(100, 100 * frac).toFixed(1) + "%";
    }
  }
}

function readNumber(id, integer) {
  // The field's value as typed ("1e3" is 1000), undefined when empty; a clear error when it is not a number
  // of the kind the field takes (parseInt read "1e3" as 1 and "2.9" as 2, silently).
  const text = $(id).value.trim();
  if (text === "") {
    if ($(id).validity && $(id).validity.badInput) throw new Error(`${id}: not a number`);
    return undefined;
  }
  const value = Number(text);
  if (!Number.isFinite(value)) throw new Error(`${id}: ${text} is not a number`);
  if (integer && !Number.isInteger(value)) throw new Error(`${id}: ${text} is not a whole number`);
  return value;
}

function requestJSON() {
  // The request body's sampling fields as JSON text. The seed goes in as typed: a seed past 2^53 (the server
  // takes up to 2^63 - 1) would be rounded by a JavaScript number, and no longer repeat its output.
  const body = { stream: true, stream_options: { include_usage: true } };
  for (const [id, integer] of [["temperature", false], ["top_p", false], ["max_tokens", true]]) {
    const value = readNumber(id, integer);
    if (value !== undefined) body[id] = value;
  }
  let seed = $("seed").value.trim().replace(/^(-?)0+(?=[0-9])/, "$1");  // ("007" is no JSON number)
  if (seed !== "" && !/^-?[0-9]+$/.test(seed)) {
    const value = readNumber("seed", true);
    if (!Number.isSafeInteger(value)) throw new Error(`seed: ${seed} is not a whole number`);
    seed = String(value);
  } else if (seed === "" && $("seed").validity && $("seed").validity.badInput) {
    throw new Error("seed: not a number");
  }
  return (extra) => {
    const json = JSON.stringify(Object.assign({}, body, extra));
    return seed === "" ? json : json.slice(0, -1) + ',"seed":' + seed + "}";
  };
}

async function send(text, bodyWith) {
  showError("");
  const mode = state.mode, generation = state.generation;
  const current = () => generation === state.generation;
  let route, out, body, userText = null;
  if (mode === "chat") {
    state.messages.push({ role: "user", content: text });
    userText = addMessage("user", text);
    const system = $("system").value.trim();
    body = bodyWith({ messages: (system ? [{ role: "system", content: system }] : []).concat(state.messages) });
    route = "v1/chat/completions";
    out = addMessage("assistant", "");
  } else {
    route = "v1/completions";
    body = bodyWith({ prompt: text });
    $("transcript").textContent = "";
    const prompt = addMessage("prompt", text);
    out = document.createElement("span");
    out.className = "text completion";
    prompt.parentElement.append(out);
  }
  const controller = new AbortController();
  state.controller = controller;
  $("send").disabled = true;
  $("stop").disabled = false;
  const start = performance.now();
  let first = null, last = null, tokens = 0, reply = "", reasoning = "", finish = null;
  const thinking = out.parentElement.querySelector(".thinking");
  // Text is drawn once per frame, appended: setting the whole reply on every token redrew it all each time
  // (a 15000-token reply took the page 2.7x the server's time, and its tok/s read low).
  let shownReply = 0, shownReasoning = 0, frame = null;
  const draw = () => {
    frame = null;
    if (!current()) return;
    if (reasoning.length > shownReasoning && thinking) {
      thinking.hidden = false;
      thinking.querySelector(".thought").append(reasoning.slice(shownReasoning));
      shownReasoning = reasoning.length;
    }
    if (reply.length > shownReply) {
      if (thinking && shownReply === 0) thinking.open = false;
      out.append(reply.slice(shownReply));
      shownReply = reply.length;
    }
    $("transcript").scrollTop = $("transcript").scrollHeight;
    if (first !== null) showSpeed((first - start) / 1000, tokens, (last - first) / 1000);
  };
  try {
    const response = await fetch(route, { method: "POST", headers: headers(), body, signal: controller.signal });
    if (!response.ok) throw new Error(await apiError(response));
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") continue;
          const chunk = JSON.parse(data);
          if (chunk.error) throw new Error(chunk.error.message);
          if (chunk.usage) tokens = chunk.usage.completion_tokens;
          const choice = chunk.choices && chunk.choices[0];
          if (!choice) continue;
          if (choice.finish_reason) finish = choice.finish_reason;
          const delta = choice.delta || {};
          const piece = mode === "chat" ? delta.content || "" : choice.text || "";
          const thought = mode === "chat" ? delta.reasoning_content || "" : "";
          if (piece || thought) {  // the first token is the first of either: a thinking model's TTFT
            const now = performance.now();
            if (first === null) first = now;
            last = now;
            tokens += 1;
            reasoning += thought;
            reply += piece;
            if (frame === null) frame = requestAnimationFrame(draw);
          }
        }
      }
    }
    if (frame !== null) cancelAnimationFrame(frame);
    draw();
    if (current()) {
      showSpeed(first === null ? null : (first - start) / 1000, tokens, first === null ? 0 : (last - first) / 1000);
      if (finish === "abort") showError('the server ended this reply early (finish_reason "abort": it is shutting ' +
                                        "down, or it stopped the request)");
    }
  } catch (err) {
    if (frame !== null) cancelAnimationFrame(frame);
    draw();
    if (!current()) { /* cleared or switched: the error belongs to nothing shown */ }
    else if (err.name === "TypeError") showError("the server cannot be reached (" + err.message + "); is it running?");
    else if (err.name !== "AbortError") showError(err.message);
  } finally {
    if (current() && mode === "chat") {
      if (reply || reasoning) state.messages.push({ role: "assistant", content: reply });
      else {  // nothing came back: the turn leaves the transcript as it leaves the history, its text to resend
        state.messages.pop();
        userText.parentElement.remove();
        out.parentElement.remove();
        if (!$("prompt").value) $("prompt").value = text;
      }
    }
    if (state.controller === controller) {  // (not when Clear or a mode switch already let a new one start)
      state.controller = null;
      $("send").disabled = false;
      $("stop").disabled = true;
    }
    loadInfo();
  }
}

$("composer").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("prompt").value;
  if (!text.trim() || state.controller) return;
  let bodyWith;
  try {
    bodyWith = requestJSON();
  } catch (err) {  // a field that is not a number of its kind: said, and nothing sent
    showError(err.message);
    return;
  }
  $("prompt").value = "";
  send(text, bodyWith);
});
$("prompt").addEventListener("keydown", (e) => {
  // (not while an input method composes: its Enter confirms the text)
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); $("composer").requestSubmit(); }
});
$("stop").addEventListener("click", () => state.controller && state.controller.abort());
$("reset").addEventListener("click", clearTranscript);
for (const b of document.querySelectorAll(".mode")) b.addEventListener("click", () => setMode(b.dataset.mode));
$("api-key").value = localStorage.getItem("solo-api-key") || "";
$("api-key").addEventListener("change", () => { localStorage.setItem("solo-api-key", apiKey()); loadInfo(); });
loadInfo();
