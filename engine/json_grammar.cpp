#include "moeserve/engine/json_grammar.hpp"

#include "moeserve/engine/json_pattern.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

namespace moeserve::engine {

using ojson = nlohmann::ordered_json;

namespace {
enum TypeBit : uint32_t {
  kObject = 1, kArray = 2, kString = 4, kInteger = 8, kNumber = 16, kBoolean = 32, kNull = 64,
  kAny = 127,
};

uint32_t TypeBitOf(const std::string& name) {
  if (name == "object") return kObject;
  if (name == "array") return kArray;
  if (name == "string") return kString;
  if (name == "integer") return kInteger;
  if (name == "number") return kNumber | kInteger;
  if (name == "boolean") return kBoolean;
  if (name == "null") return kNull;
  return 0;
}

// The type bits a "type" keyword names (0: absent or names nothing known).
uint32_t TypeBitsOf(const ojson& schema) {
  auto t = schema.find("type");
  if (t == schema.end()) return 0;
  uint32_t bits = 0;
  if (t->is_string()) bits = TypeBitOf(t->get<std::string>());
  else if (t->is_array())
    for (const auto& e : *t)
      if (e.is_string()) bits |= TypeBitOf(e.get<std::string>());
  return bits;
}

uint32_t TypeBitOfValue(const ojson& value) {
  return value.is_object() ? kObject : value.is_array() ? kArray : value.is_string() ? kString
         : value.is_boolean() ? kBoolean : value.is_null() ? kNull
         : value.is_number_float() ? kNumber : kInteger;
}

// A non-negative integer keyword (minLength, maxItems, ...), or `fallback`.
int64_t CountKeyword(const ojson& schema, const char* key, int64_t fallback) {
  auto it = schema.find(key);
  if (it == schema.end() || !it->is_number_integer() || it->get<int64_t>() < 0) return fallback;
  return it->get<int64_t>();
}

std::optional<long double> NumberKeyword(const ojson& schema, const char* key) {
  auto it = schema.find(key);
  if (it == schema.end() || !it->is_number()) return std::nullopt;
  return it->get<long double>();
}

// "#", "#/$defs/Name", "#/definitions/Name" (JSON pointer escapes ~0 ~1).
const ojson* ResolveRef(const ojson& root, const std::string& ref) {
  if (ref == "#") return &root;
  for (const char* container : {"$defs", "definitions"}) {
    const std::string prefix = std::string("#/") + container + "/";
    if (ref.compare(0, prefix.size(), prefix) != 0) continue;
    std::string name;
    for (size_t i = prefix.size(); i < ref.size(); ++i) {
      if (ref[i] == '/') return nullptr;  // nested pointers are not supported
      if (ref[i] == '~' && i + 1 < ref.size() && (ref[i + 1] == '0' || ref[i + 1] == '1')) {
        name += ref[i + 1] == '0' ? '~' : '/';
        ++i;
      } else {
        name += ref[i];
      }
    }
    auto defs = root.find(container);
    if (defs == root.end() || !defs->is_object()) return nullptr;
    auto it = defs->find(name);
    return it == defs->end() ? nullptr : &*it;
  }
  return nullptr;
}

// The pattern the grammar enforces for a string schema: compiled, matched by
// some printable string, and not combined with minLength/maxLength (that
// combination is refused under strict and the pattern ignored otherwise).
std::shared_ptr<const PatternDfa> EnforcedPattern(const ojson& schema) {
  auto p = schema.find("pattern");
  if (p == schema.end() || !p->is_string() || schema.contains("minLength") || schema.contains("maxLength")) return nullptr;
  auto dfa = PatternDfa::Compile(p->get<std::string>());
  return dfa ? *dfa : nullptr;
}

using Int = __int128;

Int Pow10(int n) {
  Int v = 1;
  while (n-- > 0) v *= 10;
  return v;
}

// x * scale rounded inward to an integer (exclusive bounds step past x).
Int ScaledBound(long double x, Int scale, bool lower, bool exclusive) {
  constexpr long double kClamp = 1e30L;
  long double v = std::clamp(x * static_cast<long double>(scale), -kClamp, kClamp);
  long double near = std::round(v);
  if (std::fabs(v - near) <= 1e-9L * std::max(1.0L, std::fabs(v))) {
    Int n = static_cast<Int>(near);
    return exclusive ? (lower ? n + 1 : n - 1) : n;
  }
  return static_cast<Int>(lower ? std::ceil(v) : std::floor(v));
}

int DigitsOf(long double magnitude) {
  int d = 1;
  for (long double p = 10; p <= magnitude && d < 40; p *= 10) ++d;
  return d;
}

}  // namespace

struct SchemaNode {
  uint32_t types = kAny;
  std::vector<std::string> enum_texts;  // compact JSON of each allowed value; empty: no enum
  bool has_properties = false;          // declared properties: only these keys
  std::vector<std::string> property_keys;  // the key as it appears between quotes (JSON-escaped)
  std::vector<std::shared_ptr<SchemaNode>> property_schemas;
  std::vector<bool> property_required;
  std::shared_ptr<SchemaNode> items;       // null: any
  std::shared_ptr<SchemaNode> additional;  // free-key objects: the values' schema (null: any)
  int max_free_keys = -1;                  // free-key objects: -1 the limit
  std::vector<std::shared_ptr<SchemaNode>> any_of;  // non-empty: one of these
  int64_t min_items = 0, max_items = -1;   // -1: the limit
  int64_t min_chars = 0, max_chars = -1;   // strings, in characters
  int max_string_bytes = -1;               // -1: the limit
  std::shared_ptr<const PatternDfa> pattern;  // strings: the pattern enforced
  std::optional<long double> minimum, maximum;
  bool exclusive_minimum = false, exclusive_maximum = false;
  int integer_digits = -1;                 // -1: the limit
  int depth = 0;                           // nesting level, for the free-form limit
  bool impossible = false;                 // no value can be written (a closed recursion)
};

namespace {

constexpr int kMaxStringBytesForMinLength = 4096;
constexpr int kMaxIntegerDigits = 15;

std::shared_ptr<SchemaNode> AnyNode(int depth) {
  auto n = std::make_shared<SchemaNode>();
  n->depth = depth;
  return n;
}

std::shared_ptr<SchemaNode> ImpossibleNode(int depth) {
  auto n = AnyNode(depth);
  n->types = 0;
  n->impossible = true;
  return n;
}

// Compiles a schema into the shared node graph. $ref targets are compiled
// once per recursion level, so a recursive schema is a finite graph.
class Compiler {
 public:
  Compiler(const ojson& root, const GrammarLimits& limits) : root_(root), limits_(limits) { path_.push_back(&root); }

