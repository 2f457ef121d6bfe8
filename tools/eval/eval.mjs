// Task accuracy of a served agent model on the held-out tool-use set, through
// moe-daemon's OpenAI API with the official `openai` client, greedy.
//
//   node tools/eval/eval.mjs --base-url http://127.0.0.1:PORT/v1 --model tiny-agent \
//        --data eval.jsonl [--tiers low,medium,high] [--limit N] [--json out.json] [--min-accuracy P]
//        [--extra-body '{"speculative":"auto"}'] [--concurrency N]
//   node tools/eval/eval.mjs --endpoints bf16=http://127.0.0.1:P1/v1,mxfp4=http://127.0.0.1:P2/v1 ...
//
// With --endpoints every variant (a daemon serving one model directory) runs
// the same tasks and the table puts them side by side, tier by tier.
// Each task runs as an agent loop: the user message with the three tools
// (tool_choice auto); every tool call is executed here (calculator, convert,
// lookup in the task's own table) and its result goes back; at most 3 calls.
// A task is correct when (the stated rule):
//   - the calls are the expected tools in the expected order, no more, no fewer;
//   - each call's arguments are valid JSON objects with the right values:
//     calculator's expression evaluates to the expected result, convert's
//     value/from/to and lookup's key equal the expected ones;
//   - the final answer (the content of the last assistant turn) contains the
//     expected value as a whole token: not preceded or followed by a digit,
//     a letter or a point that continues a number.
// The trivial baseline (scored offline by the same rule) calls the first tool,
// calculator, with the first number of the question, and answers with it.
// With --min-accuracy every tier must reach P percent, else exit status 1.
// "Protocol" (a weaker measure) counts tasks whose first step has the right
// form: the expected first tool with arguments that parse as a JSON object,
// or, for a plain question, an answer without a call. With --min-protocol
// every tier must reach that rate.
import fs from "node:fs";
import OpenAI from "openai";

import { calculate, fmt, runTool } from "./agent_tools.mjs";

function arg(name, fallback) {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 && i + 1 < process.argv.length ? process.argv[i + 1] : fallback;
}

const model = arg("model", "tiny-agent");
const endpoints = arg("endpoints", "")
  ? arg("endpoints").split(",").map((e) => { const i = e.indexOf("="); return [e.slice(0, i), e.slice(i + 1)]; })
  : [["model", arg("base-url", "http://127.0.0.1:8000/v1")]];
const tiers = arg("tiers", "low,medium,high").split(",");
const limit = Number(arg("limit", "0"));
const jsonOut = arg("json", "");
const minAccuracy = arg("min-accuracy", "");
const minProtocol = arg("min-protocol", "");
let tasks = fs.readFileSync(arg("data", "eval.jsonl"), "utf8").trim().split("\n").map((l) => JSON.parse(l));
if (limit > 0) tasks = tasks.slice(0, limit);
const apiKey = arg("api-key", process.env.OPENAI_API_KEY ?? "none");
// Fields added to every request's body (moeserve's extensions, e.g.
// '{"speculative":"auto"}').
const extraBody = JSON.parse(arg("extra-body", "{}"));
const concurrency = Number(arg("concurrency", "1"));

function argsMatch(expected, got) {
  if (!got) return false;
  if (expected.name === "calculator") {
    try { return fmt(calculate(got.expression)) === expected.result; } catch { return false; }
  }
  if (expected.name === "convert") {
    return Number(got.value) === expected.arguments.value && got.from === expected.arguments.from && got.to === expected.arguments.to;
  }
  return got.key === expected.arguments.key;
}

export function answerHas(content, value) {
  const esc = value.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
  return new RegExp(`(^|[^0-9A-Za-z.])${esc}($|[^0-9A-Za-z]|\\.(?![0-9]))`).test(content ?? "");
}

function score(task, calls, answer) {
  const want = task.expect.calls;
  if (calls.length !== want.length) return false;
  for (let i = 0; i < want.length; i++) {
    if (calls[i].name !== want[i].name || !argsMatch(want[i], calls[i].args)) return false;
  }
  return answerHas(answer, task.expect.answer);
}

