// Drives moe-daemon with the official `openai` npm client: non-streamed and
// streamed chat, a forced tool call, the tool-result turn, and usage.
// Usage: node openai_client.mjs BASE_URL (e.g. http://127.0.0.1:8000/v1)
import OpenAI from "openai";
import assert from "node:assert/strict";
import { readStream } from "./stream_text.mjs";

const client = new OpenAI({ baseURL: process.argv[2], apiKey: "sk-openai-test", maxRetries: 0, timeout: 60000 });
const tools = [{
  type: "function",
  function: {
    name: "calculator",
    description: "Evaluates an arithmetic expression",
    parameters: { type: "object", properties: { expression: { type: "string" } }, required: ["expression"] },
  },
}];

function checkUsage(u) {
  assert.ok(u.prompt_tokens > 0);
  assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens);
  assert.equal(typeof u.completion_tokens_details.reasoning_tokens, "number");
  assert.equal(typeof u.prompt_tokens_details.cached_tokens, "number");
}

const models = await client.models.list();
assert.equal(models.data[0].id, "tiny");

// 1. non-streamed
const plain = await client.chat.completions.create({
  model: "tiny", messages: [{ role: "user", content: "Hello" }], max_tokens: 12, seed: 3,
});
assert.equal(plain.object, "chat.completion");
assert.equal(plain.choices[0].message.role, "assistant");
assert.ok(["stop", "length"].includes(plain.choices[0].finish_reason));
checkUsage(plain.usage);

// 2. streamed, with usage; same seed, same text
const stream = await client.chat.completions.create({
  model: "tiny", messages: [{ role: "user", content: "Hello" }], max_tokens: 12, seed: 3,
  stream: true, stream_options: { include_usage: true },
});
const { content, reasoning, finish, usage } = await readStream(stream);
assert.equal(content, plain.choices[0].message.content ?? "");
assert.equal(reasoning, plain.choices[0].message.reasoning_content ?? "");
assert.equal(finish, plain.choices[0].finish_reason);
checkUsage(usage);

// 3. forced tool call, then 4. the tool result turn (the stream helper's
// finalChatCompletion reassembles streamed tool calls too)
const messages = [{ role: "user", content: "What is 6*7?" }];
const forced = await client.chat.completions.create({
  model: "tiny", messages, tools, tool_choice: { type: "function", function: { name: "calculator" } },
  max_tokens: 320, seed: 9, thinking_budget: 2,
});
assert.equal(forced.choices[0].finish_reason, "tool_calls");
const call = forced.choices[0].message.tool_calls[0];
assert.equal(call.function.name, "calculator");
assert.match(call.id, /^call_[A-Za-z0-9]{24}$/);
assert.equal(typeof JSON.parse(call.function.arguments).expression, "string");

const runner = client.beta.chat.completions.stream({
  model: "tiny", messages, tools, tool_choice: { type: "function", function: { name: "calculator" } },
  max_tokens: 320, seed: 9, thinking_budget: 2,
});
const final = await runner.finalChatCompletion();
assert.equal(final.choices[0].message.tool_calls[0].function.arguments, call.function.arguments);
assert.equal(final.choices[0].message.tool_calls[0].id, call.id);

messages.push(forced.choices[0].message);
messages.push({ role: "tool", tool_call_id: call.id, content: "42" });
const answer = await client.chat.completions.create({ model: "tiny", messages, tools, max_tokens: 10, seed: 1 });
checkUsage(answer.usage);
assert.ok(answer.usage.prompt_tokens > forced.usage.prompt_tokens);

// errors surface as the client's typed errors
await assert.rejects(
  client.chat.completions.create({ model: "nope", messages: [{ role: "user", content: "x" }] }),
  (e) => e.status === 404 && e.code === "model_not_found");
await assert.rejects(
  client.chat.completions.create({ model: "tiny", messages: [{ role: "tool", tool_call_id: "call_x", content: "1" }] }),
  (e) => e.status === 400 && e.code === "invalid_tool_history" && e.param === "messages[0].tool_call_id");

console.log("openai client: all checks passed");
