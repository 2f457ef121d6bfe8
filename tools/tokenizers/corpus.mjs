// A deterministic text corpus for checking tokenizers against each other:
// code, prose in several scripts, CJK, emoji, whitespace runs, digits,
// special-token look-alikes written as plain text, and the corners where
// regex engines and normalizers disagree (decomposed accents, the long s and
// Kelvin sign under (?i:), U+0085 and U+FEFF next to \s, combining marks).
//
//   node tools/tokenizers/corpus.mjs --bytes N [--seed S] > corpus.txt
//
// The same seed and size always give the same bytes, and a smaller size the
// start of a larger one's text; every kind of text appears within the first
// few kilobytes, which is what the CI slice relies on.

const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => (a.startsWith('--') ? [...acc, [a.slice(2), all[i + 1]]] : acc), []),
);
const targetBytes = Number(args.bytes ?? 10_500_000);
let state = Number(args.seed ?? 1) >>> 0;

// mulberry32: small, fast, and the same on every platform.
function random() {
  state = (state + 0x6d2b79f5) >>> 0;
  let t = state;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const int = (n) => Math.floor(random() * n);
const pick = (list) => list[int(list.length)];
const repeat = (n, f) => Array.from({ length: n }, f).join('');
const chars = (s) => Array.from(s);

const english = `the of and to in is was for that with as on by at from his her they we you it
  this which are be have had not but what all were when there can an your one said each she do how their if will up
  about out many then them these so some would make like him into time has look two more write go see number no way
  could people my than first water been call who oil its now find long down day did get come made may part tokenizer
  model server request stream latency throughput expert routing attention gradient kernel cache memory`.split(/\s+/);
const french = `été déjà où garçon français naïve cœur Noël fenêtre hôpital élève château bientôt ça être
  forêt île mûr sœur`.split(/\s+/);
const german = `Straße Grüße Äpfel Öl Übermäßig schön größer Fußgängerübergänge Mädchen Bären`.split(/\s+/);
const cyrillic = `Привет мир быстрый коричневый лис прыгает через ленивую собаку Москва учёный ёжик`.split(/\s+/);
const greek = `Καλημέρα κόσμε αλφάβητο φιλοσοφία ΑΘΗΝΑ σοφία ψυχή`.split(/\s+/);
const arabic = `مرحبا بالعالم اللغة العربية جميلة كتاب مدرسة الحاسوب`.split(/\s+/);
const hebrew = `שלום עולם ספר בית מחשב`.split(/\s+/);
const devanagari = `नमस्ते दुनिया हिन्दी भाषा विद्यालय क्षत्रिय`.split(/\s+/);
const thai = `สวัสดีครับ ภาษาไทย คอมพิวเตอร์ โรงเรียน`.split(/\s+/);
const korean = `안녕하세요 세계 한국어 컴퓨터 학교 토크나이저`.split(/\s+/);
const chinese = chars('的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步完革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持取设始版双历越史商千片容研像找友孩站广改议形委早房音火际则首单据导影失拿网香似斯专石若兵弟谁校读志飞观争究包组造落视济喜离虽坏兴急亚');
const japanese = chars('あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをんアイウエオカキクケコサシスセソタチツテトナニヌネノハヒフヘホマミムメモヤユヨラリルレロワヲンー漢字日本語東京大学');
const emoji = ['🙂', '😀', '🚀', '🔥', '👍🏽', '👨‍👩‍👧‍👦', '🏳️‍🌈', '🇫🇷', '🇯🇵', '❤️', '✅', '🤖', '🧠', '🍣', '∑', '≈', '√', '→', '©', '™'];
const specials = ['<|endoftext|>', '<|startoftext|>', '<|im_start|>', '<|im_end|>', '<|return|>', '<|channel|>',
  '<|start|>', '<|end|>', '<|message|>', '<|call|>', '<|constrain|>', '<|endofprompt|>', '<|reserved_200000|>',
  '<think>', '</think>', '<tool_call>', '</tool_call>', '<|fim_prefix|>', '<|vision_pad|>', '<｜begin▁of▁sentence｜>',
  '<｜end▁of▁sentence｜>', '<｜User｜>', '<｜Assistant｜>', '<｜tool▁sep｜>', '<｜place▁holder▁no▁12｜>', '<|EOT|>',
  '<|endoftext', 'endoftext|>', '<|<|endoftext|>|>', '<|im_start|>user\n'];
const spaces = [' ', '  ', '    ', '\t', '\t\t', '\n', '\n\n', '\r\n', '\r\n\r\n', ' \n ', '\u00a0', '\u3000', '\u2028',
  '\u0085', '\ufeff', '\u200b', '\u2003', ' \t \n', '        '];
const contractions = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'LL", "'D", "'ſ", "'K",
  '’s', "''s", "'x"];