  std::shared_ptr<SchemaNode> Compile(const ojson& schema, int depth, int level, const std::string& where);
  Status error() const { return error_; }

 private:
  void Refuse(const std::string& message) {
    if (error_) error_ = Fail(Error::InvalidArgument(message));
  }
  void CompileScalarBounds(const ojson& schema, SchemaNode& n, const std::string& where);
  void CompileObject(const ojson& schema, SchemaNode& n, int depth, int level, const std::string& where);

  const ojson& root_;
  const GrammarLimits& limits_;
  std::vector<const ojson*> path_;  // $ref targets being expanded
  std::map<std::pair<const ojson*, int>, std::shared_ptr<SchemaNode>> memo_;
  Status error_ = Ok();
};

std::shared_ptr<SchemaNode> Compiler::Compile(const ojson& schema, int depth, int level, const std::string& where) {
  if (schema.is_boolean()) return schema.get<bool>() ? AnyNode(depth) : ImpossibleNode(depth);
  if (!schema.is_object()) return AnyNode(depth);
  if (auto ref = schema.find("$ref"); ref != schema.end() && ref->is_string()) {
    const ojson* target = ResolveRef(root_, ref->get<std::string>());
    if (!target) return AnyNode(depth);  // strict mode refused it before
    const int next = level + (std::find(path_.begin(), path_.end(), target) != path_.end() ? 1 : 0);
    if (next > limits_.max_recursion) return ImpossibleNode(depth);
    auto key = std::make_pair(target, next);
    if (auto it = memo_.find(key); it != memo_.end()) return it->second;
    path_.push_back(target);
    auto n = Compile(*target, depth, next, ref->get<std::string>());
    path_.pop_back();
    memo_[key] = n;
    return n;
  }
  if (auto any = schema.find("anyOf"); any != schema.end() && any->is_array() && !any->empty()) {
    auto n = AnyNode(depth);
    n->types = 0;
    for (size_t i = 0; i < any->size(); ++i) {
      auto alt = Compile((*any)[i], depth, level, where + ".anyOf[" + std::to_string(i) + "]");
      if (alt->impossible) continue;
      n->types |= alt->types;
      n->any_of.push_back(std::move(alt));
    }
    if (n->any_of.empty()) return ImpossibleNode(depth);
    if (n->any_of.size() == 1) return n->any_of[0];
    return n;
  }
  if (auto all = schema.find("allOf"); all != schema.end() && all->is_array() && all->size() == 1) {
    return Compile((*all)[0], depth, level, where + ".allOf[0]");
  }

  auto n = AnyNode(depth);
  if (uint32_t bits = TypeBitsOf(schema); bits != 0) n->types = bits;
  else if (schema.contains("properties")) n->types = kObject;
  else if (schema.contains("items")) n->types = kArray;

  // const wins over enum; values of another type than `type` names are
  // dropped (they could never be valid).
  std::vector<const ojson*> values;
  if (auto c = schema.find("const"); c != schema.end()) values.push_back(&*c);
  else if (auto e = schema.find("enum"); e != schema.end() && e->is_array() && !e->empty())
    for (const auto& v : *e) values.push_back(&v);
  if (!values.empty()) {
    const bool typed = TypeBitsOf(schema) != 0;
    for (const ojson* v : values) {
      uint32_t bit = TypeBitOfValue(*v);
      if (typed && !(n->types & (bit == kNumber ? kNumber : bit))) continue;
      n->enum_texts.push_back(v->dump(-1, ' ', false, ojson::error_handler_t::replace));
    }
    if (n->enum_texts.empty()) {
      Refuse("'" + where + "': no value of 'enum'/'const' has the type 'type' allows");
      return ImpossibleNode(depth);
    }
    return n;
  }

  if (n->types & kObject) CompileObject(schema, *n, depth, level, where);
  if (n->types & kArray) {
    if (auto it = schema.find("items"); it != schema.end() && (it->is_object() || it->is_boolean()))
      n->items = Compile(*it, depth + 1, level, where + ".items");
    n->min_items = CountKeyword(schema, "minItems", 0);
    n->max_items = CountKeyword(schema, "maxItems", -1);
    if (n->max_items >= 0 && n->min_items > n->max_items) {
      Refuse("'" + where + "': minItems is above maxItems");
    } else if (n->min_items > 64) {
      Refuse("'" + where + "': minItems above 64 is not supported");
    }
    if (n->items && n->items->impossible) {
      if (n->min_items > 0) n->types &= ~kArray;
      else n->max_items = 0;
    }
  }
  CompileScalarBounds(schema, *n, where);
  if (n->types == 0) n->impossible = true;
  return n;
}

void Compiler::CompileObject(const ojson& schema, SchemaNode& n, int depth, int level, const std::string& where) {
  std::vector<std::string> required;
  if (auto r = schema.find("required"); r != schema.end() && r->is_array())
    for (const auto& e : *r)
      if (e.is_string() && std::find(required.begin(), required.end(), e.get<std::string>()) == required.end())
        required.push_back(e.get<std::string>());
  bool object_possible = true;
  auto declare = [&](const std::string& key, std::shared_ptr<SchemaNode> value_schema) {
    const bool is_required = std::find(required.begin(), required.end(), key) != required.end();
    if (value_schema->impossible) {
      // Closed by the recursion bound: an optional key is not offered, a
      // required one makes the object impossible.
      if (is_required) object_possible = false;
      return;
    }
    std::string quoted = ojson(key).dump();
    n.property_keys.push_back(quoted.substr(1, quoted.size() - 2));
    n.property_schemas.push_back(std::move(value_schema));
    n.property_required.push_back(is_required);
  };
  const auto p = schema.find("properties");
  const bool declared = p != schema.end() && p->is_object();
  if (declared) {
    n.has_properties = true;
    for (auto it = p->begin(); it != p->end(); ++it)
      declare(it.key(), Compile(it.value(), depth + 1, level, where + ".properties." + it.key()));
  }
  // A required key the schema does not declare (or "required" without
  // "properties") still has to be written, and only declared keys can be:
  // declare it, with any value (or the additionalProperties schema).
  const auto additional = schema.find("additionalProperties");
  std::shared_ptr<SchemaNode> additional_node;
  if (!declared && additional != schema.end() && (additional->is_object() || additional->is_boolean()))
    additional_node = Compile(*additional, depth + 1, level, where + ".additionalProperties");
  for (const auto& key : required) {
    if (declared && p->contains(key)) continue;
    n.has_properties = true;
    declare(key, additional_node ? additional_node : AnyNode(depth + 1));
  }
  if (!n.has_properties && additional_node) {
    if (additional_node->impossible) n.max_free_keys = 0;  // additionalProperties false: {}
    else n.additional = additional_node;
  }
  if (!object_possible) n.types &= ~kObject;
}

void Compiler::CompileScalarBounds(const ojson& schema, SchemaNode& n, const std::string& where) {
  if (n.types & kString) {
    n.min_chars = CountKeyword(schema, "minLength", 0);
    n.max_chars = CountKeyword(schema, "maxLength", -1);
    if (n.max_chars >= 0 && n.min_chars > n.max_chars) Refuse("'" + where + "': minLength is above maxLength");
    if (n.min_chars > kMaxStringBytesForMinLength)
      Refuse("'" + where + "': minLength above " + std::to_string(kMaxStringBytesForMinLength) + " is not supported");
    if (n.min_chars > limits_.max_string_bytes) n.max_string_bytes = static_cast<int>(n.min_chars);
    n.pattern = EnforcedPattern(schema);
    if (n.pattern) {
      const int needed = n.pattern->BytesToAccept(n.pattern->start());
      if (needed > kMaxStringBytesForMinLength) {
        Refuse("'" + where + "': the pattern needs more than " + std::to_string(kMaxStringBytesForMinLength) + " bytes");
      } else if (needed > limits_.max_string_bytes) {
        n.max_string_bytes = needed;
      }
    }
  }
  if (!(n.types & (kInteger | kNumber))) return;
  n.minimum = NumberKeyword(schema, "minimum");
  n.maximum = NumberKeyword(schema, "maximum");
  if (auto x = NumberKeyword(schema, "exclusiveMinimum"); x && (!n.minimum || *x >= *n.minimum)) {
    n.minimum = x;
    n.exclusive_minimum = true;
  }
  if (auto x = NumberKeyword(schema, "exclusiveMaximum"); x && (!n.maximum || *x <= *n.maximum)) {
    n.maximum = x;
    n.exclusive_maximum = true;
  }
  if (!n.minimum && !n.maximum) return;
  // Enough integer digits to reach the range.
  int digits = limits_.max_integer_digits;
  if (n.minimum && *n.minimum > 0) digits = std::max(digits, DigitsOf(*n.minimum));
  if (n.maximum && *n.maximum < 0) digits = std::max(digits, DigitsOf(-*n.maximum));
  n.integer_digits = std::min(digits, kMaxIntegerDigits);
  auto feasible = [&](bool integer_only) {
    const Int scale = integer_only ? 1 : Pow10(limits_.max_fraction_digits);
    const Int top = (Pow10(digits) - 1) * scale + (scale - 1);
    Int lo = n.minimum ? ScaledBound(*n.minimum, scale, true, n.exclusive_minimum) : -top;
    Int hi = n.maximum ? ScaledBound(*n.maximum, scale, false, n.exclusive_maximum) : top;
    return std::max(lo, -top) <= std::min(hi, top);
  };
  if ((n.types & kNumber) && !feasible(false)) n.types &= ~(kNumber | kInteger);
  if ((n.types & kInteger) && !(n.types & kNumber) && !feasible(true)) n.types &= ~kInteger;
  if (!(n.types & (kInteger | kNumber)) && TypeBitsOf(schema) != 0 && !(TypeBitsOf(schema) & ~(kInteger | kNumber)))
    Refuse("'" + where + "': no number satisfies its minimum and maximum");
}

}  // namespace

// One open construct. Which fields matter depends on kind.
struct JsonGrammar::Frame {
  enum Kind : uint8_t { kValue, kObject, kArray, kString, kNumber, kLiteral, kAnyOf } kind = kValue;
  // Object states
  enum ObjState : uint8_t { kObjOpen, kObjKey, kObjColon, kObjValue, kObjAfterValue, kObjKeyStart };
  // String states
  enum StrState : uint8_t { kStrNormal, kStrEscape, kStrUtf8 };
  // Number states
  enum NumState : uint8_t { kNumSign, kNumZero, kNumInt, kNumDot, kNumFrac };

