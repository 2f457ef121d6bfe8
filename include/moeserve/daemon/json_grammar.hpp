// A byte-at-a-time recogniser for compact JSON that satisfies a JSON schema,
// used to mask tokens during constrained decoding (tool arguments under
// tool_choice required/named, response_format json_object).
//
// What is enforced (api.md): `type` (a name or an array of names), `properties`
// (only declared keys, each at most once, in any order), `required`, `enum`
// (values compared as their compact JSON text) and `items`. Every other keyword
// (minimum, pattern, minItems, additionalProperties, anyOf, $ref, ...) is
// ignored; a schema that declares no properties allows any keys.
//
// Why bounded: with a model that samples badly (random weights in tests, or a
// small model far from its training data) an unbounded grammar may never end.
// So the recogniser only allows output that can always be finished: no
// whitespace, strings of at most `max_string_bytes`, integers of at most
// `max_integer_digits` digits, at most `max_fraction_digits` after a point and
// no exponent, arrays of at most `max_items` elements, free-form objects of at
// most `max_free_properties` keys and nesting of at most `max_depth` where the
// schema leaves it open. No string escapes other than the two-character ones
// (\" \\ \/ \b \f \n \r \t); non-ASCII text must be valid UTF-8. At every
// point at least one byte (or the end) is acceptable, so a masked sampler can
// never get stuck.
//
// Thread safety: a JsonGrammar is a value; copy it to explore (CanAccept
// does). The compiled schema is shared immutably between copies.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moeserve/common/status.hpp"

namespace moeserve::daemon {

struct GrammarLimits {
  int max_string_bytes = 32;
  int max_integer_digits = 6;
  int max_fraction_digits = 4;
  int max_items = 4;
  int max_free_properties = 4;
  int max_depth = 3;
};

struct SchemaNode;  // json_grammar.cpp

class JsonGrammar {
 public:
  // The value must be a JSON object that satisfies `schema` (tool arguments,
  // json_object). A schema whose type excludes "object" is refused.
  static Result<JsonGrammar> ForObjectSchema(const nlohmann::ordered_json& schema, const GrammarLimits& limits = {});

  // Consumes one byte. false: the byte is not allowed here, and this grammar
  // is left in an unspecified state (test on a copy, or call CanAccept).
  bool Feed(uint8_t byte);
  bool CanAccept(uint8_t byte) const;
  // A complete value has been read; nothing more is accepted.
  bool Done() const;

  // Shared pieces, public for the controllers and tests.
  struct Frame;
  ~JsonGrammar();
  JsonGrammar(const JsonGrammar&);
  JsonGrammar& operator=(const JsonGrammar&);
  JsonGrammar(JsonGrammar&&) noexcept;
  JsonGrammar& operator=(JsonGrammar&&) noexcept;

 private:
  JsonGrammar() = default;
  std::shared_ptr<const SchemaNode> root_;
  std::shared_ptr<const GrammarLimits> limits_;
  std::vector<Frame> stack_;
};

// Does `value` satisfy `schema` in the keywords JsonGrammar enforces? For
// tests and for checking client-side values; the message names the path.
Status CheckAgainstSchema(const nlohmann::ordered_json& value, const nlohmann::ordered_json& schema,
                          const std::string& path = "$");

}  // namespace moeserve::daemon
