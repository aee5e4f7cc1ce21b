// Solo playground: streams /v1/chat/completions or /v1/completions and shows TTFT, decode tok/s and the
// fraction of the decode roofline (from /playground/info). Plain browser JavaScript, no build step.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { mode: "chat", messages: [], info: null, controller: null, retry: null };

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
    response = await fetch("/playground/info", { headers: headers() });
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

function clearTranscript() { state.messages = []; $("transcript").textContent = ""; showError(""); }

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
  if (tokens > 1 && decodeS > 0) {
    const tps = (tokens - 1) / decodeS;
    $("tps").textContent = tps.toFixed(1) + " tok/s";
    if (state.info && state.info.roofline_tokens_per_s) {
      const frac = tps / state.info.roofline_tokens_per_s;
      $("roofline-pct").textContent = (100 * frac).toFixed(0) + "%";
      $("roofline-bar").style.width = Math.min(100, 100 * frac).toFixed(1) + "%";
    }
  }
}

function sampling() {
  const body = {
    temperature: parseFloat($("temperature").value),
    top_p: parseFloat($("top_p").value),
    max_tokens: parseInt($("max_tokens").value, 10),
    stream: true,
    stream_options: { include_usage: true },
  };
  const seed = $("seed").value.trim();
  if (seed !== "") body.seed = parseInt(seed, 10);
  for (const k of ["temperature", "top_p", "max_tokens"]) if (Number.isNaN(body[k])) delete body[k];
  return body;
}

async function send(text) {
  showError("");
  const body = sampling();
  let route, out, userText = null;
  if (state.mode === "chat") {
    state.messages.push({ role: "user", content: text });
    userText = addMessage("user", text);
    const system = $("system").value.trim();
    body.messages = (system ? [{ role: "system", content: system }] : []).concat(state.messages);
    route = "/v1/chat/completions";
    out = addMessage("assistant", "");
  } else {
    route = "/v1/completions";
    body.prompt = text;
    $("transcript").textContent = "";
    const prompt = addMessage("prompt", text);
    out = document.createElement("span");
    out.className = "text completion";
    prompt.parentElement.append(out);
  }
  state.controller = new AbortController();
  $("send").disabled = true;
  $("stop").disabled = false;
  const start = performance.now();
  let first = null, last = null, tokens = 0, reply = "", reasoning = "";
  const thinking = out.parentElement.querySelector(".thinking");
  try {
    const response = await fetch(route, { method: "POST", headers: headers(), body: JSON.stringify(body),
      signal: state.controller.signal });
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
          const delta = choice.delta || {};
          const piece = state.mode === "chat" ? delta.content || "" : choice.text || "";
          const thought = state.mode === "chat" ? delta.reasoning_content || "" : "";
          if (piece || thought) {  // the first token is the first of either: a thinking model's TTFT
            const now = performance.now();
            if (first === null) first = now;
            last = now;
            tokens += 1;
            if (thought && thinking) {
              reasoning += thought;
              thinking.hidden = false;
              thinking.querySelector(".thought").textContent = reasoning;
            }
            if (piece) {
              if (thinking && !reply) thinking.open = false;
              reply += piece;
              out.textContent = reply;
            }
            $("transcript").scrollTop = $("transcript").scrollHeight;
            showSpeed((first - start) / 1000, tokens, (last - first) / 1000);
          }
        }
      }
    }
    showSpeed(first === null ? null : (first - start) / 1000, tokens, first === null ? 0 : (last - first) / 1000);
  } catch (err) {
    if (err.name === "TypeError") showError("the server cannot be reached (" + err.message + "); is it running?");
    else if (err.name !== "AbortError") showError(err.message);
  } finally {
    if (state.mode === "chat") {
      if (reply || reasoning) state.messages.push({ role: "assistant", content: reply });
      else {  // nothing came back: the turn leaves the transcript as it leaves the history, its text to resend
        state.messages.pop();
        userText.parentElement.remove();
        out.parentElement.remove();
        if (!$("prompt").value) $("prompt").value = text;
      }
    }
    state.controller = null;
    $("send").disabled = false;
    $("stop").disabled = true;
    loadInfo();
  }
}

$("composer").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("prompt").value;
  if (!text.trim() || state.controller) return;
  $("prompt").value = "";
  send(text);
});
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("composer").requestSubmit(); }
});
$("stop").addEventListener("click", () => state.controller && state.controller.abort());
$("reset").addEventListener("click", clearTranscript);
for (const b of document.querySelectorAll(".mode")) b.addEventListener("click", () => setMode(b.dataset.mode));
$("api-key").value = localStorage.getItem("solo-api-key") || "";
$("api-key").addEventListener("change", () => { localStorage.setItem("solo-api-key", apiKey()); loadInfo(); });
loadInfo();