  const SchemaNode* node = nullptr;
  uint8_t state = 0;
  bool is_key = false;          // string frame: an object key (its bytes go to the parent)
  bool integer_only = false;    // number frame
  int count = 0;                // object: keys read; array: items; string: bytes; number: digits
  std::vector<uint8_t> used;    // object: which declared properties were written
  int current_property = -1;    // object: the property whose value is being read
  std::string key;              // object: the key text so far (between the quotes)
  // string: characters so far and the bounds
  int64_t chars = 0, min_chars = 0, max_chars = -1;
  int max_bytes = 0;
  const PatternDfa* pattern = nullptr;  // string with a pattern: its DFA and state
  int pattern_state = 0;
  // string utf-8 continuation state
  uint8_t utf8_needed = 0, utf8_lower = 0x80, utf8_upper = 0xBF;
  // literal: candidate texts and position
  std::vector<const std::string*> candidates;
  size_t pos = 0;
  // number with a range: the digits so far and the scaled bounds
  bool negative = false, ranged = false;
  Int int_value = 0, frac_value = 0, lo = 0, hi = 0;
  // anyOf: one stack per alternative still possible; can_end: one finished
  // with the previous byte
  std::vector<std::vector<Frame>> alternatives;
  bool can_end = false;
};

namespace {

const std::string kTrue = "true", kFalse = "false", kNullText = "null";

using Frame = JsonGrammar::Frame;

enum class StepResult { kConsumed, kConsumedDone, kDoneNotConsumed, kReject };

bool AllRequiredWritten(const Frame& f) {
  if (!f.node->has_properties) return true;
  for (size_t i = 0; i < f.node->property_keys.size(); ++i)
    if (f.node->property_required[i] && !f.used[i]) return false;
  return true;
}

bool AnyKeyAvailable(const Frame& f, const GrammarLimits& lim) {
  if (!f.node->has_properties) return f.count < (f.node->max_free_keys >= 0 ? f.node->max_free_keys : lim.max_free_properties);
  for (uint8_t u : f.used)
    if (!u) return true;
  return false;
}

// Which declared keys the text `key` (+ maybe more) can still become.
bool KeyPrefixPossible(const Frame& f, const std::string& key) {
  for (size_t i = 0; i < f.node->property_keys.size(); ++i)
    if (!f.used[i] && f.node->property_keys[i].compare(0, key.size(), key) == 0) return true;
  return false;
}

int KeyExact(const Frame& f, const std::string& key) {
  for (size_t i = 0; i < f.node->property_keys.size(); ++i)
    if (!f.used[i] && f.node->property_keys[i] == key) return static_cast<int>(i);
  return -1;
}

// Free-form values nest only up to max_depth; deeper, only scalars.
uint32_t AllowedTypes(const SchemaNode* n, const GrammarLimits& lim) {
  uint32_t t = n->types;
  if (t == kAny && n->depth >= lim.max_depth) t &= ~(kObject | kArray);
  return t;
}

int MaxItems(const SchemaNode* n, const GrammarLimits& lim) {
  int64_t m = std::max<int64_t>(lim.max_items, n->min_items);
  if (n->max_items >= 0) m = std::min(m, n->max_items);
  return static_cast<int>(m);
}

const SchemaNode* FreeValueNode(int depth) {
  static thread_local std::vector<std::shared_ptr<SchemaNode>> any_by_depth;
  while (static_cast<int>(any_by_depth.size()) <= depth) any_by_depth.push_back(AnyNode(static_cast<int>(any_by_depth.size())));
  return any_by_depth[depth].get();
}

// A number with a range: can the digits so far still become a value in
// [lo, hi] (scaled by 10^fraction digits), within the digit limits?
bool RangeReachable(const Frame& f, int int_digits, int frac_digits) {
  const Int scale = f.integer_only ? 1 : Pow10(frac_digits);
  const Int frac_max = scale - 1;
  auto meets = [&](Int a, Int b) {  // magnitudes [a, b]
    return f.negative ? (-b <= f.hi && -a >= f.lo) : (a <= f.hi && b >= f.lo);
  };
  switch (f.state) {
    case Frame::kNumSign:
      return meets(0, (Pow10(int_digits) - 1) * scale + frac_max);
    case Frame::kNumZero:
      return meets(0, frac_max);
    case Frame::kNumInt:
      for (int k = 0; k <= int_digits - f.count; ++k) {
        const Int p = Pow10(k);
        if (meets(f.int_value * p * scale, ((f.int_value + 1) * p - 1) * scale + frac_max)) return true;
      }
      return false;
    case Frame::kNumDot:
      return meets(f.int_value * scale, f.int_value * scale + frac_max);
    case Frame::kNumFrac: {
      const Int unit = Pow10(frac_digits - f.count);
      const Int at = f.int_value * scale + f.frac_value * unit;
      return meets(at, at + unit - 1);
    }
  }
  return false;
}

bool RangeEndsHere(const Frame& f, int frac_digits) {
  const Int scale = f.integer_only ? 1 : Pow10(frac_digits);
  Int v = f.state == Frame::kNumFrac ? f.int_value * scale + f.frac_value * Pow10(frac_digits - f.count)
                                     : f.int_value * scale;
  if (f.negative) v = -v;
  return v >= f.lo && v <= f.hi;
}

StepResult FeedStack(std::vector<Frame>& stack, uint8_t c, const GrammarLimits& lim);

Frame ValueFrame(const SchemaNode* node) {
  Frame f;
  f.kind = Frame::kValue;
  f.node = node;
  return f;
}

// The frame kinds' byte steps. Each returns kReject, kConsumed (the frame
// stays open), or sets `r` to a finishing result.
StepResult StepValue(std::vector<Frame>& stack, uint8_t c, const GrammarLimits& lim, bool& again) {
  Frame& f = stack.back();
  const SchemaNode* n = f.node;
  again = false;
  if (!n->any_of.empty()) {
    Frame any;
    any.kind = Frame::kAnyOf;
    any.node = n;
    for (const auto& alt : n->any_of) any.alternatives.push_back({ValueFrame(alt.get())});
    f = std::move(any);
    again = true;
    return StepResult::kConsumed;
  }
  if (!n->enum_texts.empty()) {
    Frame lit;
    lit.kind = Frame::kLiteral;
    lit.node = n;
    for (const auto& s : n->enum_texts) lit.candidates.push_back(&s);
    f = std::move(lit);
    again = true;  // feed c to the literal
    return StepResult::kConsumed;
  }
  uint32_t t = AllowedTypes(n, lim);
  if (c == '{' && (t & kObject)) {
    f.kind = Frame::kObject;
    f.state = Frame::kObjOpen;
    f.used.assign(n->property_keys.size(), 0);
    return StepResult::kConsumed;
  }
  if (c == '[' && (t & kArray)) {
    f.kind = Frame::kArray;
    f.state = 0;  // just opened
    return StepResult::kConsumed;
  }
  if (c == '"' && (t & kString)) {
    f.kind = Frame::kString;
    f.state = Frame::kStrNormal;
    f.min_chars = n->min_chars;
    f.max_chars = n->max_chars;
    f.max_bytes = n->max_string_bytes >= 0 ? n->max_string_bytes : lim.max_string_bytes;
    f.pattern = n->pattern.get();
    f.pattern_state = f.pattern ? f.pattern->start() : 0;
    return StepResult::kConsumed;
  }
  if ((c == '-' || (c >= '0' && c <= '9')) && (t & (kInteger | kNumber))) {
    f.kind = Frame::kNumber;
    f.integer_only = !(t & kNumber);
    f.state = Frame::kNumSign;
    f.count = 0;
    f.negative = c == '-';
    if (n->minimum || n->maximum) {
      f.ranged = true;
      const Int scale = f.integer_only ? 1 : Pow10(lim.max_fraction_digits);
      const int digits = n->integer_digits >= 0 ? n->integer_digits : lim.max_integer_digits;
      const Int top = (Pow10(digits) - 1) * scale + (scale - 1);
      f.lo = n->minimum ? std::max(-top, ScaledBound(*n->minimum, scale, true, n->exclusive_minimum)) : -top;
      f.hi = n->maximum ? std::min(top, ScaledBound(*n->maximum, scale, false, n->exclusive_maximum)) : top;
      if (!RangeReachable(f, digits, lim.max_fraction_digits)) return StepResult::kReject;
    }
    if (c == '-') return StepResult::kConsumed;
    again = true;  // the number frame reads the digit
    return StepResult::kConsumed;
  }
  if ((c == 't' || c == 'f') && (t & kBoolean)) {
    f.kind = Frame::kLiteral;
    f.candidates = {&kTrue, &kFalse};
    again = true;
    return StepResult::kConsumed;
  }
  if (c == 'n' && (t & kNull)) {
    f.kind = Frame::kLiteral;
    f.candidates = {&kNullText};
    again = true;
    return StepResult::kConsumed;
  }
  return StepResult::kReject;
}

// A string with a pattern: printable ASCII only (\" and \\ for the two
// characters JSON escapes), each character taken only if the pattern can
// still be matched within the bytes left.
StepResult StepPatternString(Frame& f, uint8_t c) {
  const PatternDfa& dfa = *f.pattern;
  const int room = f.max_bytes - f.count;
  auto fits = [&](char ch, int bytes) {
    const int next = dfa.Next(f.pattern_state, ch);
    return next != PatternDfa::kDead && bytes + dfa.BytesToAccept(next) <= room ? next : PatternDfa::kDead;
  };
  if (f.state == Frame::kStrEscape) {
    if (c != '"' && c != '\\') return StepResult::kReject;
    const int next = fits(static_cast<char>(c), 2);
    if (next == PatternDfa::kDead) return StepResult::kReject;
    f.pattern_state = next;
    f.state = Frame::kStrNormal;
    f.count += 2;
    return StepResult::kConsumed;
  }
  if (c == '"') return dfa.Accepting(f.pattern_state) ? StepResult::kConsumedDone : StepResult::kReject;
  if (c == '\\') {
    if (fits('"', 2) == PatternDfa::kDead && fits('\\', 2) == PatternDfa::kDead) return StepResult::kReject;
    f.state = Frame::kStrEscape;
    ++f.chars;
    return StepResult::kConsumed;
  }
  if (c < 0x20 || c > 0x7E) return StepResult::kReject;
  const int next = fits(static_cast<char>(c), 1);
  if (next == PatternDfa::kDead) return StepResult::kReject;
  f.pattern_state = next;
  ++f.count;
  ++f.chars;
  return StepResult::kConsumed;
}

StepResult StepString(Frame& f, uint8_t c) {
  if (f.pattern) return StepPatternString(f, c);
  int room = f.max_bytes - f.count;
  if (f.state == Frame::kStrEscape) {
    if (std::string_view("\"\\/bfnrt").find(static_cast<char>(c)) == std::string_view::npos) return StepResult::kReject;
    f.state = Frame::kStrNormal;
    f.count += 2;
    return StepResult::kConsumed;
  }
  if (f.state == Frame::kStrUtf8) {
    if (c < f.utf8_lower || c > f.utf8_upper) return StepResult::kReject;
    f.utf8_lower = 0x80;
    f.utf8_upper = 0xBF;
    if (--f.utf8_needed == 0) f.state = Frame::kStrNormal;
    ++f.count;
    return StepResult::kConsumed;
  }
  if (c == '"') return f.chars >= f.min_chars ? StepResult::kConsumedDone : StepResult::kReject;
  if (c < 0x20) return StepResult::kReject;
  if (f.max_chars >= 0 && f.chars >= f.max_chars) return StepResult::kReject;
  // Characters still owed to minLength after this one, one byte each at least.
  const int64_t owed = std::max<int64_t>(0, f.min_chars - (f.chars + 1));
  if (c == '\\') {
    if (room < 2 + owed) return StepResult::kReject;
    f.state = Frame::kStrEscape;
    ++f.chars;
    return StepResult::kConsumed;
  }
  if (c < 0x80) {
    if (room < 1 + owed) return StepResult::kReject;
    ++f.count;
    ++f.chars;
    return StepResult::kConsumed;
  }
  // UTF-8 lead bytes, with the second-byte ranges that exclude overlong
  // forms, surrogates and code points past U+10FFFF.
  int need = 0;
  uint8_t lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) need = 1;
  else if (c == 0xE0) { need = 2; lo = 0xA0; }
  else if (c >= 0xE1 && c <= 0xEC) need = 2;
  else if (c == 0xED) { need = 2; hi = 0x9F; }
  else if (c >= 0xEE && c <= 0xEF) need = 2;
  else if (c == 0xF0) { need = 3; lo = 0x90; }
  else if (c >= 0xF1 && c <= 0xF3) need = 3;
  else if (c == 0xF4) { need = 3; hi = 0x8F; }
  else return StepResult::kReject;
  if (room < need + 1 + owed) return StepResult::kReject;
  f.state = Frame::kStrUtf8;
  f.utf8_needed = static_cast<uint8_t>(need);
  f.utf8_lower = lo;
  f.utf8_upper = hi;
  ++f.count;
  ++f.chars;
  return StepResult::kConsumed;
}

StepResult StepNumber(Frame& f, uint8_t c, const GrammarLimits& lim) {
  const bool digit = c >= '0' && c <= '9';
  const int int_digits = f.node->integer_digits >= 0 ? f.node->integer_digits : lim.max_integer_digits;
  // A digit or point is taken only if a value in range can still follow.
  auto take = [&](Frame next) {
    if (f.ranged && !RangeReachable(next, int_digits, lim.max_fraction_digits)) return StepResult::kReject;
    f = std::move(next);
    return StepResult::kConsumed;
  };
  auto end = [&] {
    if (f.ranged && !RangeEndsHere(f, lim.max_fraction_digits)) return StepResult::kReject;
    return StepResult::kDoneNotConsumed;
  };
  Frame next = f;
  switch (f.state) {
    case Frame::kNumSign:
      if (!digit) return StepResult::kReject;
      next.state = c == '0' ? Frame::kNumZero : Frame::kNumInt;
      next.count = 1;
      next.int_value = c - '0';
      return take(std::move(next));
    case Frame::kNumZero:
      if (c == '.' && !f.integer_only) {
        next.state = Frame::kNumDot;
        next.count = 0;
        return take(std::move(next));
      }
      if (digit) return StepResult::kReject;
      return end();
    case Frame::kNumInt:
      if (digit && f.count < int_digits) {
        ++next.count;
        next.int_value = f.int_value * 10 + (c - '0');
        return take(std::move(next));
      }
      if (c == '.' && !f.integer_only) {
        next.state = Frame::kNumDot;
        next.count = 0;
        return take(std::move(next));
      }
      if (digit) return StepResult::kReject;
      return end();
    case Frame::kNumDot:
      if (!digit) return StepResult::kReject;
      next.state = Frame::kNumFrac;
      next.count = 1;
      next.frac_value = c - '0';
      return take(std::move(next));
    case Frame::kNumFrac:
      if (digit && f.count < lim.max_fraction_digits) {
        ++next.count;
        next.frac_value = f.frac_value * 10 + (c - '0');
        return take(std::move(next));
      }
      if (digit) return StepResult::kReject;
      return end();
  }
  return StepResult::kReject;
}

// Feeds c to every alternative still possible; see the anyOf notes in
// FeedStack.
StepResult StepAnyOf(Frame& f, uint8_t c, const GrammarLimits& lim) {
  std::vector<std::vector<Frame>> open;
  bool consumed_done = false, done_before = false;
  for (auto& alt : f.alternatives) {
    switch (FeedStack(alt, c, lim)) {
      case StepResult::kConsumed: open.push_back(std::move(alt)); break;
      case StepResult::kConsumedDone: consumed_done = true; break;
      case StepResult::kDoneNotConsumed: done_before = true; break;
      case StepResult::kReject: break;
    }
  }
  if (!open.empty()) {
    f.alternatives = std::move(open);
    f.can_end = consumed_done;
    return StepResult::kConsumed;
  }
  if (consumed_done) return StepResult::kConsumedDone;
  if (done_before || f.can_end) return StepResult::kDoneNotConsumed;
  return StepResult::kReject;
}

// Feeds one byte to a stack of open constructs. kConsumedDone and
// kDoneNotConsumed: the bottom construct finished (with or before c) and
// the stack is empty.
//
// anyOf runs its alternatives side by side. JSON values end where their
// syntax says, so alternatives that read the same bytes agree on the end,
// except that a number (or an enum literal) may go on or stop: the byte
// decides, and a byte that continues one alternative can never be the byte
// after the value (digits, '.', letters of a literal), so continuing wins.
StepResult FeedStack(std::vector<Frame>& stack, uint8_t c, const GrammarLimits& lim) {
  while (true) {
    Frame& f = stack.back();
    StepResult r = StepResult::kReject;
    switch (f.kind) {
      case Frame::kValue: {
        bool again = false;
        r = StepValue(stack, c, lim, again);
        if (r == StepResult::kReject) return r;
        if (again) continue;
        return StepResult::kConsumed;
      }
      case Frame::kAnyOf:
        r = StepAnyOf(f, c, lim);
        if (r == StepResult::kConsumed || r == StepResult::kReject) return r;
        break;
      case Frame::kLiteral: {
        std::vector<const std::string*> next;
        bool some_complete = false;
        for (const std::string* s : f.candidates) {
          if (s->size() == f.pos) some_complete = true;
          else if (static_cast<uint8_t>((*s)[f.pos]) == c) next.push_back(s);
        }
        if (next.empty()) {
          r = some_complete ? StepResult::kDoneNotConsumed : StepResult::kReject;
          break;
        }
        f.candidates = std::move(next);
        ++f.pos;
        bool all_complete = std::all_of(f.candidates.begin(), f.candidates.end(),
                                        [&](const std::string* s) { return s->size() == f.pos; });
        r = all_complete ? StepResult::kConsumedDone : StepResult::kConsumed;
        break;
      }
      case Frame::kString:
        r = StepString(f, c);
        if (r == StepResult::kConsumed || r == StepResult::kReject) return r;
        break;
      case Frame::kNumber:
        r = StepNumber(f, c, lim);
        if (r == StepResult::kConsumed || r == StepResult::kReject) return r;
        break;
      case Frame::kArray: {
        const int max_items = MaxItems(f.node, lim);
        // state 0: just opened; 1: after an item; 2: after a comma
        if (f.state == 0 && c == ']' && f.node->min_items == 0) { r = StepResult::kConsumedDone; break; }
        if (f.state == 1) {
          if (c == ']' && f.count >= f.node->min_items) { r = StepResult::kConsumedDone; break; }
          if (c == ',' && f.count < max_items) { f.state = 2; return StepResult::kConsumed; }
          return StepResult::kReject;
        }
        if (f.state == 0 && max_items == 0) return StepResult::kReject;
        // state 0 (first item) or 2 (after a comma): an item starts with c
        // (an array without `items` holds free values one level deeper)
        const SchemaNode* item = f.node->items ? f.node->items.get() : FreeValueNode(f.node->depth + 1);
        f.state = 1;
        ++f.count;
        stack.push_back(ValueFrame(item));
        continue;
      }
      case Frame::kObject: {
        switch (f.state) {
          case Frame::kObjOpen:
            if (c == '}' && AllRequiredWritten(f)) { r = StepResult::kConsumedDone; break; }
            if (c == '"' && AnyKeyAvailable(f, lim)) { f.state = Frame::kObjKey; f.key.clear(); return StepResult::kConsumed; }
            return StepResult::kReject;
          case Frame::kObjKeyStart:
            if (c == '"') { f.state = Frame::kObjKey; f.key.clear(); return StepResult::kConsumed; }
            return StepResult::kReject;
          case Frame::kObjKey: {
            if (f.node->has_properties) {
              // Keys are matched in their escaped form: a quote after an odd
              // run of backslashes is part of the key (\"), not its end.
              size_t backslashes = 0;
              while (backslashes < f.key.size() && f.key[f.key.size() - 1 - backslashes] == '\\') ++backslashes;
              if (c == '"' && backslashes % 2 == 0) {
                int idx = KeyExact(f, f.key);
                if (idx < 0) return StepResult::kReject;
                f.current_property = idx;
                f.state = Frame::kObjColon;
                return StepResult::kConsumed;
              }
              std::string next = f.key + static_cast<char>(c);
              if (!KeyPrefixPossible(f, next)) return StepResult::kReject;
              f.key = std::move(next);
              return StepResult::kConsumed;
            }
            // Free keys: a plain string frame reads them.
            Frame s;
            s.kind = Frame::kString;
            s.state = Frame::kStrNormal;
            s.is_key = true;
            s.max_bytes = lim.max_string_bytes;
            f.state = Frame::kObjColon;
            f.current_property = -1;
            stack.push_back(std::move(s));
            continue;
          }
          case Frame::kObjColon: {
            if (c != ':') return StepResult::kReject;
            f.state = Frame::kObjValue;
            ++f.count;
            const SchemaNode* child;
            if (f.current_property >= 0) {
              f.used[f.current_property] = 1;
              child = f.node->property_schemas[f.current_property].get();
            } else {
              child = f.node->additional ? f.node->additional.get() : FreeValueNode(f.node->depth + 1);
            }
            stack.push_back(ValueFrame(child));
            return StepResult::kConsumed;
          }
          case Frame::kObjAfterValue:
            if (c == '}' && AllRequiredWritten(f)) { r = StepResult::kConsumedDone; break; }
            if (c == ',' && AnyKeyAvailable(f, lim)) { f.state = Frame::kObjKeyStart; return StepResult::kConsumed; }
            return StepResult::kReject;
          default:
            return StepResult::kReject;
        }
        break;
      }
    }
    switch (r) {
      case StepResult::kReject:
        return r;
      case StepResult::kConsumed:
        return r;
      case StepResult::kConsumedDone:
      case StepResult::kDoneNotConsumed: {
        stack.pop_back();
        if (stack.empty()) return r;
        // Tell the parent its child finished.
        Frame& p = stack.back();
        if (p.kind == Frame::kObject && p.state == Frame::kObjValue) p.state = Frame::kObjAfterValue;
        // a free key string finished: the object already waits for ':'
        if (r == StepResult::kConsumedDone) return StepResult::kConsumed;
        continue;  // offer c to the parent
      }
    }
  }
}

}  // namespace

