// Sends a PNG through the official `openai` npm client, unchanged, as an
// input_image part of POST /v1/responses, continues the response with
// previous_response_id (the image is replayed from the store, not sent
// again), and checks the usage of both.
// Usage: node responses_openai_vision.mjs BASE_URL DATA_URL IMAGE_SPAN_TOKENS
import OpenAI from "openai";
import assert from "node:assert/strict";

const [baseURL, dataUrl, spanText] = process.argv.slice(2);
const span = Number(spanText);
const client = new OpenAI({ baseURL, apiKey: "sk-openai-test", maxRetries: 0, timeout: 60000 });
const model = (await client.models.list()).data[0].id;

// 1. text only, for the baseline count
const plain = await client.responses.create({
  model, max_output_tokens: 4,
  input: [{ role: "user", content: [{ type: "input_text", text: "What number is in this picture?" }] }],
});
assert.equal(plain.status === "completed" || plain.status === "incomplete", true);

// 2. the same text with the image
const first = await client.responses.create({
  model, max_output_tokens: 4,
  input: [{ role: "user", content: [
    { type: "input_text", text: "What number is in this picture?" },
    { type: "input_image", image_url: dataUrl, detail: "auto" },
  ] }],
});
assert.equal(first.object, "response");
assert.equal(first.usage.input_tokens_details.image_tokens, span);
assert.equal(first.usage.input_tokens, plain.usage.input_tokens + span);
assert.equal(first.usage.total_tokens, first.usage.input_tokens + first.usage.output_tokens);

// 3. continued: the kept image is in the prompt again, and its blocks come from the prefix cache
const second = await client.responses.create({
  model, max_output_tokens: 4, previous_response_id: first.id, input: "And its colour?",
});
assert.equal(second.previous_response_id, first.id);
assert.equal(second.usage.input_tokens_details.image_tokens, span);
assert.ok(second.usage.input_tokens > first.usage.input_tokens);
assert.ok(second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 16,
          JSON.stringify(second.usage));

// 4. streamed with an image in a function_call_output (a screenshot tool)
const stream = await client.responses.create({
  model, max_output_tokens: 4, stream: true,
  tools: [{ type: "function", name: "screenshot", parameters: { type: "object", properties: {} } }],
  input: [
    { role: "user", content: "Take a screenshot and read it." },
    { type: "function_call", call_id: "call_1", name: "screenshot", arguments: "{}" },
    { type: "function_call_output", call_id: "call_1", output: [
      { type: "input_text", text: "screenshot taken" },
      { type: "input_image", image_url: dataUrl, detail: "low" },
    ] },
  ],
});
let done = null;
for await (const event of stream) if (event.type === "response.completed" || event.type === "response.incomplete") done = event.response;
assert.ok(done, "the stream ended without a final response");
assert.equal(done.usage.input_tokens_details.image_tokens, span);

// 5. a file id is refused, naming the field
await assert.rejects(
  client.responses.create({ model, input: [{ role: "user", content: [
    { type: "input_image", file_id: "file-123", detail: "auto" }] }] }),
  (e) => e.status === 400 && e.error?.param === "input[0].content[0].file_id",
);
console.log("all checks passed");
