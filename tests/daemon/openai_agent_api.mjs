// Drives moe-daemon with the official `openai` npm client through what agent
// frameworks use beyond plain chat: logprobs (JSON and the stream helper's
// reassembly), response_format json_schema through the client's parse helper,
// a strict tool's parsed arguments, and the typed 400 for a strict schema
// with a keyword the server does not enforce.
// Usage: node openai_agent_api.mjs BASE_URL (e.g. http://127.0.0.1:8000/v1)
import OpenAI from "openai";
import assert from "node:assert/strict";
import { assertWeather, weatherSchema } from "./weather_schema.mjs";

const client = new OpenAI({ baseURL: process.argv[2], apiKey: "sk-openai-test", maxRetries: 0, timeout: 60000 });

// 1. logprobs, JSON and streamed (the stream helper assembles them)
const request = {
  model: "tiny", messages: [{ role: "user", content: "Hello" }], max_tokens: 16, seed: 4, thinking_budget: 0,
  logprobs: true, top_logprobs: 2,
};
const plain = await client.chat.completions.create(request);
const content = plain.choices[0].message.content ?? "";
const entries = plain.choices[0].logprobs.content;
assert.ok(Array.isArray(entries));
assert.equal(plain.choices[0].logprobs.refusal, null);
const bytes = entries.flatMap((e) => e.bytes);
assert.ok(entries.length > 0, "the answer has content tokens");
for (const e of entries) {
  assert.equal(typeof e.token, "string");
  assert.ok(e.logprob <= 0);
  assert.equal(e.top_logprobs.length, 2);
  assert.ok(e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob);
}
// The bytes are the content's bytes (the model's invalid UTF-8 becomes U+FFFD in content).
assert.equal(Buffer.from(bytes).toString("utf8"), content);
const runner = client.beta.chat.completions.stream(request);
const final = await runner.finalChatCompletion();
assert.deepEqual(final.choices[0].logprobs.content, entries);
assert.equal(final.choices[0].message.content ?? "", content);

// 2. json_schema through the client's parse helper
const schema = weatherSchema;
const parsed = await client.beta.chat.completions.parse({
  model: "tiny", messages: [{ role: "user", content: "Weather in Paris" }], max_tokens: 120, seed: 6,
  response_format: { type: "json_schema", json_schema: { name: "weather", strict: true, schema } },
});
assert.equal(parsed.choices[0].finish_reason, "stop");
assertWeather(parsed.choices[0].message.parsed);

// 3. a strict tool: the client parses its arguments
const tools = [{ type: "function", function: { name: "get_weather", strict: true, parameters: schema } }];
const called = await client.beta.chat.completions.parse({
  model: "tiny", messages: [{ role: "user", content: "Weather?" }], tools, tool_choice: "required",
  parallel_tool_calls: false, max_tokens: 160, seed: 2, thinking_budget: 0,
});
const args = called.choices[0].message.tool_calls[0].function.parsed_arguments;
assert.ok(["c", "f"].includes(args.unit));

// 4. a strict schema with a keyword not enforced: a typed 400 naming it
await assert.rejects(
  client.chat.completions.create({
    model: "tiny", messages: [{ role: "user", content: "x" }],
    response_format: { type: "json_schema", json_schema: { name: "d", strict: true,
      schema: { type: "object", properties: { when: { type: "string", format: "date-time" } } } } },
  }),
  (e) => e.status === 400 && e.param === "response_format.json_schema.schema" && /format/.test(e.message));
await assert.rejects(
  client.chat.completions.create({ ...request, logprobs: false, top_logprobs: 3 }),
  (e) => e.status === 400 && e.param === "top_logprobs");

console.log("openai agent api: all checks passed");
