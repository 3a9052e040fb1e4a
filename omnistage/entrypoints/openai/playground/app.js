// The omnistage playground: plain JS over the server's own OpenAI endpoints.
//
// What the model can do comes from GET /v1/models (`output_modalities`,
// `chat_modalities`) and from whether GET /v1/audio/voices answers. Chat streams
// text (SSE); "text and speech" asks chat for a WAV (whole, in the response);
// images come from /v1/images/generations; speech from /v1/audio/speech.
// Errors (OpenAI's shape) are shown in #error; a 401 asks for the API key.
"use strict";

const state = { apiKey: "", models: [], history: [] };
const $ = (id) => document.getElementById(id);

// -- talking to the server -------------------------------------------------------------------
function headers(extra) {
  const h = Object.assign({}, extra || {});
  if (state.apiKey) h["Authorization"] = "Bearer " + state.apiKey;
  return h;
}

// The message of an error body in OpenAI's shape ({"error": {"message": ...}}), else the text.
function errorMessage(status, text) {
  try {
    const body = JSON.parse(text);
    if (body && body.error && body.error.message) return status + ": " + body.error.message;
  } catch (e) { /* not JSON */ }
  return status + ": " + (text || "request failed");
}

async function api(path, options) {
  const opts = Object.assign({}, options || {});
  opts.headers = headers(opts.headers);
  const response = await fetch(path, opts);
  if (response.status === 401) $("key-form").hidden = false;
  if (!response.ok) throw new Error(errorMessage(response.status, await response.text()));
  return response;
}

async function postJSON(path, body) {
  return api(path, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
}

// Each JSON event of a server-sent event stream, as it arrives; an error event throws.
async function* sseEvents(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        const parsed = JSON.parse(data);
        if (parsed.error) throw new Error(errorMessage(parsed.error.code || "error", data));
        yield parsed;
      }
    }
  }
}

// -- what the page shows ---------------------------------------------------------------------
function showError(message) {
  const box = $("error");
  box.textContent = message;
  box.hidden = !message;
}

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = "message " + role;
  const who = document.createElement("b");
  who.textContent = role;
  const body = document.createElement("span");
  body.className = "text";
  body.textContent = text || "";
  div.append(who, " ", body);
  $("transcript").append(div);
  return div;
}

function audioElement(src) {
  const audio = document.createElement("audio");
  audio.controls = true;
  audio.src = src;
  return audio;
}

function showTimings(rows) {
  const body = $("timings").querySelector("tbody");
  body.replaceChildren();
  for (const [name, value] of rows) {
    const tr = document.createElement("tr");
    const th = document.createElement("th");
    th.textContent = name;
    const td = document.createElement("td");
    td.textContent = value;
    tr.append(th, td);
    body.append(tr);
  }
}

const seconds = (ms) => (ms / 1000).toFixed(3) + " s";

// -- per-stage timings from /metrics ----------------------------------------------------------
const HISTOGRAMS = {
  omnistage_time_to_first_token_seconds: "time to first token",
  omnistage_time_to_first_audio_seconds: "time to first audio",
  omnistage_e2e_request_latency_seconds: "request latency",
};

// {"<histogram>|<stage>": {sum, count}} of the histograms above (null: no /metrics).
async function scrapeMetrics() {
  try {
    const text = await (await api("/metrics")).text();
    const out = {};
    const pattern = /^(\w+)_(sum|count)\{stage="([^"]*)"\} (\S+)$/;
    for (const line of text.split("\n")) {
      const m = line.match(pattern);
      if (!m || !(m[1] in HISTOGRAMS)) continue;
      const key = m[1] + "|" + m[3];
      out[key] = out[key] || { sum: 0, count: 0 };
      out[key][m[2]] = parseFloat(m[4]);
    }
    return out;
  } catch (e) {
    return null;
  }
}

// Rows "stage: what" = the mean of the observations made since `before`.
function metricRows(before, after) {
  if (!before || !after) return [["server /metrics", "not available"]];
  const rows = [];
  for (const key of Object.keys(after).sort()) {
    const was = before[key] || { sum: 0, count: 0 };
    const count = after[key].count - was.count;
    if (count <= 0) continue;
    const [name, stage] = key.split("|");
    const mean = ((after[key].sum - was.sum) / count) * 1000;
    rows.push([stage + ": " + HISTOGRAMS[name] + " (server)", seconds(mean)]);
  }
  if (!rows.length) rows.push(["server /metrics", "no per-stage timing for this request"]);
  return rows;
}

// Runs `work(mark)` (mark(name) notes the time since the start) and shows the timings.
async function timed(work) {
  showError("");
  const before = await scrapeMetrics();
  const start = performance.now();
  const marks = [];
  const mark = (name) => marks.push([name, seconds(performance.now() - start)]);
  try {
    await work(mark);
  } catch (e) {
    showError(e.message);
  } finally {
    marks.push(["total (page)", seconds(performance.now() - start)]);
    showTimings(marks.concat(metricRows(before, await scrapeMetrics())));
  }
}

// -- chat ---------------------------------------------------------------------------------------
function samplingFields() {
  const fields = {};
  if ($("max-tokens").value !== "") fields.max_tokens = Number($("max-tokens").value);
  if ($("temperature").value !== "") fields.temperature = Number($("temperature").value);
  return fields;
}

