// Load generator for bench/daemon (Node's fetch keeps connections alive).
//   node load.mjs rps URL CLIENTS SECONDS       requests/s, p50, p99 at max_tokens 1
//   node load.mjs ttft URL PROMPT_TOKENS        TTFT of one long prompt, cold then cached
const [mode, url] = process.argv.slice(2);

async function chat(body) {
  const r = await fetch(url + "/v1/chat/completions", {
    method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body),
  });
  return r;
}

if (mode === "rps") {
  const clients = Number(process.argv[4] ?? 32), seconds = Number(process.argv[5] ?? 10);
  const latencies = [];
  let errors = 0;
  const end = performance.now() + seconds * 1000;
  const body = { messages: [{ role: "user", content: "hi" }], max_tokens: 1, thinking_budget: 0, temperature: 0 };
  await Promise.all(Array.from({ length: clients }, async () => {
    while (performance.now() < end) {
      const t0 = performance.now();
      try {
        const r = await chat(body);
        await r.arrayBuffer();
        if (r.status !== 200) errors++;
      } catch { errors++; }
      latencies.push(performance.now() - t0);
    }
  }));
  latencies.sort((a, b) => a - b);
  const q = (p) => latencies[Math.min(latencies.length - 1, Math.floor(p * latencies.length))].toFixed(2);
  console.log(JSON.stringify({ requests: latencies.length, errors, rps: +(latencies.length / seconds).toFixed(1),
                               p50_ms: +q(0.5), p99_ms: +q(0.99), clients }));
} else if (mode === "ttft") {
  // The agent case the prefix cache serves: turn 2 repeats turn 1's prompt
  // and adds to it. TTFT = until the first event after the role chunk.
  const n = Number(process.argv[4] ?? 2000);
  const system = "x".repeat(n - 20);  // one token per byte, plus the chat format's few
  async function ttft(messages) {
    const t0 = performance.now();
    const r = await chat({ messages, max_tokens: 1, thinking_budget: 0, stream: true, stream_options: { include_usage: true } });
    const reader = r.body.getReader();
    let first = null, text = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      text += Buffer.from(value).toString();
      if (first === null && text.split("\n\n").length > 2) first = performance.now();
    }
    const usage = JSON.parse(text.split("\n\n").filter((e) => e.includes('"usage":{')).pop().slice(6)).usage;
    return { ttft_ms: +(first - t0).toFixed(1), prompt_tokens: usage.prompt_tokens,
             cached_tokens: usage.prompt_tokens_details.cached_tokens };
  }
  const turn1 = [{ role: "system", content: system }, { role: "user", content: "first question" }];
  const cold = await ttft(turn1);
  const cached = await ttft([...turn1, { role: "assistant", content: "a" }, { role: "user", content: "second question" }]);
  console.log(JSON.stringify({ cold, cached }));
}
