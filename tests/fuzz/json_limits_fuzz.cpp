// ParseJsonBounded, the gate every JSON text from outside passes. Input: one
// byte choosing the depth limit (0-19, so limits are reached by small
// inputs), then the text. Checked against nlohmann's own parser, unbounded:
//   - the bounded parse accepts exactly the texts nlohmann accepts whose
//     depth (CheckJsonDepth on the parsed value) is within the limit, and
//     returns the same value: the scan never miscounts, whatever the strings
//     and escapes hold (one exception: nlohmann ignores what follows a NUL
//     byte, the scan does not, so brackets there may be refused);
//   - a depth violation names a path of exactly max_depth steps.
#include <cstdint>
#include <string_view>

#include "fuzz_check.hpp"
#include "moeserve/common/json_limits.hpp"

using namespace moeserve;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const JsonLimits limits{.max_bytes = 1 << 20, .max_depth = data[0] % 20};
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);

  if (auto v = FindJsonLimitViolation(text, limits); v && v->kind == JsonLimitViolation::Kind::kTooDeep) {
    FUZZ_CHECK(v->path.size() == static_cast<size_t>(limits.max_depth), v->message);
    FUZZ_CHECK(v->offset < text.size() && (text[v->offset] == '{' || text[v->offset] == '['), v->message);
  }

  auto bounded = ParseJsonBounded<nlohmann::json>(text, limits, "fuzz");
  const nlohmann::json full = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (full.is_discarded()) {
    FUZZ_CHECK(!bounded.has_value(), "bounded parse accepted what nlohmann refuses");
    return 0;
  }
  const bool within = CheckJsonDepth(full, limits.max_depth, "fuzz").has_value();
  if (!within) FUZZ_CHECK(!bounded.has_value(), "accepted a text deeper than the limit");
  if (within && !bounded) {
    // nlohmann stops reading at a NUL byte ("1\0[[" parses as 1), while the
    // scan reads every byte: refusing brackets past a NUL is stricter, not wrong.
    const auto v = FindJsonLimitViolation(text, limits);
    const size_t nul = text.find('\0');
    FUZZ_CHECK(v && nul != std::string_view::npos && nul < v->offset,
               "refused a text within the limit: " + bounded.error().message());
  }
  if (bounded) FUZZ_CHECK(*bounded == full, "bounded parse changed the value");
  return 0;
}
