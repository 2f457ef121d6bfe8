// Drives the Responses API (/v1/responses) with the official `openai` npm
// client, unchanged, against a daemon serving the tiny agent model
// (models/tiny-agent): a tool-calling agent loop continued by
// previous_response_id, non-streamed and streamed (client.responses.stream),
// retrieve and delete, a background response polled to its end and one
// cancelled while it runs, and errors as the client's typed errors.
// Usage: node responses_openai_client.mjs BASE_URL (served model "tiny-agent")
import OpenAI from "openai";
import assert from "node:assert/strict";
import { calculate, fmt } from "../../tools/eval/agent_tools.mjs";

const base = process.argv[2];
const model = "tiny-agent";
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: "sk-responses-test", maxRetries: 0, timeout: 60000 });
// The tools the model was trained with, in the Responses shape.
const tools = [
  { type: "function", name: "calculator", parameters: { type: "object", properties: { expression: { type: "string" } } } },
  { type: "function", name: "convert",
    parameters: { type: "object", properties: { value: { type: "number" }, from: { type: "string" }, to: { type: "string" } } } },
  { type: "function", name: "lookup", parameters: { type: "object", properties: { key: { type: "string" } } } },
];
const settings = { model, tools, temperature: 0, max_output_tokens: 192 };

// What the message items say (ResponseStream's final response has no output_text helper).
const textOf = (response) =>
  response.output.filter((o) => o.type === "message").flatMap((o) => o.content).map((c) => c.text).join("");

// The output as the server sent it (ResponseStream adds parsed: null and parsed_arguments: null).
const plain = (output) => JSON.parse(JSON.stringify(output, (k, v) => (k === "parsed" || k === "parsed_arguments" ? undefined : v)));

function checkUsage(usage) {
  assert.ok(usage.input_tokens > 0 && usage.output_tokens > 0, JSON.stringify(usage));
  assert.equal(usage.total_tokens, usage.input_tokens + usage.output_tokens);
  assert.equal(typeof usage.input_tokens_details.cached_tokens, "number");
  assert.equal(typeof usage.output_tokens_details.reasoning_tokens, "number");
}

// The calls of a response, run as the agent would run them.
function callsOf(response) {
  const calls = response.output.filter((o) => o.type === "function_call");
  for (const c of calls) {
    assert.match(c.id, /^fc_[A-Za-z0-9]{24}$/);
    assert.match(c.call_id, /^call_[A-Za-z0-9]{24}$/);
    assert.equal(c.status, "completed");
  }
  return calls;
}

// 1. The agent loop, non-streamed: the question, the call, its result by
// previous_response_id (only the new item is sent), the answer.
const first = await client.responses.create({ ...settings, input: "Could you figure out 182 + 265?" });
assert.equal(first.object, "response");
assert.match(first.id, /^resp_[a-z0-9-]+_[A-Za-z0-9]{24}$/);
assert.equal(first.status, "completed");
checkUsage(first.usage);
const reasoning = first.output.find((o) => o.type === "reasoning");
assert.ok(reasoning && reasoning.summary[0].type === "summary_text" && reasoning.summary[0].text.length > 0,
  JSON.stringify(first.output));
const [call] = callsOf(first);
assert.equal(call.name, "calculator");
const result = fmt(calculate(JSON.parse(call.arguments).expression));
assert.equal(result, "447");
const second = await client.responses.create({
  ...settings, previous_response_id: first.id,
  input: [{ type: "function_call_output", call_id: call.call_id, output: result }],
});
assert.equal(second.previous_response_id, first.id);
assert.equal(callsOf(second).length, 0);
assert.match(second.output_text, /447/, "the answer carries the tool's result");
assert.ok(second.usage.input_tokens > first.usage.input_tokens, "the stored conversation came first");
assert.ok(second.usage.input_tokens_details.cached_tokens > 0, "the stored conversation came from the prefix cache");

// 2. retrieve gives back what create answered.
const again = await client.responses.retrieve(second.id);
assert.equal(again.id, second.id);
assert.equal(again.status, "completed");
assert.deepEqual(again.output, second.output);
assert.deepEqual(again.usage, second.usage);

