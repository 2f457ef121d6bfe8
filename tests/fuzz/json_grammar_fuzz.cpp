// The constrained-decoding grammar. Input: a JSON schema on the first line,
// then the bytes a model might sample. What json_grammar.hpp promises is
// checked on every input:
//   - Feed(b) and CanAccept(b) agree;
//   - after every accepted byte, some byte is acceptable unless Done()
//     (a masked sampler can never get stuck);
//   - a text the grammar calls Done() is JSON that satisfies the schema;
//   - from wherever the sampled bytes stop, choosing the smallest acceptable
//     byte each time finishes the value within a bounded number of bytes.
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_check.hpp"
#include "moeserve/common/json_limits.hpp"
#include "moeserve/engine/json_grammar.hpp"

using namespace moeserve;

namespace {

// Longer texts add little coverage and the per-byte checks cost 256 copies.
constexpr size_t kMaxSampled = 512;
// The default limits bound a value to far fewer bytes than this.
constexpr int kMaxCompletionBytes = 1 << 16;

bool AnyAcceptable(const engine::JsonGrammar& g) {
  for (int b = 0; b < 256; ++b)
    if (g.CanAccept(static_cast<uint8_t>(b))) return true;
  return false;
}

void CheckFinished(const std::string& text, const nlohmann::ordered_json& schema) {
  auto value = ParseJsonBounded(text, JsonLimits{.max_bytes = 1 << 20, .max_depth = kMaxJsonDepth}, "grammar output");
  FUZZ_CHECK(value.has_value(), "Done() but not JSON: " + text);
  FUZZ_CHECK(value->is_object(), "Done() but not an object: " + text);
  auto ok = engine::CheckAgainstSchema(*value, schema);
  FUZZ_CHECK(ok.has_value(), text + " breaks the schema: " + (ok ? "" : ok.error().message()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t newline = input.find('\n');
  if (newline == std::string_view::npos) return 0;
  auto schema = ParseJsonBounded(input.substr(0, newline), JsonLimits{.max_bytes = 1 << 16, .max_depth = 16}, "schema");
  if (!schema) return 0;
  auto grammar = engine::JsonGrammar::ForObjectSchema(*schema);
  if (!grammar) return 0;

  std::string text;
  const std::string_view sampled = input.substr(newline + 1, kMaxSampled);
  for (char c : sampled) {
    const auto byte = static_cast<uint8_t>(c);
    const bool can = grammar->CanAccept(byte);
    const bool fed = grammar->Feed(byte);
    FUZZ_CHECK(can == fed, "CanAccept and Feed disagree after " + text);
    if (!fed) return 0;  // the grammar is now unspecified: stop, as a sampler would never feed it
    text.push_back(c);
    if (grammar->Done()) {
      CheckFinished(text, *schema);
      return 0;
    }
    FUZZ_CHECK(AnyAcceptable(*grammar), "stuck after " + text);
  }

  for (int n = 0; !grammar->Done(); ++n) {
    FUZZ_CHECK(n < kMaxCompletionBytes, "no end in sight after " + text.substr(0, 200));
    int b = 0;
    while (b < 256 && !grammar->CanAccept(static_cast<uint8_t>(b))) ++b;
    FUZZ_CHECK(b < 256, "stuck after " + text);
    FUZZ_CHECK(grammar->Feed(static_cast<uint8_t>(b)), "CanAccept yet Feed refused");
    text.push_back(static_cast<char>(b));
  }
  CheckFinished(text, *schema);
  return 0;
}
