// A byte-at-a-time recogniser for compact JSON that satisfies a JSON schema,
// used to mask tokens during constrained decoding (tool arguments under
// tool_choice required/named, response_format json_object and json_schema).
//
// What is enforced (api.md): `type` (a name or an array of names),
// `properties` (only declared keys, each at most once, in any order),
// `required`, `additionalProperties` (false; a schema or true only on an
// object without `properties`, whose free keys then take values of that
// schema), `items`, `minItems`/`maxItems`, `enum` and `const` (values compared
// as their compact JSON text), `minLength`/`maxLength` (characters),
// `minimum`/`maximum`/`exclusiveMinimum`/`exclusiveMaximum`, `pattern` (the
// subset json_pattern.hpp compiles; not beside min/maxLength), `anyOf`, `allOf`
// with one schema, and `$ref` to "#", "#/$defs/..." or "#/definitions/...".
// A `$ref` may re-enter a definition already being expanded (recursion) at
// most `max_recursion` times along one path; deeper, that branch is closed
// (an optional property or array item is then not offered, and a schema
// that cannot be finished within the bound is refused).
//
// With `strict` every other keyword (pattern, format, oneOf, ...), and
// assertions beside `anyOf`/`$ref`, is an error naming it and where it is, as
// OpenAI refuses schemas its strict mode cannot enforce; without it they are
// ignored (then `anyOf` and `$ref` win over keywords beside them).
//
// Why bounded: with a model that samples badly (random weights in tests, or a
// small model far from its training data) an unbounded grammar may never end.
// So the recogniser only allows output that can always be finished: no
// whitespace, strings of at most `max_string_bytes` (or the bytes a
// `minLength` needs), integers of at most `max_integer_digits` digits (or
// those a `minimum`/`maximum` needs), at most `max_fraction_digits` after a
// point and no exponent, arrays of at most `max_items` elements (or
// `minItems`), free-form objects of at most `max_free_properties` keys and
// nesting of at most `max_depth` where the schema leaves it open. No string
// escapes other than the two-character ones (\" \\ \/ \b \f \n \r \t);
// non-ASCII text must be valid UTF-8. At every point at least one byte (or
// the end) is acceptable, so a masked sampler can never get stuck.
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

namespace moeserve::engine {

struct GrammarLimits {
  int max_string_bytes = 32;
  int max_integer_digits = 6;
  int max_fraction_digits = 4;
  int max_items = 4;
  int max_free_properties = 4;
  int max_depth = 3;
  int max_recursion = 3;  // re-entries of a $ref definition along one path
};

struct SchemaNode;  // json_grammar.cpp

class JsonGrammar {
 public:
  // The value must be a JSON object that satisfies `schema` (tool arguments,
  // json_object, json_schema). Refused (kInvalidArgument, the message naming
  // the keyword and its path): a schema whose type excludes "object", one
  // that cannot be satisfied (minLength above maxLength, no integer in a
  // range, recursion that never ends), and with `strict` any keyword that is
  // not enforced (CheckSchemaSupported).
  static Result<JsonGrammar> ForObjectSchema(const nlohmann::ordered_json& schema, const GrammarLimits& limits = {},
                                             bool strict = false);

  // Consumes one byte. false: the byte is not allowed here, and this grammar
  // is left in an unspecified state (test on a copy, or call CanAccept).
  bool Feed(uint8_t byte);
  bool CanAccept(uint8_t byte) const;
  // A complete value has been read; nothing more is accepted.
  bool Done() const;

  // Inside a string that takes any further text (no pattern, not an object
  // key, not in the middle of an escape or a character): how many more bytes
  // and characters of plain text (bytes from 0x20 up but '"' and '\\', whole
  // UTF-8 characters) it surely takes, the bytes still owed to minLength set
  // aside. Both 0 anywhere else. A shortcut for masks over a vocabulary: a
  // plain token that fits is accepted without feeding it byte by byte.
  struct PlainTextRoom {
    int64_t bytes = 0, chars = 0;
  };
  PlainTextRoom PlainTextRoomNow() const;

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

// Does `value` satisfy `schema` in the keywords JsonGrammar enforces (with
// the same precedence when strict is off)? For tests and for checking
// client-side values; the message names the path.
Status CheckAgainstSchema(const nlohmann::ordered_json& value, const nlohmann::ordered_json& schema,
                          const std::string& path = "$");

// Strict mode's check: every keyword of `schema` (and of its $defs) is one
// JsonGrammar enforces, in a form it enforces, and every $ref resolves. The
// error names the keyword and its path ("$.properties.when.format").
Status CheckSchemaSupported(const nlohmann::ordered_json& schema);

}  // namespace moeserve::engine
