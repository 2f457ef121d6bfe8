// The tiny agent model's three tools, as a client sends them (the same JSON,
// key for key, as tools/train/gen_data.py: the model was trained on exactly
// this rendering), and their implementations.

export const TOOLS = [
  { type: "function", function: { name: "calculator",
    parameters: { type: "object", properties: { expression: { type: "string" } } } } },
  { type: "function", function: { name: "convert",
    parameters: { type: "object", properties: { value: { type: "number" }, from: { type: "string" }, to: { type: "string" } } } } },
  { type: "function", function: { name: "lookup",
    parameters: { type: "object", properties: { key: { type: "string" } } } } },
];

// Arithmetic with + - * / and parentheses; no eval() on model output.
export function calculate(expression) {
  let pos = 0;
  const s = String(expression).replace(/\s+/g, "");
  const peek = () => s[pos];
  function number() {
    const m = /^\d+(\.\d+)?/.exec(s.slice(pos));
    if (!m) throw new Error(`expected a number at ${pos}`);
    pos += m[0].length;
    return Number(m[0]);
  }
  function factor() {
    if (peek() === "-") { pos++; return -factor(); }
    if (peek() === "(") { pos++; const v = sum(); if (peek() !== ")") throw new Error("missing )"); pos++; return v; }
    return number();
  }
  function product() {
    let v = factor();
    while (peek() === "*" || peek() === "/") v = s[pos++] === "*" ? v * factor() : v / factor();
    return v;
  }
  function sum() {
    let v = product();
    while (peek() === "+" || peek() === "-") v = s[pos++] === "+" ? v + product() : v - product();
    return v;
  }
  const v = sum();
  if (pos !== s.length) throw new Error(`unexpected character at ${pos}`);
  return v;
}

// Numbers as the data generator writes them: integers bare, others shortest, 6 decimals at most.
export const fmt = (x) => String(Number.isInteger(x) ? x : Number(x.toFixed(6)));

export function runTool(env, name, argsText) {
  let args;
  try { args = JSON.parse(argsText); } catch { return { ok: false, result: "error: arguments are not JSON" }; }
  if (args === null || typeof args !== "object" || Array.isArray(args)) return { ok: false, result: "error: arguments are not an object" };
  try {
    if (name === "calculator") return { ok: true, args, result: fmt(calculate(args.expression)) };
    if (name === "convert") {
      const v = Number(args.value);
      for (const [a, b, f] of env.units) {
        if (a === args.from && b === args.to) return { ok: true, args, result: fmt(v * f) };
        if (b === args.from && a === args.to) return { ok: true, args, result: fmt(v / f) };
      }
      return { ok: true, args, result: `error: cannot convert ${args.from} to ${args.to}` };
    }
    if (name === "lookup") return { ok: true, args, result: env.table[args.key] ?? `error: no entry ${args.key}` };
  } catch (e) {
    return { ok: true, args, result: `error: ${e.message}` };
  }
  return { ok: false, result: `error: unknown tool ${name}` };
}

