// Sends a PNG through the official `openai` npm client, unchanged, as an
// image_url part of a user message and of a tool result, to a daemon serving
// a model with a vision tower, and checks the answers and the usage.
// Usage: node openai_vision.mjs BASE_URL DATA_URL IMAGE_SPAN_TOKENS
import OpenAI from "openai";
import assert from "node:assert/strict";

const [baseURL, dataUrl, spanText] = process.argv.slice(2);
const span = Number(spanText);
const client = new OpenAI({ baseURL, apiKey: "sk-openai-test", maxRetries: 0, timeout: 60000 });
const model = (await client.models.list()).data[0].id;

// 1. a user message with text and an image
const answer = await client.chat.completions.create({
  model, max_tokens: 8, seed: 2,
  messages: [{ role: "user", content: [
    { type: "text", text: "What number is in this picture?" },
    { type: "image_url", image_url: { url: dataUrl, detail: "low" } },
  ] }],
});
assert.equal(answer.choices[0].message.role, "assistant");
assert.ok(["stop", "length"].includes(answer.choices[0].finish_reason));
assert.equal(answer.usage.prompt_tokens_details.image_tokens, span);
assert.ok(answer.usage.prompt_tokens > span);
assert.equal(answer.usage.total_tokens, answer.usage.prompt_tokens + answer.usage.completion_tokens);

// 2. streamed, same request: same text
const stream = await client.chat.completions.create({
  model, max_tokens: 8, seed: 2, stream: true, stream_options: { include_usage: true },
  messages: [{ role: "user", content: [
    { type: "text", text: "What number is in this picture?" },
    { type: "image_url", image_url: { url: dataUrl, detail: "low" } },
  ] }],
});
let text = "", usage = null;
for await (const chunk of stream) {
  if (chunk.choices.length) text += chunk.choices[0].delta.content ?? "";
  if (chunk.usage) usage = chunk.usage;
}
assert.equal(text, answer.choices[0].message.content ?? "");
assert.equal(usage.prompt_tokens_details.image_tokens, span);

// 3. a tool result carrying a screenshot
const tool = await client.chat.completions.create({
  model, max_tokens: 8, seed: 2,
  messages: [
    { role: "user", content: "Take a screenshot and read it." },
    { role: "assistant", content: "", tool_calls: [
      { id: "call_1", type: "function", function: { name: "screenshot", arguments: "{}" } }] },
    { role: "tool", tool_call_id: "call_1", content: [
      { type: "text", text: "screenshot taken" },
      { type: "image_url", image_url: { url: dataUrl } },
    ] },
  ],
  tools: [{ type: "function", function: { name: "screenshot", parameters: { type: "object", properties: {} } } }],
});
assert.equal(tool.usage.prompt_tokens_details.image_tokens, span);

// 4. audio stays a clear 400
await assert.rejects(
  client.chat.completions.create({ model, max_tokens: 4, messages: [{ role: "user", content: [
    { type: "input_audio", input_audio: { data: "AAAA", format: "wav" } }] }] }),
  (e) => e.status === 400 && /audio, video and file parts are not supported/.test(e.message));

console.log("all checks passed");