const decomposed = ['e\u0301', 'a\u0308', 'o\u0302', 'n\u0303', 'A\u030a', 'c\u0327', '\u1100\u1161\u11a8', 'i\u0307',
  'ﬁ', 'Ⅻ', '①', 'ｆｕｌｌ', '１２３', '٣٤٥', '۱۲۳', '߁', '𝟘𝟙𝟚', 'Ω', 'Å', 'K'];

function words(list, n, sep = ' ') {
  return repeat(n, (_, i) => (i ? sep : '') + pick(list));
}
function sentence() {
  const w = words(english, 4 + int(14));
  const cap = w[0].toUpperCase() + w.slice(1);
  return cap + pick(['.', '!', '?', ',', ';', ':', '...', ' —', '."', "'s", ' (sic)']) + ' ';
}
function identifier() {
  const parts = repeat(1 + int(3), () => pick(english) + pick(['_', '', '', 'X']));
  return pick([parts, parts.toUpperCase(), 'get' + parts, parts + int(100)]);
}
function code() {
  const indent = pick(['  ', '    ', '\t', '        ']);
  const lines = [];
  const kind = int(4);
  if (kind === 0) {
    lines.push(`def ${identifier()}(${identifier()}, ${identifier()}=${int(1000)}):`);
    for (let i = 0; i < 3 + int(6); i++) lines.push(`${indent}${identifier()} = ${identifier()}[${int(10)}] * ${random().toFixed(3)}  # ${words(english, 3)}`);
    lines.push(`${indent}return {"${identifier()}": ${identifier()}, 'n': 0x${int(65535).toString(16)}}`);
  } else if (kind === 1) {
    lines.push(`static int ${identifier()}(const char* s, size_t n) {`);
    for (let i = 0; i < 3 + int(6); i++) lines.push(`${indent}if (s[${int(9)}] != '\\${pick(['n', 't', '0', 'x41'])}' && n >= ${int(4096)}u) return -${int(9)};`);
    lines.push(`${indent}for (size_t i = 0; i < n; ++i) { /* ${words(english, 4)} */ }\n}`);
  } else if (kind === 2) {
    lines.push(`const ${identifier()} = async (${identifier()}) => {`);
    lines.push(`${indent}const r = await fetch(\`/v1/${identifier()}?q=\${encodeURIComponent(${identifier()})}\`);`);
    lines.push(`${indent}return r.ok ? JSON.parse(await r.text()) : null; // ${pick(french)} ${pick(emoji)}`);
    lines.push('};');
  } else {
    lines.push(`{"model": "${identifier()}", "messages": [{"role": "user", "content": "${words(english, 5)}\\n${pick(specials)}"}],`);
    lines.push(` "max_tokens": ${int(4096)}, "temperature": ${random().toFixed(2)}, "stop": ["\\n\\n", "${pick(specials)}"]}`);
  }
  return lines.join(pick(['\n', '\n', '\r\n'])) + '\n\n';
}
function numbers() {
  return repeat(3 + int(8), () => pick([
    String(int(10)), String(int(1000)), String(int(1e9)), `${int(100)}.${int(1000)}`, `-${int(1e6)}`,
    `${int(10)},${String(int(1000)).padStart(3, '0')},${String(int(1000)).padStart(3, '0')}`, `v${int(9)}.${int(20)}.${int(30)}`,
    `2026-${String(1 + int(12)).padStart(2, '0')}-${String(1 + int(28)).padStart(2, '0')}`, repeat(5 + int(30), () => String(int(10))),
    `${int(100)}%`, `$${int(1e5)}`, `0x${int(1e9).toString(16).toUpperCase()}`, `1e-${int(20)}`,
  ]) + pick([' ', ', ', '\n', '; ', '']));
}
function whitespaceRun() {
  return pick(english) + repeat(1 + int(6), () => pick(spaces)) + pick([pick(english), '', pick(emoji), '\n']);
}
function longRun() {
  const unit = pick([' ', '\n', '\t', '=', '-', '#', '*', 'a', '😀', '中', '.', '0', '\r\n', '¡']);
  return unit.repeat(20 + int(400)) + pick(['x', ' ', '\n', '']);
}
function scripts() {
  const list = pick([french, german, cyrillic, greek, arabic, hebrew, devanagari, thai, korean]);
  return words(list, 3 + int(12), pick([' ', ' ', ', ', '  '])) + pick(['. ', '? ', '\n', '،', '। ', ' ']);
}
function cjk() {
  const list = pick([chinese, japanese]);
  return repeat(5 + int(40), () => pick(list)) + pick(['。', '、', '！', '？', '\n', ' ', '「', '」', '（', ' 2026年', 'AI']);
}
function emojis() {
  return repeat(1 + int(8), () => pick(emoji) + pick(['', '', ' ', '\u200d', pick(english)]));
}
function lookalikes() {
  return pick(english) + pick(['', ' ', '\n']) + pick(specials) + pick(['', ' ', '\n', pick(english), pick(specials)]);
}
function corners() {
  return repeat(1 + int(5), () => pick([
    pick(english) + pick(contractions), pick(english).toUpperCase() + pick(contractions),
    pick(decomposed) + pick(english), ' ' + pick(decomposed), pick(english) + '\u0301\u0302',
    String.fromCodePoint(0x300 + int(0x70)) + pick(english), pick(['', ' ']) + pick(contractions),
    `${pick(english)}/${pick(english)}\n/`, `(${pick(english)})`, `[${int(9)}]`, `"${pick(english)}"`, '...', '!!!',
    '\u00ad' + pick(english), '\u2019' + pick(english),
  ]) + pick([' ', '', '\n', '\t']));
}
function randomCodePoints() {
  // Assigned ranges only: planes with characters of long standing, so every
  // engine's Unicode tables agree on them.
  const ranges = [[0x20, 0x7e], [0xa0, 0x24f], [0x370, 0x3ff], [0x400, 0x4ff], [0x590, 0x5ff], [0x600, 0x6ff],
    [0x900, 0x97f], [0xe00, 0xe5b], [0x1100, 0x11ff], [0x2000, 0x206f], [0x2100, 0x22ff], [0x3000, 0x30ff],
    [0x4e00, 0x9fa5], [0xac00, 0xd7a3], [0xff00, 0xffef], [0x1f300, 0x1f64f], [0x1d400, 0x1d7ff]];
  return repeat(5 + int(40), () => {
    const [lo, hi] = pick(ranges);
    return String.fromCodePoint(lo + int(hi - lo + 1));
  });
}

const makers = [
  () => repeat(2 + int(6), sentence) + '\n', code, numbers, whitespaceRun, longRun, scripts, cjk, emojis,
  lookalikes, corners, randomCodePoints, () => repeat(1 + int(3), sentence) + pick(spaces),
];

const out = [];
let bytes = 0;
let round = 0;
while (bytes < targetBytes) {
  // Every kind once per round, in a fresh order, so any prefix has them all.
  const order = makers.map((m) => [random(), m]).sort((a, b) => a[0] - b[0]);
  for (const [, make] of order) {
    const piece = make() + (round % 7 === 0 ? '\n' : '');
    out.push(piece);
    bytes += Buffer.byteLength(piece);
  }
  round++;
  if (out.length > 4096) {
    process.stdout.write(out.join(''));
    out.length = 0;
  }
}
process.stdout.write(out.join(''));
