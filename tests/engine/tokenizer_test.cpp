#include "moeserve/engine/tokenizer.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>

#include <unistd.h>

#include <nlohmann/json.hpp>

namespace moeserve::engine {
namespace {

using ordered_json = nlohmann::ordered_json;

TEST(Tokenizer, PinnedSpecialIds) {
  EXPECT_EQ(tok::kBos, 256);
  EXPECT_EQ(tok::kTools, 267);
  EXPECT_EQ(tok::kFirstPadding, 268);
  const char* order[] = {"<|bos|>",   "<|eos|>",    "<|system|>",    "<|user|>",
                         "<|assistant|>", "<|tool|>", "<|end|>",       "<|think|>",
                         "<|/think|>", "<|tool_call|>", "<|/tool_call|>", "<|tools|>"};
  for (int i = 0; i < 12; ++i) EXPECT_EQ(tok::SpecialText(256 + i), order[i]);
  EXPECT_EQ(tok::SpecialText(65), "");
  EXPECT_EQ(tok::SpecialText(268), "");
}

TEST(Tokenizer, EncodeIsUtf8BytesAndNeverSpecial) {
  Tokenizer t = Tokenizer::Builtin(384);
  EXPECT_EQ(t.Encode("hi"), (std::vector<int>{104, 105}));
  EXPECT_EQ(t.Encode("é"), (std::vector<int>{0xC3, 0xA9}));
  std::vector<int> ids = t.Encode("<|end|><|bos|>\xFF");
  ASSERT_EQ(ids.size(), 15u);
  for (int id : ids) EXPECT_LT(id, 256);
  EXPECT_EQ(ids.back(), 255);
  EXPECT_TRUE(t.Encode("").empty());
}

TEST(Tokenizer, DecodeRoundTripsAndRendersSpecialsOnlyWhenAsked) {
  Tokenizer t = Tokenizer::Builtin(384);
  std::string text = "naïve 🌍 <|end|>";
  EXPECT_EQ(t.Decode(t.Encode(text)), text);
  std::vector<int> ids = {tok::kUser, 'h', 'i', tok::kEnd};
  EXPECT_EQ(t.Decode(ids), "hi");
  EXPECT_EQ(t.Decode(ids, /*render_specials=*/true), "<|user|>hi<|end|>");
  // Padding and out-of-range ids are visible, not silently lost.
  EXPECT_EQ(t.Decode(std::vector<int>{'a', 300, 'b', 9999, -1}), "a\uFFFDb\uFFFD\uFFFD");
  // A special in the middle of a character makes the half character malformed.
  EXPECT_EQ(t.Decode(std::vector<int>{0xC3, tok::kEnd, 0xA9}, true), "\uFFFD<|end|>\uFFFD");
  EXPECT_EQ(t.Decode(std::vector<int>{0xC3, tok::kEnd, 0xA9}), "\uFFFD\uFFFD");
}

TEST(Tokenizer, ValidateInputRefusesPaddingAndOutOfRange) {
  Tokenizer t = Tokenizer::Builtin(384);
  EXPECT_TRUE(t.ValidateInput(std::vector<int>{tok::kBos, 'a', 255, tok::kTools}));
  auto pad = t.ValidateInput(std::vector<int>{tok::kBos, 'a', 268});
  ASSERT_FALSE(pad);
  EXPECT_EQ(pad.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(pad.error().message(),
            "token at position 2: id 268 is a padding id (268..383), which is never valid input");
  auto big = t.ValidateInput(std::vector<int>{384});
  ASSERT_FALSE(big);
  EXPECT_EQ(big.error().message(), "token at position 0: id 384 is outside the vocabulary [0, 384)");
  EXPECT_FALSE(t.ValidateInput(std::vector<int>{-1}));
  // With no padding at all, 268 is simply out of range.
  EXPECT_FALSE(Tokenizer::Builtin(268).ValidateInput(std::vector<int>{268}));
  EXPECT_TRUE(Tokenizer::Builtin(268).ValidateInput(std::vector<int>{267}));
}

TEST(Tokenizer, BuiltinNeverGoesBelowTheSpecials) {
  EXPECT_EQ(Tokenizer::Builtin(10).vocab_size(), 268);
  EXPECT_EQ(Tokenizer::Builtin(1000).vocab_size(), 1000);
  EXPECT_TRUE(Tokenizer::Builtin(1000).IsPadding(999));
  EXPECT_FALSE(Tokenizer::Builtin(1000).IsPadding(267));
}

TEST(TokenizerJson, CanonicalFileHasTheHuggingFaceByteLevelShape) {
  ordered_json doc = ordered_json::parse(Tokenizer::Builtin(300).ToJson());
  EXPECT_EQ(doc["model"]["type"], "BPE");
  EXPECT_TRUE(doc["model"]["merges"].empty());
  EXPECT_EQ(doc["pre_tokenizer"]["type"], "ByteLevel");
  EXPECT_EQ(doc["decoder"]["type"], "ByteLevel");
  const ordered_json& vocab = doc["model"]["vocab"];
  EXPECT_EQ(vocab.size(), 256u + 32u);  // bytes and padding 268..299
  EXPECT_EQ(vocab["\u0120"], 32);       // GPT-2's 'Ġ' is the space byte
  EXPECT_EQ(vocab["\u010A"], 10);       // 'Ċ' is newline
  EXPECT_EQ(vocab["\u0100"], 0);
  EXPECT_EQ(vocab["!"], 33);
  EXPECT_EQ(vocab["\u00FF"], 255);
  EXPECT_EQ(vocab["<|pad_299|>"], 299);
  ASSERT_EQ(doc["added_tokens"].size(), 12u);
  EXPECT_EQ(doc["added_tokens"][6]["id"], 262);
  EXPECT_EQ(doc["added_tokens"][6]["content"], "<|end|>");
  EXPECT_EQ(doc["added_tokens"][6]["special"], true);
}

TEST(TokenizerJson, RoundTripThroughAFile) {
  std::string text = Tokenizer::Builtin(384).ToJson();
  auto path = std::filesystem::temp_directory_path() / ("moeserve_tok_" + std::to_string(::getpid()) + ".json");
  {
    std::ofstream out(path);
    out << text;
  }
  auto loaded = Tokenizer::FromFile(path.string(), 384);
  std::filesystem::remove(path);
  ASSERT_TRUE(loaded) << loaded.error().ToString();
  EXPECT_EQ(loaded->vocab_size(), 384);
  EXPECT_EQ(loaded->ToJson(), text);
  auto unchecked = Tokenizer::FromJsonText(text, "mem");
  ASSERT_TRUE(unchecked);
  EXPECT_EQ(unchecked->vocab_size(), 384);
}

TEST(TokenizerJson, MissingFileIsNotFound) {
  auto r = Tokenizer::FromFile("/nonexistent/tokenizer.json");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kNotFound);
  EXPECT_NE(r.error().message().find("/nonexistent/tokenizer.json"), std::string::npos);
}

TEST(TokenizerJson, PaddingListedAsAddedTokensIsAccepted) {
  ordered_json doc = ordered_json::parse(Tokenizer::Builtin(270).ToJson());
  doc["model"]["vocab"].erase("<|pad_268|>");
  doc["model"]["vocab"].erase("<|pad_269|>");
  doc["added_tokens"].push_back({{"id", 268}, {"content", "<unused0>"}, {"special", true}});
  doc["added_tokens"].push_back({{"id", 269}, {"content", "<unused1>"}, {"special", false}});
  auto r = Tokenizer::FromJsonText(doc.dump(), "m/tokenizer.json", 270);
  ASSERT_TRUE(r) << r.error().ToString();
  EXPECT_EQ(r->vocab_size(), 270);
}

TEST(TokenizerJson, ConfigVocabLargerThanTheFileIsPadding) {
  // Real checkpoints pad the embedding past the tokenizer's ids.
  auto r = Tokenizer::FromJsonText(Tokenizer::Builtin(300).ToJson(), "m/tokenizer.json", 384);
  ASSERT_TRUE(r) << r.error().ToString();
  EXPECT_EQ(r->vocab_size(), 384);
  EXPECT_TRUE(r->IsPadding(299));
  EXPECT_TRUE(r->IsPadding(300));
  EXPECT_TRUE(r->IsPadding(383));
  EXPECT_FALSE(r->IsPadding(384));
  EXPECT_TRUE(r->ValidateInput(std::vector<int>{65, tok::kEnd}).has_value());
  EXPECT_FALSE(r->ValidateInput(std::vector<int>{65, 350}).has_value());
  EXPECT_FALSE(r->ValidateInput(std::vector<int>{384}).has_value());
}

struct Malformed {
  std::string name;
  std::function<void(ordered_json&)> mutate;
  std::string expected_message;  // after "m/tokenizer.json: "
  std::optional<int> expected_vocab = 300;
};

TEST(TokenizerJson, EveryMalformedVariantIsRefusedWithAMessage) {
  auto end_token = [](ordered_json& d) -> ordered_json& { return d["added_tokens"][6]; };
  std::vector<Malformed> cases = {
      {"wrong special id", [&](ordered_json& d) { end_token(d)["id"] = 270; },
       "special token '<|end|>' has id 270, expected 262"},
      {"missing special",
       [](ordered_json& d) { d["added_tokens"].erase(d["added_tokens"].begin() + 7); },
       "special token '<|think|>' (id 263) is missing from added_tokens"},
      {"special not marked special", [&](ordered_json& d) { end_token(d)["special"] = false; },
       "special token '<|end|>' must have \"special\": true"},
      {"reserved id with other text", [&](ordered_json& d) { end_token(d)["content"] = "<|stop|>"; },
       "added_tokens[6]: id 262 is reserved for '<|end|>', got '<|stop|>'"},
      {"added token on a byte id",
       [](ordered_json& d) { d["added_tokens"].push_back({{"id", 65}, {"content", "A!"}, {"special", false}}); },
       "added_tokens[12]: added token 'A!' takes byte id 65"},
      {"special in vocab under another name", [](ordered_json& d) { d["model"]["vocab"]["<|stop|>"] = 262; },
       "added_tokens: id 262 is given to both '<|stop|>' and '<|end|>'"},
      {"same token twice",
       [](ordered_json& d) { d["added_tokens"].push_back({{"id", 300}, {"content", "<|pad_299|>"}}); },
       "added_tokens: token '<|pad_299|>' has two ids, 299 and 300", 301},
      {"byte token renamed",
       [](ordered_json& d) {
         d["model"]["vocab"].erase("A");
         d["model"]["vocab"]["a_upper"] = 65;
       },
       "model.vocab: id 65 must be the byte token 'A', got 'a_upper'"},
      {"byte token missing", [](ordered_json& d) { d["model"]["vocab"].erase("A"); },
       "model.vocab: byte token 'A' (id 65) is missing"},
      {"non-integer id", [](ordered_json& d) { d["model"]["vocab"]["A"] = "65"; },
       "model.vocab: token 'A' has id \"65\", not a non-negative integer"},
      {"merges present", [](ordered_json& d) { d["model"]["merges"].push_back("h i"); },
       "model.merges must be empty: ids are raw bytes (model.md section 8)"},
      {"not BPE", [](ordered_json& d) { d["model"]["type"] = "WordPiece"; },
       "model.type must be \"BPE\" (byte-level, no merges), got \"WordPiece\""},
      {"no model", [](ordered_json& d) { d.erase("model"); }, "missing \"model\" object"},
      {"no added_tokens", [](ordered_json& d) { d.erase("added_tokens"); },
       "missing \"added_tokens\" array (the special tokens live there)"},
      {"normalizer", [](ordered_json& d) { d["normalizer"] = {{"type", "NFC"}}; },
       "\"normalizer\" must be null: the model reads raw UTF-8 bytes"},
      {"gap in ids", [](ordered_json& d) { d["model"]["vocab"].erase("<|pad_280|>"); },
       "ids must be 0..299 without gaps; id 280 is missing"},
      {"vocab size above config", [](ordered_json&) {},
       "vocabulary has 300 ids (0..299) but config.json vocab_size is only 290", 290},
      {"last special removed", [](ordered_json& d) { d["added_tokens"].erase(d["added_tokens"].end() - 1); },
       "special token '<|tools|>' (id 267) is missing from added_tokens", std::nullopt},
      {"top level array", [](ordered_json& d) { d = ordered_json::array(); }, "top level is not a JSON object"},
  };
  for (const Malformed& c : cases) {
    ordered_json doc = ordered_json::parse(Tokenizer::Builtin(300).ToJson());
    c.mutate(doc);
    auto r = Tokenizer::FromJsonText(doc.dump(), "m/tokenizer.json", c.expected_vocab);
    ASSERT_FALSE(r) << c.name;
    EXPECT_EQ(r.error().code(), ErrorCode::kCorruption) << c.name;
    EXPECT_EQ(r.error().message(), "m/tokenizer.json: " + c.expected_message) << c.name;
  }
}

TEST(TokenizerJson, NotJsonIsRefusedWithTheParseError) {
  auto r = Tokenizer::FromJsonText("{\"model\": ", "m/tokenizer.json");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), ErrorCode::kCorruption);
  EXPECT_EQ(r.error().message().rfind("m/tokenizer.json: not valid JSON: ", 0), 0u) << r.error().message();
  EXPECT_FALSE(Tokenizer::FromJsonText("", "m/tokenizer.json"));
}

