// A Thought-Action-Observation agent loop against moe-daemon, with the
// official `openai` client and one tool, a calculator.
//
//   node examples/agent_loop.mjs --base-url http://127.0.0.1:8000/v1 [--model tiny]
//        [--task "..."] [--turns 3] [--effort low] [--thinking-budget 24] [--api-key KEY] [--seed 1]
//
// Each turn: the model thinks (reasoning_content: Thought), calls the
// calculator (tool_calls: Action), and the tool result goes back into the
// conversation (Observation) with the whole history, reasoning included. The
// last turn asks for the final answer. On a model with random weights (the
// demo's tiny model) the text is noise, but every call is well-formed: the
// daemon constrains tool_choice "required" to the tool's schema.
import OpenAI from "openai";
import { calculate as evaluate } from "../tools/eval/agent_tools.mjs";

function arg(name, fallback) {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 && i + 1 < process.argv.length ? process.argv[i + 1] : fallback;
}

const baseURL = arg("base-url", "http://127.0.0.1:8000/v1");
const model = arg("model", "tiny");
const turns = Number(arg("turns", "3"));
const effort = arg("effort", "low");
const seed = Number(arg("seed", "1"));
// moe-daemon's extension: lowers the tier's reasoning budget for this loop.
const thinkingBudget = Number(arg("thinking-budget", "24"));
const task = arg("task", "What is (17 + 25) * 3? Use the calculator.");
const client = new OpenAI({ baseURL, apiKey: arg("api-key", process.env.OPENAI_API_KEY ?? "none"), maxRetries: 2 });

const tools = [{
  type: "function",
  function: {
    name: "calculator",
    description: "Evaluates an arithmetic expression with + - * / and parentheses",
    parameters: { type: "object", properties: { expression: { type: "string" } }, required: ["expression"] },
  },
}];

// The evaluator the tiny-agent examples and the evaluation share (a small
// recursive-descent parser: no eval() on model output); errors go back to the
// model as the tool's result.
function calculate(expression) {
  try {
    return String(evaluate(expression));
  } catch (e) {
    return `error: ${e.message}`;
  }
}

// Control characters and replacement characters (a random-weight model makes
// many) print as "·" so each turn stays on one readable line.
const show = (text, n = 160) => {
  const clean = [...String(text)].map((ch) => (/[\p{Cc}\uFFFD]/u.test(ch) ? "·" : ch)).join("");
  return JSON.stringify(clean.length > n ? clean.slice(0, n) + "…" : clean);
};
const messages = [
  { role: "system", content: "You are a careful assistant. Think, then use the calculator." },
  { role: "user", content: task },
];
const total = { prompt: 0, completion: 0, reasoning: 0, cached: 0 };

console.log(`agent: ${baseURL} model=${model} effort=${effort}`);
console.log(`task: ${task}`);
for (let turn = 1; turn <= turns + 1; turn++) {
  const last = turn > turns;
  const res = await client.chat.completions.create({
    model, messages, tools, tool_choice: last ? "none" : "required", parallel_tool_calls: false,
    reasoning_effort: effort, thinking_budget: thinkingBudget, max_tokens: last ? 48 : 240, seed: seed + turn, temperature: 0.7,
  });
  const msg = res.choices[0].message;
  const u = res.usage;
  total.prompt += u.prompt_tokens;
  total.completion += u.completion_tokens;
  total.reasoning += u.completion_tokens_details?.reasoning_tokens ?? 0;
  total.cached += u.prompt_tokens_details?.cached_tokens ?? 0;
  console.log(`\n--- turn ${turn} (tier ${res.tier ?? effort}, finish ${res.choices[0].finish_reason}) ---`);
  console.log(`Thought:     ${show(msg.reasoning_content ?? "")}`);
  const assistant = { role: "assistant", content: msg.content ?? "", reasoning_content: msg.reasoning_content ?? "" };
  if (msg.tool_calls?.length) {
    assistant.tool_calls = msg.tool_calls;
    messages.push(assistant);
    for (const call of msg.tool_calls) {
      let expression = "";
      try { expression = JSON.parse(call.function.arguments).expression ?? ""; } catch { expression = call.function.arguments; }
      const observation = calculate(expression);
      console.log(`Action:      ${call.function.name}(${show(expression, 80)})  [${call.id}]`);
      console.log(`Observation: ${show(observation, 80)}`);
      messages.push({ role: "tool", tool_call_id: call.id, content: observation });
    }
  } else {
    messages.push(assistant);
    console.log(`Answer:      ${show(msg.content ?? "")}`);
  }
  console.log(`usage:       prompt ${u.prompt_tokens} (cached ${u.prompt_tokens_details?.cached_tokens ?? 0}), ` +
              `completion ${u.completion_tokens} (reasoning ${u.completion_tokens_details?.reasoning_tokens ?? 0})`);
  if (last) break;
}
console.log(`\ntotal usage: prompt ${total.prompt} (cached ${total.cached}), completion ${total.completion} ` +
            `(reasoning ${total.reasoning}), tier ${effort}`);