async function streamChat(body, reply, mark) {
  const response = await postJSON("/v1/chat/completions", Object.assign(body, { stream: true }));
  const text = reply.querySelector(".text");
  let first = true;
  for await (const chunk of sseEvents(response)) {
    const delta = chunk.choices.length ? chunk.choices[0].delta : {};
    if (delta.content) {
      if (first) mark("time to first token (page)");
      first = false;
      text.textContent += delta.content;
    }
  }
  return text.textContent;
}

async function speakingChat(body, reply) {
  body.modalities = ["text", "audio"]; // without `audio`: a WAV in the model's default voice
  if ($("voice").value) body.audio = { format: "wav", voice: $("voice").value };
  const answer = await (await postJSON("/v1/chat/completions", body)).json();
  const message = answer.choices[0].message;
  reply.querySelector(".text").textContent = message.content;
  if (message.audio) reply.append(audioElement("data:audio/wav;base64," + message.audio.data));
  return message.content;
}

async function sendChat(event) {
  event.preventDefault();
  const prompt = $("prompt").value;
  const speak = $("mode").value === "speak" && !$("mode-label").hidden;
  addMessage("user", prompt);
  const reply = addMessage("assistant", "");
  const messages = state.history.concat([{ role: "user", content: prompt }]);
  const body = Object.assign({ model: $("model").value, messages }, samplingFields());
  $("send").disabled = true;
  await timed(async (mark) => {
    const text = speak ? await speakingChat(body, reply) : await streamChat(body, reply, mark);
    if (speak) mark("audio and text, whole (page)");
    state.history = messages.concat([{ role: "assistant", content: text }]);
    $("prompt").value = "";
  });
  reply.classList.add("done");
  $("send").disabled = false;
}

// -- speech, images, voices -------------------------------------------------------------------
async function sendSpeech(event) {
  event.preventDefault();
  const body = { model: $("model").value, input: $("speech-input").value, response_format: "wav" };
  if ($("voice").value) body.voice = $("voice").value;
  await timed(async (mark) => {
    const blob = await (await postJSON("/v1/audio/speech", body)).blob();
    mark("audio, whole (page)");
    $("speech-output").replaceChildren(audioElement(URL.createObjectURL(blob)));
  });
}

async function sendImage(event) {
  event.preventDefault();
  const body = { model: $("model").value, prompt: $("image-prompt").value };
  body.response_format = "b64_json";
  if ($("image-size").value) body.size = $("image-size").value;
  if ($("image-steps").value) body.num_inference_steps = Number($("image-steps").value);
  await timed(async (mark) => {
    const answer = await (await postJSON("/v1/images/generations", body)).json();
    mark("image (page)");
    const figures = answer.data.map((item) => {
      const figure = document.createElement("figure");
      const img = document.createElement("img");
      img.src = "data:image/png;base64," + item.b64_json;
      img.alt = item.revised_prompt || body.prompt;
      const caption = document.createElement("figcaption");
      caption.textContent = item.revised_prompt || "";
      figure.append(img, caption);
      return figure;
    });
    $("images").replaceChildren(...figures);
  });
}

async function refreshVoices() {
  const list = (await (await api("/v1/audio/voices")).json()).data;
  const items = list.map((voice) => {
    const li = document.createElement("li");
    li.textContent = voice.id + " " + (voice.name || "") + " (" + voice.seconds + " s)";
    return li;
  });
  $("voice-list").replaceChildren(...items);
  const options = [new Option("default", "")].concat(
    list.map((voice) => new Option(voice.name || voice.id, voice.id)));
  $("voice").replaceChildren(...options);
}

async function uploadVoice(event) {
  event.preventDefault();
  const form = new FormData();
  const file = $("voice-file").files[0];
  if (file) form.append("audio", file);
  form.append("text", $("voice-text").value);
  if ($("voice-name").value) form.append("name", $("voice-name").value);
  showError("");
  try {
    await api("/v1/audio/voices", { method: "POST", body: form });
    await refreshVoices();
  } catch (e) {
    showError(e.message);
  }
}

// -- start: what the selected model can do ------------------------------------------------------
function showModel() {
  const card = state.models.find((m) => m.id === $("model").value) || {};
  const outputs = card.output_modalities || ["text"];
  const chat = card.chat_modalities || ["text"];
  $("capabilities").textContent =
    "in: " + (card.input_modalities || ["text"]).join(", ") + " · out: " + outputs.join(", ");
  $("chat-section").hidden = !chat.includes("text");
  $("mode-label").hidden = !chat.includes("audio");
  $("speech-section").hidden = !outputs.includes("audio");
  $("image-section").hidden = !outputs.includes("image");
}

async function loadVoices() {
  try {
    await refreshVoices();
    $("voices-section").hidden = false;
  } catch (e) {
    $("voices-section").hidden = true; // the server offers no voice upload
  }
}

async function start() {
  showError("");
  try {
    state.models = (await (await api("/v1/models")).json()).data;
  } catch (e) {
    showError(e.message);
    return;
  }
  $("key-form").hidden = !state.apiKey;
  $("model").replaceChildren(...state.models.map((m) => new Option(m.id, m.id)));
  showModel();
  await loadVoices();
  document.body.dataset.ready = "true";
}

function useKey(event) {
  event.preventDefault();
  state.apiKey = $("api-key").value.trim();
  start();
}

$("model").addEventListener("change", showModel);
$("chat-form").addEventListener("submit", sendChat);
$("clear").addEventListener("click", () => {
  state.history = [];
  $("transcript").replaceChildren();
});
$("speech-form").addEventListener("submit", sendSpeech);
$("image-form").addEventListener("submit", sendImage);
$("voice-form").addEventListener("submit", uploadVoice);
$("key-form").addEventListener("submit", useKey);
start();
