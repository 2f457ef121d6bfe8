// Reads gpt-oss logprobs with the official `openai` npm client, from
// moe-daemon serving the scripted tiny checkpoint of daemon.gpt_oss_logprobs
// (its answer has known content after a reasoning message): JSON and the
// stream helper's reassembly agree, and the entries' bytes join into the
// content.
// Usage: node openai_gpt_oss_logprobs.mjs BASE_URL MAX_TOKENS THINKING_BUDGET
import OpenAI from "openai";
import assert from "node:assert/strict";

const client = new OpenAI({ baseURL: process.argv[2], apiKey: "sk-openai-test", maxRetries: 0, timeout: 60000 });
const model = (await client.models.list()).data[0].id;
const request = {
  model, messages: [{ role: "user", content: "Say something." }], temperature: 0,
  max_tokens: Number(process.argv[3]), thinking_budget: Number(process.argv[4]), logprobs: true, top_logprobs: 2,
};
const plain = await client.chat.completions.create(request);
const content = plain.choices[0].message.content ?? "";
assert.ok(content.length > 0, "the scripted answer has content");
assert.ok((plain.choices[0].message.reasoning_content ?? "").length > 0, "and reasoning, which has no logprobs");
const entries = plain.choices[0].logprobs.content;
assert.ok(Array.isArray(entries) && entries.length > 0);
assert.equal(plain.choices[0].logprobs.refusal, null);
for (const e of entries) {
  assert.equal(typeof e.token, "string");
  assert.ok(e.logprob <= 0);
  assert.equal(e.top_logprobs.length, 2);
  assert.ok(e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob);
}
assert.equal(Buffer.from(entries.flatMap((e) => e.bytes)).toString("utf8"), content);
assert.ok(entries.some((e) => e.token.includes("\\x")), "a character split across tokens is spelled \\xNN");

const runner = client.beta.chat.completions.stream(request);
const final = await runner.finalChatCompletion();
assert.equal(final.choices[0].message.content ?? "", content);
assert.deepEqual(final.choices[0].logprobs.content, entries);

await assert.rejects(
  client.chat.completions.create({ ...request, top_logprobs: 21 }),
  (e) => e.status === 400 && e.param === "top_logprobs");

console.log("openai client on gpt-oss logprobs: all checks passed");