function protocolOk(task, calls) {
  const want = task.expect.calls;
  if (!want.length) return calls.length === 0;
  return calls.length > 0 && calls[0].name === want[0].name && calls[0].args !== null;
}

function baseline(task) {
  const m = /\d+(\.\d+)?/.exec(task.messages[0].content);
  const n = m ? m[0] : "0";
  return score(task, [{ name: "calculator", args: { expression: n } }], n);
}

async function runTask(client, task, tier) {
  const messages = [task.messages[0]];
  const calls = [];
  const usage = { prompt: 0, completion: 0, reasoning: 0 };
  // Every assistant message as it came back, for comparing two runs' outputs
  // byte for byte (tools/eval/same_outputs.py).
  const turns = [];
  let answer = "";
  for (let turn = 0; turn < 4; turn++) {
    let res;
    try {
      res = await client.chat.completions.create({
        model, messages, tools: task.tools, tool_choice: turn < 3 ? "auto" : "none", parallel_tool_calls: false,
        reasoning_effort: tier, temperature: 0, max_tokens: 192, ...extraBody,
      });
    } catch (e) {
      // A request the daemon refuses ends the task as failed; the reason is kept.
      return { correct: false, calls, answer, usage, turns, error: String(e.message ?? e) };
    }
    const msg = res.choices[0].message;
    turns.push({
      finish_reason: res.choices[0].finish_reason, content: msg.content ?? null, reasoning_content: msg.reasoning_content ?? null,
      tool_calls: (msg.tool_calls ?? []).map((c) => ({ id: c.id, name: c.function.name, arguments: c.function.arguments })),
      completion_tokens: res.usage.completion_tokens,
    });
    usage.prompt += res.usage.prompt_tokens;
    usage.completion += res.usage.completion_tokens;
    usage.reasoning += res.usage.completion_tokens_details?.reasoning_tokens ?? 0;
    const assistant = { role: "assistant", content: msg.content ?? "", reasoning_content: msg.reasoning_content ?? "" };
    if (!msg.tool_calls?.length) { answer = msg.content ?? ""; break; }
    assistant.tool_calls = msg.tool_calls;
    messages.push(assistant);
    // A call naming no tool of the request cannot be sent back: the task fails here.
    const names = new Set(task.tools.map((t) => t.function.name));
    const bad = msg.tool_calls.find((c) => !names.has(c.function.name));
    if (bad) {
      calls.push({ name: bad.function.name, args: null, raw: bad.function.arguments, result: "unknown tool" });
      return { correct: false, calls, answer, usage, turns, error: `unknown tool '${bad.function.name}'` };
    }
    for (const call of msg.tool_calls) {
      const out = runTool(task.env, call.function.name, call.function.arguments);
      calls.push({ name: call.function.name, args: out.ok ? out.args : null, raw: call.function.arguments, result: out.result });
      messages.push({ role: "tool", tool_call_id: call.id, content: out.result });
    }
  }
  return { correct: score(task, calls, answer), calls, answer, usage, turns };
}

const kinds = [...new Set(tasks.map((t) => t.kind))];
const table = {};   // table[variant][tier][kind] = {n, ok, protocol}
const details = {};
const t0 = Date.now();
let completionTokens = 0;
for (const [variant, baseURL] of endpoints) {
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 2 });
  table[variant] = {};
  details[variant] = {};
  for (const tier of tiers) {
    table[variant][tier] = {};
    details[variant][tier] = [];
    // --concurrency tasks at a time (each an agent loop of its own); the
    // results are recorded in task order whatever order they finish in.
    const results = new Array(tasks.length);
    let next = 0;
    const worker = async () => {
      while (next < tasks.length) {
        const i = next++;
        results[i] = await runTask(client, tasks[i], tier);
      }
    };
    await Promise.all(Array.from({ length: Math.max(1, concurrency) }, worker));
    tasks.forEach((task, i) => {
      const r = results[i];
      completionTokens += r.usage.completion;
      details[variant][tier].push({ kind: task.kind, question: task.messages[0].content, ...r });
      const row = (table[variant][tier][task.kind] ??= { n: 0, ok: 0, protocol: 0 });
      row.n++;
      if (r.correct) row.ok++;
      if (protocolOk(task, r.calls)) row.protocol++;
    });
  }
}
const base = {};
for (const task of tasks) {
  const row = (base[task.kind] ??= { n: 0, ok: 0 });
  row.n++;
  if (baseline(task)) row.ok++;
}
const pct = (rows) => {
  const n = Object.values(rows).reduce((a, r) => a + r.n, 0);
  const ok = Object.values(rows).reduce((a, r) => a + r.ok, 0);
  return (100 * ok) / Math.max(1, n);
};
const protocolPct = (rows) => (100 * Object.values(rows).reduce((a, r) => a + r.protocol, 0)) /
  Math.max(1, Object.values(rows).reduce((a, r) => a + r.n, 0));