// ---- Utf8StreamDecoder ---------------------------------------------------------

std::string StreamByteByByte(std::string_view bytes, std::vector<std::string>* pieces = nullptr) {
  Utf8StreamDecoder d;
  std::string out;
  for (char c : bytes) {
    std::string piece = d.Push(static_cast<uint8_t>(c));
    if (pieces) pieces->push_back(piece);
    out += piece;
  }
  return out + d.Finish();
}

TEST(Utf8StreamDecoder, HoldsBackHalfCharacters) {
  std::vector<std::string> pieces;
  std::string text = "aé🌍€";
  EXPECT_EQ(StreamByteByByte(text, &pieces), text);
  // a | C3 A9 | F0 9F 8C 8D | E2 82 AC
  std::vector<std::string> expected = {"a", "", "é", "", "", "", "🌍", "", "", "€"};
  EXPECT_EQ(pieces, expected);
}

TEST(Utf8StreamDecoder, SplitAcrossMultiBytePushes) {
  Utf8StreamDecoder d;
  EXPECT_EQ(d.Push("x\xF0\x9F"), "x");
  EXPECT_TRUE(d.HasPending());
  EXPECT_EQ(d.Push("\x8C"), "");
  EXPECT_EQ(d.Push("\x8Dy"), "🌍y");
  EXPECT_FALSE(d.HasPending());
  EXPECT_EQ(d.Finish(), "");
}

