// Drives moe-daemon serving a tiny random checkpoint of a family served from
// a published chat template (Qwen3-Next, DeepSeek-V3.2) with the official
// `openai` npm client: non-streamed and streamed chat agree, a
// forced tool call (named, and required through the stream helper) comes
// back as tool_calls with schema-valid arguments, the tool-result turn is
// served, and a json_schema answer parses. The model's text is noise; the
// shapes, the schema and the agreement are what is checked.
// Usage: node openai_template_family.mjs BASE_URL LABEL (e.g. http://127.0.0.1:8000/v1 qwen3-next)
import OpenAI from "openai";
import assert from "node:assert/strict";
import { readStream } from "./stream_text.mjs";

const client = new OpenAI({ baseURL: process.argv[2], apiKey: "sk-openai-test", maxRetries: 0, timeout: 60000 });
const model = (await client.models.list()).data[0].id;
const tools = [{
  type: "function",
  function: {
    name: "get_weather",
    description: "Current weather",
    parameters: {
      type: "object",
      properties: { city: { type: "string", enum: ["Oslo", "Rome"] }, days: { type: "integer", minimum: 1, maximum: 9 } },
      required: ["city", "days"], additionalProperties: false,
    },
  },
}];
function assertWeatherArguments(text) {
  const args = JSON.parse(text);
  assert.ok(["Oslo", "Rome"].includes(args.city), text);
  assert.ok(Number.isInteger(args.days) && args.days >= 1 && args.days <= 9, text);
  assert.deepEqual(Object.keys(args).sort(), ["city", "days"]);
}

const plain = await client.chat.completions.create({
  model, messages: [{ role: "user", content: "Hello" }], max_tokens: 10, seed: 3, reasoning_effort: "low",
});
assert.equal(plain.object, "chat.completion");
assert.equal(plain.choices[0].message.role, "assistant");
assert.ok(["stop", "length"].includes(plain.choices[0].finish_reason));
assert.equal(plain.usage.total_tokens, plain.usage.prompt_tokens + plain.usage.completion_tokens);

const stream = await client.chat.completions.create({
  model, messages: [{ role: "user", content: "Hello" }], max_tokens: 10, seed: 3, reasoning_effort: "low",
  stream: true, stream_options: { include_usage: true },
});
const { content, reasoning, finish, usage } = await readStream(stream);
assert.equal(content, plain.choices[0].message.content ?? "");
assert.equal(reasoning, plain.choices[0].message.reasoning_content ?? "");
assert.equal(finish, plain.choices[0].finish_reason);
assert.deepEqual(usage, plain.usage);

const messages = [{ role: "user", content: "Weather in Oslo?" }];
const named = { type: "function", function: { name: "get_weather" } };
const forced = await client.chat.completions.create({ model, messages, tools, tool_choice: named, max_tokens: 120, seed: 9 });
assert.equal(forced.choices[0].finish_reason, "tool_calls");
const call = forced.choices[0].message.tool_calls[0];
assert.equal(call.type, "function");
assert.equal(call.function.name, "get_weather");
assert.match(call.id, /^call_[A-Za-z0-9]{24}$/);
assertWeatherArguments(call.function.arguments);

// The stream helper reassembles the streamed call into the same message.
const runner = client.beta.chat.completions.stream({ model, messages, tools, tool_choice: named, max_tokens: 120, seed: 9 });
const final = await runner.finalChatCompletion();
assert.equal(final.choices[0].message.tool_calls[0].id, call.id);
assert.equal(final.choices[0].message.tool_calls[0].function.arguments, call.function.arguments);

// tool_choice required, streamed with the raw iterator.
const required = await client.chat.completions.create({
  model, messages, tools, tool_choice: "required", max_tokens: 120, seed: 11, stream: true });
let streamedArgs = "", streamedName = "", streamedFinish = null;
for await (const chunk of required) {
  for (const c of chunk.choices) {
    for (const t of c.delta.tool_calls ?? []) {
      streamedName += t.function?.name ?? "";
      streamedArgs += t.function?.arguments ?? "";
    }
    if (c.finish_reason) streamedFinish = c.finish_reason;
  }
}
assert.equal(streamedFinish, "tool_calls");
assert.equal(streamedName, "get_weather");
assertWeatherArguments(streamedArgs);

// The result goes back and the next turn is served from it.
messages.push(forced.choices[0].message);
messages.push({ role: "tool", tool_call_id: call.id, content: "{\"temp\":-3}" });
const answer = await client.chat.completions.create({ model, messages, tools, max_tokens: 8, seed: 1 });
assert.ok(answer.usage.prompt_tokens > forced.usage.prompt_tokens);
assert.ok(["stop", "length", "tool_calls"].includes(answer.choices[0].finish_reason));

const parsed = await client.beta.chat.completions.parse({
  model, messages: [{ role: "user", content: "A city" }], max_tokens: 80, seed: 6,
  response_format: { type: "json_schema", json_schema: { name: "city", strict: true, schema: {
    type: "object", properties: { city: { type: "string", enum: ["Oslo", "Rome"] } }, required: ["city"],
    additionalProperties: false } } },
});
assert.equal(parsed.choices[0].finish_reason, "stop");
assert.ok(["Oslo", "Rome"].includes(parsed.choices[0].message.parsed.city));

await assert.rejects(
  client.chat.completions.create({ model, messages: [{ role: "user", content: "x" }], tools, tool_choice: { type: "function", function: { name: "nope" } } }),
  (e) => e.status === 400);

console.log(`openai client on ${process.argv[3] ?? "the served model"}: all checks passed`);