const cell = (r) => (r ? `${((100 * r.ok) / r.n).toFixed(1)}`.padStart(7) : "      -");
const W = Math.max(16, ...endpoints.map(([v]) => v.length + 12));
console.log(`eval: ${tasks.length} tasks x ${tiers.length} tiers x ${endpoints.length} variants, ` +
            `${((Date.now() - t0) / 1000).toFixed(0)} s, ${completionTokens} completion tokens; task accuracy in %`);
console.log(`${"variant / tier".padEnd(W)}${kinds.map((k) => k.padStart(8)).join("")}     all`);
for (const [variant] of endpoints) {
  for (const tier of tiers) {
    const rows = table[variant][tier];
    console.log(`${`${variant} ${tier}`.padEnd(W)}${kinds.map((k) => " " + cell(rows[k])).join("")} ${pct(rows).toFixed(1).padStart(7)}`);
  }
}
console.log(`${"baseline".padEnd(W)}${kinds.map((k) => " " + cell(base[k])).join("")} ${pct(base).toFixed(1).padStart(7)}`);
console.log("first step of the right form (protocol), %:");
for (const [variant] of endpoints) {
  for (const tier of tiers) {
    const rows = table[variant][tier];
    console.log(`${`${variant} ${tier}`.padEnd(W)}${kinds.map((k) => " " + (rows[k] ? ((100 * rows[k].protocol) / rows[k].n).toFixed(1).padStart(7) : "      -")).join("")} ${protocolPct(rows).toFixed(1).padStart(7)}`);
  }
}
const summary = {
  model, tasks: tasks.length, seconds: (Date.now() - t0) / 1000, completion_tokens: completionTokens,
  accuracy: Object.fromEntries(endpoints.map(([v]) => [v, Object.fromEntries(tiers.map((t) => [t, pct(table[v][t])]))])),
  protocol: Object.fromEntries(endpoints.map(([v]) => [v, Object.fromEntries(tiers.map((t) => [t, protocolPct(table[v][t])]))])),
  per_kind: table, baseline: pct(base), baseline_per_kind: base,
};
if (jsonOut) fs.writeFileSync(jsonOut, JSON.stringify({ summary, details }, null, 1));
let failed = false;
for (const [variant] of endpoints) {
  for (const [bar, measure, what] of [[minProtocol, protocolPct, "protocol"], [minAccuracy, pct, "task accuracy"]]) {
    if (bar === "") continue;
    const failing = tiers.filter((t) => measure(table[variant][t]) < Number(bar));
    if (failing.length) {
      console.error(`eval: ${variant}: ${what} below ${bar}% on ${failing.join(", ")}`);
      failed = true;
    }
  }
}
// --max-gap P: every tier of every other variant within P points of the first variant's.
const maxGap = arg("max-gap", "");
if (maxGap !== "" && endpoints.length > 1) {
  const [ref] = endpoints[0];
  for (const [variant] of endpoints.slice(1)) {
    for (const tier of tiers) {
      const gap = pct(table[ref][tier]) - pct(table[variant][tier]);
      if (gap > Number(maxGap)) {
        console.error(`eval: ${variant} ${tier} is ${gap.toFixed(1)} points below ${ref}`);
        failed = true;
      }
    }
  }
}
if (failed) process.exit(1);