JsonGrammar::~JsonGrammar() = default;
JsonGrammar::JsonGrammar(const JsonGrammar&) = default;
JsonGrammar& JsonGrammar::operator=(const JsonGrammar&) = default;
JsonGrammar::JsonGrammar(JsonGrammar&&) noexcept = default;
JsonGrammar& JsonGrammar::operator=(JsonGrammar&&) noexcept = default;

Result<JsonGrammar> JsonGrammar::ForObjectSchema(const ojson& schema, const GrammarLimits& limits, bool strict) {
  if (strict) MOE_TRY(CheckSchemaSupported(schema));
  Compiler compiler(schema, limits);
  auto root = compiler.Compile(schema, 0, 0, "$");
  MOE_TRY(compiler.error());
  if (!root->any_of.empty()) {
    return Fail(Error::InvalidArgument("the schema's root must be an object schema, not anyOf"));
  }
  if (root->impossible) {
    return Fail(Error::InvalidArgument("the schema cannot be satisfied: a required property recurses deeper than " +
                                       std::to_string(limits.max_recursion) + " levels through $ref"));
  }
  if (!(root->types & kObject)) {
    return Fail(Error::InvalidArgument("the schema's type must allow \"object\" (tool arguments and json_object are objects)"));
  }
  if (root.use_count() > 1) root = std::make_shared<SchemaNode>(*root);  // shared through $ref "#": narrow a copy
  root->types = kObject;
  if (!root->enum_texts.empty()) {
    // Keep only object enum values; with none left, the enum cannot be met.
    std::erase_if(root->enum_texts, [](const std::string& s) { return s.empty() || s[0] != '{'; });
    if (root->enum_texts.empty()) return Fail(Error::InvalidArgument("the schema's enum holds no object"));
  }
  JsonGrammar g;
  g.root_ = root;
  g.limits_ = std::make_shared<GrammarLimits>(limits);
  g.stack_.push_back(ValueFrame(g.root_.get()));
  return g;
}

