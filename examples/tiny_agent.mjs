// The tiny agent model (models/tiny-agent) answering a few questions with its
// three tools, through moe-daemon and the official `openai` client.
//
//   node examples/tiny_agent.mjs --base-url http://127.0.0.1:8000/v1 [--model tiny-agent]
//        [--effort medium] [--question "..."]... [--image FILE.png]
//
// --image sends the picture with every question, as an OpenAI image_url part
// (a data: URL), for a model with a vision tower (models/tiny-vision-agent).
//
// Each question is a Thought-Action-Observation loop: the model reasons
// (reasoning_content), calls a tool (tool_calls), the tool runs here and its
// result goes back with the whole history; the loop ends when the model
// answers without a call (at most 3 calls). Greedy decoding.
import fs from "node:fs";
import OpenAI from "openai";

import { TOOLS, runTool } from "../tools/eval/agent_tools.mjs";

function arg(name, fallback) {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 && i + 1 < process.argv.length ? process.argv[i + 1] : fallback;
}

const baseURL = arg("base-url", "http://127.0.0.1:8000/v1");
const model = arg("model", "tiny-agent");
const effort = arg("effort", "medium");
const asked = process.argv.flatMap((a, i) => (a === "--question" && i + 1 < process.argv.length ? [process.argv[i + 1]] : []));
const questions = asked.length ? asked : [
  "What is 128 plus 77?",
  "Convert 3 km to m.",
  "Look up zorbi12.",
  "Convert 5 kg to g, then add 250.",
  "Say hello.",
];
// The lookup tool's table and the conversions it knows.
const env = {
  table: { zorbi12: "640", kamilo7: "23" },
  units: [["km", "m", 1000], ["m", "cm", 100], ["kg", "g", 1000], ["h", "min", 60], ["min", "s", 60], ["l", "ml", 1000]],
};
const image = arg("image", "");
const imageURL = image ? `data:image/png;base64,${fs.readFileSync(image).toString("base64")}` : "";
const client = new OpenAI({ baseURL, apiKey: arg("api-key", process.env.OPENAI_API_KEY ?? "none"), maxRetries: 2 });
const total = { prompt: 0, completion: 0, reasoning: 0, cached: 0 };

console.log(`agent: ${baseURL} model=${model} effort=${effort}`);
for (const question of questions) {
  console.log(`\n=== ${question}${image ? ` [image ${image}]` : ""}`);
  const content = image
    ? [{ type: "text", text: question }, { type: "image_url", image_url: { url: imageURL } }]
    : question;
  const messages = [{ role: "user", content }];
  for (let turn = 0; turn < 4; turn++) {
    const res = await client.chat.completions.create({
      model, messages, tools: TOOLS, tool_choice: turn < 3 ? "auto" : "none", parallel_tool_calls: false,
      reasoning_effort: effort, temperature: 0, max_tokens: 192,
    });
    const msg = res.choices[0].message;
    const u = res.usage;
    total.prompt += u.prompt_tokens;
    total.completion += u.completion_tokens;
    total.reasoning += u.completion_tokens_details?.reasoning_tokens ?? 0;
    total.cached += u.prompt_tokens_details?.cached_tokens ?? 0;
    console.log(`Thought:     ${JSON.stringify(msg.reasoning_content ?? "")}`);
    if (!msg.tool_calls?.length) {
      console.log(`Answer:      ${JSON.stringify(msg.content ?? "")}`);
      break;
    }
    messages.push({ role: "assistant", content: msg.content ?? "", reasoning_content: msg.reasoning_content ?? "", tool_calls: msg.tool_calls });
    for (const call of msg.tool_calls) {
      const out = runTool(env, call.function.name, call.function.arguments);
      console.log(`Action:      ${call.function.name}(${call.function.arguments})  [${call.id}]`);
      console.log(`Observation: ${JSON.stringify(out.result)}`);
      messages.push({ role: "tool", tool_call_id: call.id, content: out.result });
    }
  }
}
console.log(`\ntotal usage: prompt ${total.prompt} (cached ${total.cached}), completion ${total.completion} ` +
            `(reasoning ${total.reasoning}), tier ${effort}`);
