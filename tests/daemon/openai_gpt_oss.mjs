// Drives moe-daemon serving a tiny random gpt-oss checkpoint with the official
// `openai` npm client: non-streamed and streamed chat agree, a named tool
// call (the server writes its harmony header), the tool-result turn, logprobs,
// a response_format json_schema answer through the parse helper, and typed
// errors. The model's text is noise; the shapes
// and the agreement are what is checked.
// Usage: node openai_gpt_oss.mjs BASE_URL (e.g. http://127.0.0.1:8000/v1)
import OpenAI from "openai";
import assert from "node:assert/strict";
import { readStream } from "./stream_text.mjs";
import { assertWeather, weatherSchema } from "./weather_schema.mjs";

const client = new OpenAI({ baseURL: process.argv[2], apiKey: "sk-openai-test", maxRetries: 0, timeout: 60000 });
const model = (await client.models.list()).data[0].id;
const tools = [{
  type: "function",
  function: {
    name: "get_weather",
    description: "Current weather",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
  },
}];

const plain = await client.chat.completions.create({
  model, messages: [{ role: "user", content: "Hello" }], max_tokens: 6, seed: 3, reasoning_effort: "low",
});
assert.equal(plain.object, "chat.completion");
assert.equal(plain.choices[0].message.role, "assistant");
assert.ok(["stop", "length"].includes(plain.choices[0].finish_reason));
assert.equal(plain.usage.total_tokens, plain.usage.prompt_tokens + plain.usage.completion_tokens);

const stream = await client.chat.completions.create({
  model, messages: [{ role: "user", content: "Hello" }], max_tokens: 6, seed: 3, reasoning_effort: "low",
  stream: true, stream_options: { include_usage: true },
});
const { content, reasoning, finish, usage } = await readStream(stream);
assert.equal(content, plain.choices[0].message.content ?? "");
assert.equal(reasoning, plain.choices[0].message.reasoning_content ?? "");
assert.equal(finish, plain.choices[0].finish_reason);
assert.deepEqual(usage, plain.usage);

const messages = [{ role: "user", content: "Weather in Oslo?" }];
const named = { type: "function", function: { name: "get_weather" } };
const forced = await client.chat.completions.create({ model, messages, tools, tool_choice: named, max_tokens: 5, seed: 9 });
const call = forced.choices[0].message.tool_calls[0];
assert.equal(call.function.name, "get_weather");
assert.match(call.id, /^call_[A-Za-z0-9]{24}$/);

// The stream helper reassembles the streamed call into the same message.
const runner = client.beta.chat.completions.stream({ model, messages, tools, tool_choice: named, max_tokens: 5, seed: 9 });
const final = await runner.finalChatCompletion();
assert.equal(final.choices[0].message.tool_calls[0].id, call.id);
assert.equal(final.choices[0].message.tool_calls[0].function.arguments, call.function.arguments);

messages.push(forced.choices[0].message);
messages.push({ role: "tool", tool_call_id: call.id, content: "{\"c\":3}" });
const answer = await client.chat.completions.create({ model, messages, tools, max_tokens: 4, seed: 1 });
assert.ok(answer.usage.prompt_tokens > forced.usage.prompt_tokens);

// logprobs: the content tokens' (the random model's content is often empty;
// daemon.gpt_oss_logprobs has a scripted model with known content), whose
// bytes join into the content, JSON and streamed alike.
const lpRequest = {
  model, messages: [{ role: "user", content: "Hello" }], max_tokens: 6, seed: 3, reasoning_effort: "low",
  logprobs: true, top_logprobs: 2,
};
const withLp = await client.chat.completions.create(lpRequest);
const lpEntries = withLp.choices[0].logprobs.content;
assert.ok(Array.isArray(lpEntries));
for (const e of lpEntries) assert.equal(e.top_logprobs.length, 2);
assert.equal(Buffer.from(lpEntries.flatMap((e) => e.bytes)).toString("utf8"), withLp.choices[0].message.content ?? "");
const lpFinal = await client.beta.chat.completions.stream(lpRequest).finalChatCompletion();
assert.deepEqual(lpFinal.choices[0].logprobs?.content ?? [], lpEntries);
await assert.rejects(
  client.chat.completions.create({ ...lpRequest, top_logprobs: 21 }),
  (e) => e.status === 400 && e.param === "top_logprobs");
// response_format json_schema (strict, $defs, anyOf) through the client's parse
// helper: the final answer is constrained to the schema; a short thinking
// budget closes the random model's analysis.
const parsed = await client.beta.chat.completions.parse({
  model, messages: [{ role: "user", content: "Weather in Paris" }], max_tokens: 120, seed: 6, thinking_budget: 4,
  response_format: { type: "json_schema", json_schema: { name: "weather", strict: true, schema: weatherSchema } },
});
assert.equal(parsed.choices[0].finish_reason, "stop");
assertWeather(parsed.choices[0].message.parsed);

await assert.rejects(
  client.chat.completions.create({ model: "nope", messages: [{ role: "user", content: "x" }] }),
  (e) => e.status === 404 && e.code === "model_not_found");

console.log("openai client on gpt-oss: all checks passed");