bool JsonGrammar::Done() const { return stack_.empty(); }

JsonGrammar::PlainTextRoom JsonGrammar::PlainTextRoomNow() const {
  if (stack_.empty()) return {};
  const Frame& f = stack_.back();
  if (f.kind != Frame::kString || f.pattern || f.is_key || f.state != Frame::kStrNormal) return {};
  PlainTextRoom room;
  room.bytes = std::max<int64_t>(0, f.max_bytes - f.count - std::max<int64_t>(0, f.min_chars - f.chars));
  room.chars = f.max_chars >= 0 ? std::max<int64_t>(0, f.max_chars - f.chars) : room.bytes;
  return room;
}

bool JsonGrammar::CanAccept(uint8_t byte) const {
  JsonGrammar copy = *this;
  return copy.Feed(byte);
}

bool JsonGrammar::Feed(uint8_t c) {
  if (stack_.empty()) return false;
  StepResult r = FeedStack(stack_, c, *limits_);
  return r == StepResult::kConsumed || r == StepResult::kConsumedDone;
}

namespace {

size_t CodePoints(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

Status CheckNode(const ojson& value, const ojson& schema, const ojson& root, const std::string& path, int hops) {
  if (schema.is_boolean()) {
    if (schema.get<bool>()) return Ok();
    return Fail(Error::InvalidArgument(path + ": no value is allowed here"));
  }
  if (!schema.is_object()) return Ok();
  // The same precedence as the grammar: $ref, then anyOf, then allOf of one.
  if (auto ref = schema.find("$ref"); ref != schema.end() && ref->is_string()) {
    const ojson* target = ResolveRef(root, ref->get<std::string>());
    if (!target || hops > 256) return Ok();
    return CheckNode(value, *target, root, path, hops + 1);
  }
  if (auto any = schema.find("anyOf"); any != schema.end() && any->is_array() && !any->empty()) {
    for (const auto& alt : *any)
      if (CheckNode(value, alt, root, path, hops)) return Ok();
    return Fail(Error::InvalidArgument(path + ": " + value.dump() + " matches none of anyOf"));
  }
  if (auto all = schema.find("allOf"); all != schema.end() && all->is_array() && all->size() == 1) {
    return CheckNode(value, (*all)[0], root, path, hops);
  }
  const std::string text = value.dump();
  uint32_t types = TypeBitsOf(schema);
  if (types == 0) types = schema.contains("properties") ? kObject : kAny;
  if (!(types & TypeBitOfValue(value))) return Fail(Error::InvalidArgument(path + ": " + text + " has the wrong type"));
  // enum and const name whole values: the grammar writes one of them and
  // nothing else applies (as it compiles them).
  if (auto c = schema.find("const"); c != schema.end()) {
    if (c->dump() != text) return Fail(Error::InvalidArgument(path + ": " + text + " is not the const value"));
    return Ok();
  }
  if (auto e = schema.find("enum"); e != schema.end() && e->is_array() && !e->empty()) {
    bool found = false;
    for (const auto& v : *e) found |= v.dump() == text;
    if (!found) return Fail(Error::InvalidArgument(path + ": " + text + " is not one of the enum values"));
    return Ok();
  }
  if (value.is_object()) {
    const auto p = schema.find("properties");
    const bool declared = p != schema.end() && p->is_object();
    const auto r = schema.find("required");
    const auto required_elsewhere = [&](const std::string& key) {
      return r != schema.end() && r->is_array() && std::find(r->begin(), r->end(), key) != r->end();
    };
    const auto additional = schema.find("additionalProperties");
    const bool has_additional = additional != schema.end() && (additional->is_object() || additional->is_boolean());
    for (auto it = value.begin(); it != value.end(); ++it) {
      if (declared && p->contains(it.key())) {
        MOE_TRY(CheckNode(it.value(), (*p)[it.key()], root, path + "." + it.key(), hops));
      } else if (declared && !required_elsewhere(it.key())) {
        // A key that "required" names but "properties" does not declare takes
        // any value, as the grammar builds it.
        return Fail(Error::InvalidArgument(path + ": undeclared property '" + it.key() + "'"));
      } else if (!declared && has_additional) {
        MOE_TRY(CheckNode(it.value(), *additional, root, path + "." + it.key(), hops));
      }
    }
    if (r != schema.end() && r->is_array())
      for (const auto& k : *r)
        if (k.is_string() && !value.contains(k.get<std::string>()))
          return Fail(Error::InvalidArgument(path + ": required property '" + k.get<std::string>() + "' is missing"));
  }
  if (value.is_array()) {
    if (auto items = schema.find("items"); items != schema.end())
      for (size_t i = 0; i < value.size(); ++i)
        MOE_TRY(CheckNode(value[i], *items, root, path + "[" + std::to_string(i) + "]", hops));
    const int64_t n = static_cast<int64_t>(value.size());
    if (n < CountKeyword(schema, "minItems", 0)) return Fail(Error::InvalidArgument(path + ": fewer items than minItems"));
    if (auto mx = CountKeyword(schema, "maxItems", -1); mx >= 0 && n > mx)
      return Fail(Error::InvalidArgument(path + ": more items than maxItems"));
  }
  if (value.is_string()) {
    if (auto dfa = EnforcedPattern(schema); dfa && !dfa->Matches(value.get_ref<const std::string&>()))
      return Fail(Error::InvalidArgument(path + ": " + text + " does not match the pattern"));
    const auto n = static_cast<int64_t>(CodePoints(value.get_ref<const std::string&>()));
    if (n < CountKeyword(schema, "minLength", 0)) return Fail(Error::InvalidArgument(path + ": shorter than minLength"));
    if (auto mx = CountKeyword(schema, "maxLength", -1); mx >= 0 && n > mx)
      return Fail(Error::InvalidArgument(path + ": longer than maxLength"));
  }
  if (value.is_number()) {
    const long double v = value.get<long double>();
    auto bound = [&](const char* key, bool lower, bool exclusive) -> Status {
      auto x = NumberKeyword(schema, key);
      if (!x) return Ok();
      const bool ok = lower ? (exclusive ? v > *x : v >= *x) : (exclusive ? v < *x : v <= *x);
      if (!ok) return Fail(Error::InvalidArgument(path + ": " + text + " is outside " + key));
      return Ok();
    };
    MOE_TRY(bound("minimum", true, false));
    MOE_TRY(bound("maximum", false, false));
    MOE_TRY(bound("exclusiveMinimum", true, true));
    MOE_TRY(bound("exclusiveMaximum", false, true));
  }
  return Ok();
}

// Keywords that describe and never constrain.
const std::set<std::string>& Annotations() {
  static const std::set<std::string> k = {"title",    "description", "default",  "examples", "$comment",
                                          "deprecated", "readOnly",  "writeOnly", "$schema",  "$id"};
  return k;
}

class StrictChecker {
 public:
  explicit StrictChecker(const ojson& root) : root_(root) {}

  Status Check(const ojson& s, const std::string& path) {
    if (s.is_boolean()) return Ok();
    if (!s.is_object()) return Refuse(path, "a schema must be an object or a boolean");
    const bool combinator = s.contains("anyOf") || s.contains("$ref") || s.contains("allOf");
    for (auto it = s.begin(); it != s.end(); ++it) {
      const std::string& k = it.key();
      const ojson& v = it.value();
      const std::string at = path + "." + k;
      if (Annotations().contains(k)) continue;
      if (k == "$defs" || k == "definitions") {
        if (!v.is_object()) return Refuse(at, "must be an object of schemas");
        for (auto d = v.begin(); d != v.end(); ++d) MOE_TRY(Check(d.value(), at + "." + d.key()));
        continue;
      }
      if (combinator && k != "anyOf" && k != "$ref" && k != "allOf") {
        return Refuse(at, "'" + k + "' beside anyOf, allOf or $ref is not enforced; put it inside the alternatives");
      }
      if (k == "type") {
        auto known = [](const ojson& t) { return t.is_string() && TypeBitOf(t.get<std::string>()) != 0; };
        bool ok = known(v) || (v.is_array() && !v.empty() && std::all_of(v.begin(), v.end(), known));
        if (!ok) return Refuse(at, "must name object, array, string, integer, number, boolean or null");
      } else if (k == "properties") {
        if (!v.is_object()) return Refuse(at, "must be an object of schemas");
        for (auto p = v.begin(); p != v.end(); ++p) MOE_TRY(Check(p.value(), at + "." + p.key()));
      } else if (k == "required") {
        if (!v.is_array() || !std::all_of(v.begin(), v.end(), [](const ojson& x) { return x.is_string(); }))
          return Refuse(at, "must be an array of property names");
      } else if (k == "additionalProperties") {
        if (s.contains("properties") && !(v.is_boolean() && !v.get<bool>()))
          return Refuse(at, "beside 'properties' only false is enforced (only the declared keys are written)");
        if (!v.is_boolean()) MOE_TRY(Check(v, at));
      } else if (k == "items") {
        if (v.is_array()) return Refuse(at, "the array (tuple) form is not supported; use one schema");
        MOE_TRY(Check(v, at));
      } else if (k == "minItems" || k == "maxItems" || k == "minLength" || k == "maxLength") {
        if (!v.is_number_integer() || v.get<int64_t>() < 0) return Refuse(at, "must be a non-negative integer");
      } else if (k == "minimum" || k == "maximum" || k == "exclusiveMinimum" || k == "exclusiveMaximum") {
        if (!v.is_number()) return Refuse(at, "must be a number");
      } else if (k == "pattern") {
        if (!v.is_string()) return Refuse(at, "must be a string");
        if (s.contains("minLength") || s.contains("maxLength"))
          return Refuse(at, "'pattern' together with minLength/maxLength is not enforced; put the length in the pattern");
        auto dfa = PatternDfa::Compile(v.get<std::string>());
        if (!dfa) return Refuse(at, dfa.error().message());
      } else if (k == "enum") {
        if (!v.is_array() || v.empty()) return Refuse(at, "must be a non-empty array");
      } else if (k == "const") {
        continue;
      } else if (k == "anyOf") {
        if (!v.is_array() || v.empty()) return Refuse(at, "must be a non-empty array of schemas");
        for (size_t i = 0; i < v.size(); ++i) MOE_TRY(Check(v[i], at + "[" + std::to_string(i) + "]"));
      } else if (k == "allOf") {
        if (!v.is_array() || v.size() != 1) return Refuse(at, "only allOf with exactly one schema is enforced");
        MOE_TRY(Check(v[0], at + "[0]"));
      } else if (k == "$ref") {
        if (!v.is_string() || !ResolveRef(root_, v.get<std::string>()))
          return Refuse(at, "must point to \"#\", \"#/$defs/<name>\" or \"#/definitions/<name>\" of this schema");
      } else {
        return Refuse(at, "'" + k + "' is not enforced by this server");
      }
    }
    return Ok();
  }

 private:
  static Status Refuse(const std::string& at, const std::string& why) {
    return Fail(Error::InvalidArgument("unsupported schema at " + at + ": " + why +
                                       " (strict schemas may use type, properties, required, additionalProperties, "
                                       "items, minItems, maxItems, enum, const, minLength, maxLength, minimum, "
                                       "maximum, exclusiveMinimum, exclusiveMaximum, pattern (a subset), anyOf, allOf of one, $ref, $defs)"));
  }
  const ojson& root_;
};

}  // namespace

Status CheckAgainstSchema(const ojson& value, const ojson& schema, const std::string& path) {
  return CheckNode(value, schema, schema, path, 0);
}

Status CheckSchemaSupported(const ojson& schema) { return StrictChecker(schema).Check(schema, "$"); }

}  // namespace moeserve::engine
