// Drives a server-kept session with the official `openai` npm client: the
// session's turn endpoint is a chat-completions base URL
// (BASE/v1/sessions/{id}), so an unchanged client sends only new messages.
// Usage: node session_openai_client.mjs BASE_URL [FAMILY]
// (e.g. http://127.0.0.1:8000; FAMILY moe-dsa-v1, the default, or gpt-oss;
// the served model is named "tiny")
import OpenAI from "openai";
import assert from "node:assert/strict";

const base = process.argv[2];
const family = process.argv[3] ?? "moe-dsa-v1";
const tools = [{
  type: "function",
  function: {
    name: "calculator",
    description: "Evaluates an arithmetic expression",
    parameters: { type: "object", properties: { expression: { type: "string" } }, required: ["expression"] },
  },
}];

const created = await fetch(`${base}/v1/sessions`, {
  method: "POST", headers: { "content-type": "application/json" },
  body: JSON.stringify({ system: "You use the calculator.", tools }),
}).then((r) => r.json());
assert.match(created.id, /^sess_[a-z0-9-]+_[A-Za-z0-9]{24}$/);

const client = new OpenAI({ baseURL: `${base}/v1/sessions/${created.id}`, apiKey: "sk-openai-test", maxRetries: 0, timeout: 60000 });

// 1. a forced call, non-streamed
const first = await client.chat.completions.create({
  model: "tiny", messages: [{ role: "user", content: "What is 6*7?" }], tool_choice: "required",
  parallel_tool_calls: false, max_tokens: 320, seed: 9, thinking_budget: 2,
});
assert.equal(first.choices[0].finish_reason, "tool_calls");
const call = first.choices[0].message.tool_calls[0];
assert.match(call.id, /^call_[A-Za-z0-9]{24}$/);

// 2. the result, streamed, with only the new message; the history is the server's.
// harmony leaves the tools out of a prompt under tool_choice none, so that
// prompt would not extend the cached one: gpt-oss keeps auto.
const stream = await client.chat.completions.create({
  model: "tiny", messages: [{ role: "tool", tool_call_id: call.id, content: "42" }],
  tool_choice: family === "gpt-oss" ? "auto" : "none",
  max_tokens: 10, seed: 1, stream: true, stream_options: { include_usage: true },
});
let content = "", usage = null;
for await (const chunk of stream) {
  if (chunk.usage) usage = chunk.usage;
  for (const c of chunk.choices) content += c.delta.content ?? "";
}
assert.ok(usage.prompt_tokens > first.usage.prompt_tokens, "the history was put in front of the new message");
assert.ok(usage.prompt_tokens_details.cached_tokens > 0, "the history came from the prefix cache");

// 3. the session holds both turns: user, the call, the result, the answer
const session = await fetch(`${base}/v1/sessions/${created.id}`).then((r) => r.json());
const kinds = session.entries.map((e) => `${e.role}/${e.kind}`);
assert.equal(kinds[0], "system/text");
assert.ok(kinds.includes("user/text") && kinds.includes("assistant/tool_call") && kinds.includes("tool/tool_result"), kinds.join(","));
const last = session.entries[session.entries.length - 1];
assert.equal(last.role, "assistant");
if (last.kind === "text") assert.equal(last.content, content);

// 4. errors surface as the client's typed errors
await assert.rejects(
  client.chat.completions.create({ model: "tiny", messages: [{ role: "tool", tool_call_id: "call_x", content: "1" }] }),
  (e) => e.status === 400 && e.code === "invalid_tool_history" && e.param === "messages[0].tool_call_id");
const gone = new OpenAI({ baseURL: `${base}/v1/sessions/sess_local_AAAAAAAAAAAAAAAAAAAAAAAA`, apiKey: "x", maxRetries: 0 });
await assert.rejects(
  gone.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "hi" }] }),
  (e) => e.status === 404 && e.code === "session_not_found");

console.log("openai client on a session: all checks passed");