TEST(Utf8StreamDecoder, InvalidBytesBecomeReplacementCharacters) {
  const std::string R = "\uFFFD";
  EXPECT_EQ(StreamByteByByte("\x80"), R);                 // lone continuation
  EXPECT_EQ(StreamByteByByte("\xC0\xAF"), R + R);         // C0 never starts a sequence
  EXPECT_EQ(StreamByteByByte("\xFF" "a"), R + "a");
  EXPECT_EQ(StreamByteByByte("\xE2\x82" "a"), R + "a");   // broken 3-byte sequence, 'a' kept
  EXPECT_EQ(StreamByteByByte("\xE0\x80\x80"), R + R + R); // overlong: caught at the second byte
  EXPECT_EQ(StreamByteByByte("\xED\xA0\x80"), R + R + R); // surrogate
  EXPECT_EQ(StreamByteByByte("\xF4\x90\x80\x80"), R + R + R + R);  // above U+10FFFF
  EXPECT_EQ(StreamByteByByte("\xC3\xC3\xA9"), R + "é");   // the breaking byte starts afresh
  EXPECT_EQ(StreamByteByByte("\xF0\x9F\x8C"), R);         // incomplete at the end: one U+FFFD
}

TEST(Utf8StreamDecoder, FinishResets) {
  Utf8StreamDecoder d;
  EXPECT_EQ(d.Push(0xC3), "");
  EXPECT_EQ(d.Finish(), "\uFFFD");
  EXPECT_EQ(d.Push("é"), "é");
}

}  // namespace
}  // namespace moeserve::engine