// 3. The same loop streamed: semantic events, sequence numbers 0, 1, 2, ...,
// and deltas that add up to the final items.
async function streamed(params) {
  const stream = client.responses.stream(params);
  const types = [];
  let sequence = 0, argumentDeltas = "", textDeltas = "", summaryDeltas = "";
  for await (const event of stream) {
    assert.equal(event.sequence_number, sequence++, `event ${event.type} out of order`);
    types.push(event.type);
    if (event.type === "response.function_call_arguments.delta") argumentDeltas += event.delta;
    if (event.type === "response.output_text.delta") textDeltas += event.delta;
    if (event.type === "response.reasoning_summary_text.delta") summaryDeltas += event.delta;
  }
  const final = await stream.finalResponse();
  assert.equal(types[0], "response.created");
  assert.equal(types[1], "response.in_progress");
  assert.equal(types[types.length - 1], "response.completed");
  assert.equal(types.filter((t) => t === "response.output_item.added").length, final.output.length);
  assert.equal(types.filter((t) => t === "response.output_item.done").length, final.output.length);
  assert.equal(argumentDeltas, final.output.filter((o) => o.type === "function_call").map((o) => o.arguments).join(""));
  assert.equal(textDeltas, textOf(final));
  assert.equal(summaryDeltas, final.output.filter((o) => o.type === "reasoning").map((o) => o.summary[0].text).join(""));
  checkUsage(final.usage);
  return { final, types };
}
const s1 = await streamed({ ...settings, input: "Could you figure out 182 + 265?" });
assert.ok(s1.types.includes("response.function_call_arguments.done"), s1.types.join(","));
const [streamedCall] = callsOf(s1.final);
assert.equal(streamedCall.name, "calculator");
const s2 = await streamed({
  ...settings, previous_response_id: s1.final.id,
  input: [{ type: "function_call_output", call_id: streamedCall.call_id, output: fmt(calculate(JSON.parse(streamedCall.arguments).expression)) }],
});
assert.ok(s2.types.includes("response.output_text.done") && s2.types.includes("response.content_part.added"), s2.types.join(","));
assert.match(textOf(s2.final), /447/);
assert.deepEqual((await client.responses.retrieve(s2.final.id)).output, plain(s2.final.output), "the streamed response was stored");

// 4. Errors as the client's typed errors, naming the field.
await assert.rejects(client.responses.create({ model, input: "hi", tools: [{ type: "web_search_preview" }] }),
  (e) => e.status === 400 && e.param === "tools[0].type" && /not supported/.test(e.message));
await assert.rejects(client.responses.create({ model, input: [{ type: "function_call_output", call_id: "call_x", output: "1" }] }),
  (e) => e.status === 400 && e.code === "invalid_tool_history" && e.param === "input[0].call_id");
await assert.rejects(client.responses.create({ model, input: "hi", previous_response_id: "resp_local_AAAAAAAAAAAAAAAAAAAAAAAA" }),
  (e) => e.status === 404 && e.code === "previous_response_not_found");

// 5. Delete: gone for retrieve and for previous_response_id.
await client.responses.del(first.id);
await assert.rejects(client.responses.retrieve(first.id), (e) => e.status === 404);
await assert.rejects(client.responses.create({ ...settings, input: "hi", previous_response_id: first.id }), (e) => e.status === 404);

// 6. A background response: answered at once, polled to its end.
const queued = await client.responses.create({ ...settings, input: "Could you figure out 182 + 265?", background: true });
assert.equal(queued.background, true);
assert.ok(["queued", "in_progress", "completed"].includes(queued.status), queued.status);
let polled = queued;
for (let i = 0; i < 600 && ["queued", "in_progress"].includes(polled.status); i++) {
  await new Promise((r) => setTimeout(r, 50));
  polled = await client.responses.retrieve(queued.id);
}
assert.equal(polled.status, "completed");
assert.equal(callsOf(polled)[0].name, "calculator");
checkUsage(polled.usage);

// 7. A background response cancelled while it runs (a schema that takes
// thousands of tokens to fill); its tokens so far are charged.
const usageBefore = await fetch(`${base}/v1/usage`).then((r) => r.json());
const long = {
  type: "json_schema", name: "numbers", strict: true,
  schema: {
    type: "object", additionalProperties: false, required: ["n"],
    properties: { n: { type: "array", minItems: 60, maxItems: 60,
      items: { type: "array", minItems: 8, maxItems: 8, items: { type: "integer", minimum: 100000, maximum: 999999 } } } },
  },
};
const running = await client.responses.create({ model, input: "Count.", text: { format: long }, max_output_tokens: 3900, background: true });
const cancelled = await client.responses.cancel(running.id);
assert.equal(cancelled.status, "cancelled");
const afterCancel = await client.responses.retrieve(running.id);
assert.equal(afterCancel.status, "cancelled");
// The charge lands when the engine has stopped the sequence.
let charged = false;
for (let i = 0; i < 200 && !charged; i++) {
  const usage = await fetch(`${base}/v1/usage`).then((r) => r.json());
  const requests = (u) => u.data.filter((d) => d.period === "day").reduce((n, d) => n + d.requests, 0);
  charged = requests(usage) > requests(usageBefore);
  if (!charged) await new Promise((r) => setTimeout(r, 50));
}
assert.ok(charged, "the cancelled run was charged");
await assert.rejects(client.responses.cancel(second.id), (e) => e.status === 400);

console.log("openai client on /v1/responses: all checks passed");
