// Encodes a corpus with moe-tokenize and with the reference tokenizers
// (oracles.mjs) for gpt-oss, DeepSeek-V3 and Qwen3, and requires identical ids.
//
//   node tools/tokenizers/compare.mjs --moe-tokenize BUILD/engine/moe-tokenize \
//        [--bytes N | --corpus FILE] [--tokenizers gptoss,deepseek_v3,qwen3] [--no-tiktoken] [--workdir DIR]
//        [--sequential]   (run moe-tokenize and the references one after the other, for timing)
//
// --bytes N generates N bytes with corpus.mjs (seed 1). The ctest
// engine.hf_tokenizer_reference runs a 150 kB slice; the full 10 MB corpus is
// bench/tokenizers/throughput.sh's run, which also prints the speeds.
//
// Both references are JavaScript and differ from the Rust libraries they
// port in two known ways (docs/tokenizers.md), so they read the corpus with
// the characters involved taken out, and engine.hf_tokenizer pins the right
// ids for those cases:
// - (?i:'s|...) folds only ASCII case in both, where Oniguruma (the Rust
//   `tokenizers` crate's engine) and Rust's regex (tiktoken's) fold by
//   Unicode: "'\u017f" (long s) is the contraction 's there. U+017F is taken
//   out for both references.
// - js-tiktoken's \s is JavaScript's, which counts U+FEFF as a space and
//   U+0085 not; tiktoken, Oniguruma and @huggingface/tokenizers use Unicode's
//   White_Space. Both are taken out for js-tiktoken.
import { execFileSync, spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { hfEncoder, tiktokenEncoder, tokenizerPath } from './oracles.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const argv = process.argv.slice(2);
const flag = (name) => argv.includes(`--${name}`);
const option = (name, fallback) => {
  const i = argv.indexOf(`--${name}`);
  return i >= 0 ? argv[i + 1] : fallback;
};

const binary = option('moe-tokenize');
if (!binary) {
  console.error('usage: compare.mjs --moe-tokenize PATH [--bytes N | --corpus FILE] [--tokenizers a,b] [--no-tiktoken]');
  process.exit(2);
}
const workdir = option('workdir', fs.mkdtempSync(path.join(process.env.TMPDIR ?? os.tmpdir(), 'tokcmp-')));
fs.mkdirSync(workdir, { recursive: true });
const names = option('tokenizers', 'gptoss,deepseek_v3,qwen3').split(',');

let corpusPath = option('corpus');
if (!corpusPath) {
  corpusPath = path.join(workdir, 'corpus.txt');
  const bytes = option('bytes', '150000');
  fs.writeFileSync(corpusPath, execFileSync('node', [path.join(here, 'corpus.mjs'), '--bytes', bytes, '--seed', '1'], {
    maxBuffer: 1 << 30,
  }));
}
const text = fs.readFileSync(corpusPath, 'utf8').replace(/\u017f/g, '');
const megabytes = Buffer.byteLength(text) / 1e6;
const hfPath = path.join(workdir, 'corpus-hf.txt');
fs.writeFileSync(hfPath, text);
const tiktokenPath = path.join(workdir, 'corpus-tiktoken.txt');
const tiktokenText = text.replace(/[\u0085\ufeff]/g, '');
fs.writeFileSync(tiktokenPath, tiktokenText);

// moe-tokenize runs in the background while the JavaScript encoders run here.
function runMoeTokenize(tokenizer, files) {
  return new Promise((resolve, reject) => {
    const child = spawn(binary, ['--tokenizer', tokenizer, ...files, '--time']);
    const out = [];
    let err = '';
    child.stdout.on('data', (d) => out.push(d));
    child.stderr.on('data', (d) => (err += d));
    child.on('close', (code) => {
      if (code !== 0) return reject(new Error(`moe-tokenize exited ${code}: ${err}`));
      const lines = Buffer.concat(out).toString().trimEnd().split('\n');
      const speeds = [...err.matchAll(/([\d.]+) MB\/s/g)].map((m) => Number(m[1]));
      resolve({ ids: lines.map((l) => (l ? l.split(',').map(Number) : [])), speeds });
    });
  });
}

function timed(f) {
  const start = process.hrtime.bigint();
  const result = f();
  return [result, Number(process.hrtime.bigint() - start) / 1e9];
}

// The first difference, with the characters around it, so a failure says what text it was.
function describeDifference(ours, theirs, tokenText) {
  let i = 0;
  while (i < ours.length && i < theirs.length && ours[i] === theirs[i]) i++;
  const show = (ids) => JSON.stringify(ids.slice(Math.max(0, i - 3), i + 5).map((id) => [id, tokenText(id)]));
  return `first difference at id ${i} of ${ours.length} (reference has ${theirs.length})\n` +
    `  moe-tokenize: ${show(ours)}\n  reference:    ${show(theirs)}`;
}

let passed = 0;
let failed = 0;
const report = (ok, what, detail) => {
  if (ok) passed++;
  else failed++;
  console.log(`${ok ? 'ok  ' : 'FAIL'} ${what}${detail ? `\n${detail}` : ''}`);
};

for (const name of names) {
  const file = tokenizerPath(name);
  const withTiktoken = name === 'gptoss' && !flag('no-tiktoken');
  const ours = runMoeTokenize(file, withTiktoken ? [hfPath, tiktokenPath] : [hfPath]);
  // For speeds, neither side shares the cores with the other.
  if (flag('sequential')) await ours;
  const json = JSON.parse(fs.readFileSync(file, 'utf8'));
  const vocab = new Map(Object.entries(json.model.vocab).map(([t, id]) => [id, t]));
  for (const t of json.added_tokens) vocab.set(t.id, t.content);
  const tokenText = (id) => vocab.get(id) ?? '?';

  const encode = hfEncoder(file);
  const [hfIds, hfSeconds] = timed(() => encode(text));
  let tiktoken = null;
  if (withTiktoken) {
    const enc = await tiktokenEncoder();
    tiktoken = timed(() => enc(tiktokenText));
  }
  const { ids, speeds } = await ours;
  const same = (a, b) => a.length === b.length && a.every((x, k) => x === b[k]);
  const speed = `moe-tokenize ${speeds[0].toFixed(2)} MB/s, @huggingface/tokenizers ${(megabytes / hfSeconds).toFixed(2)} MB/s`;
  report(same(ids[0], hfIds), `${name}: ${ids[0].length} ids of ${megabytes.toFixed(2)} MB equal @huggingface/tokenizers (${speed})`,
    same(ids[0], hfIds) ? '' : describeDifference(ids[0], hfIds, tokenText));
  if (tiktoken) {
    const [ttIds, ttSeconds] = tiktoken;
    report(same(ids[1], ttIds),
      `${name}: ${ids[1].length} ids equal js-tiktoken o200k_base (moe-tokenize ${speeds[1].toFixed(2)} MB/s, js-tiktoken ${(Buffer.byteLength(tiktokenText) / 1e6 / ttSeconds).toFixed(2)} MB/s)`,
      same(ids[1], ttIds) ? '' : describeDifference(ids[1], ttIds, tokenText));
  }
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
