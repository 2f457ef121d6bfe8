#include "moeserve/daemon/json_grammar.hpp"

#include <algorithm>

namespace moeserve::daemon {

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
}  // namespace

struct SchemaNode {
  uint32_t types = kAny;
  std::vector<std::string> enum_texts;  // compact JSON of each allowed value; empty: no enum
  bool has_properties = false;          // declared properties: only these keys
  std::vector<std::string> property_keys;  // the key as it appears between quotes (JSON-escaped)
  std::vector<std::shared_ptr<SchemaNode>> property_schemas;
  std::vector<bool> property_required;
  std::shared_ptr<SchemaNode> items;  // null: any
  int depth = 0;                      // nesting level, for the free-form limit
};

namespace {

std::shared_ptr<SchemaNode> AnyNode(int depth) {
  auto n = std::make_shared<SchemaNode>();
  n->depth = depth;
  return n;
}

std::shared_ptr<SchemaNode> Compile(const ojson& schema, int depth) {
  auto n = AnyNode(depth);
  if (!schema.is_object()) return n;
  if (auto t = schema.find("type"); t != schema.end()) {
    uint32_t bits = 0;
    if (t->is_string()) bits = TypeBitOf(t->get<std::string>());
    else if (t->is_array())
      for (const auto& e : *t)
        if (e.is_string()) bits |= TypeBitOf(e.get<std::string>());
    if (bits != 0) n->types = bits;
  } else if (schema.contains("properties")) {
    n->types = kObject;
  } else if (schema.contains("items")) {
    n->types = kArray;
  }
  if (auto e = schema.find("enum"); e != schema.end() && e->is_array() && !e->empty()) {
    for (const auto& v : *e) n->enum_texts.push_back(v.dump(-1, ' ', false, ojson::error_handler_t::replace));
  }
  std::vector<std::string> required;
  if (auto r = schema.find("required"); r != schema.end() && r->is_array())
    for (const auto& e : *r)
      if (e.is_string()) required.push_back(e.get<std::string>());
  auto declare = [&](const std::string& key, std::shared_ptr<SchemaNode> value_schema) {
    std::string quoted = ojson(key).dump();
    n->property_keys.push_back(quoted.substr(1, quoted.size() - 2));
    n->property_schemas.push_back(std::move(value_schema));
    n->property_required.push_back(std::find(required.begin(), required.end(), key) != required.end());
  };
  const auto p = schema.find("properties");
  const bool declared = p != schema.end() && p->is_object();
  if (declared) {
    n->has_properties = true;
    for (auto it = p->begin(); it != p->end(); ++it) declare(it.key(), Compile(it.value(), depth + 1));
  }
  // A required key the schema does not declare (or "required" without
  // "properties") still has to be written, and only declared keys can be:
  // declare it, with any value. Otherwise the grammar could finish an object
  // that misses it.
  for (size_t i = 0; i < required.size(); ++i) {
    const std::string& key = required[i];
    const bool seen = std::find(required.begin(), required.begin() + i, key) != required.begin() + i;
    if (seen || (declared && p->contains(key))) continue;
    n->has_properties = true;
    declare(key, AnyNode(depth + 1));
  }
  if (auto it = schema.find("items"); it != schema.end() && it->is_object()) n->items = Compile(*it, depth + 1);
  return n;
}

}  // namespace

// One open construct. Which fields matter depends on kind.
struct JsonGrammar::Frame {
  enum Kind : uint8_t { kValue, kObject, kArray, kString, kNumber, kLiteral } kind = kValue;
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
  // string utf-8 continuation state
  uint8_t utf8_needed = 0, utf8_lower = 0x80, utf8_upper = 0xBF;
  // literal: candidate texts and position
  std::vector<const std::string*> candidates;
  size_t pos = 0;
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
  if (!f.node->has_properties) return f.count < lim.max_free_properties;
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

}  // namespace

JsonGrammar::~JsonGrammar() = default;
JsonGrammar::JsonGrammar(const JsonGrammar&) = default;
JsonGrammar& JsonGrammar::operator=(const JsonGrammar&) = default;
JsonGrammar::JsonGrammar(JsonGrammar&&) noexcept = default;
JsonGrammar& JsonGrammar::operator=(JsonGrammar&&) noexcept = default;

Result<JsonGrammar> JsonGrammar::ForObjectSchema(const ojson& schema, const GrammarLimits& limits) {
  auto root = Compile(schema, 0);
  if (!(root->types & kObject)) {
    return Fail(Error::InvalidArgument("the schema's type must allow \"object\" (tool arguments and json_object are objects)"));
  }
  root->types = kObject;
  if (!root->enum_texts.empty()) {
    // Keep only object enum values; with none left, the enum cannot be met.
    std::erase_if(root->enum_texts, [](const std::string& s) { return s.empty() || s[0] != '{'; });
    if (root->enum_texts.empty()) return Fail(Error::InvalidArgument("the schema's enum holds no object"));
  }
  JsonGrammar g;
  g.root_ = root;
  g.limits_ = std::make_shared<GrammarLimits>(limits);
  Frame f;
  f.kind = Frame::kValue;
  f.node = g.root_.get();
  g.stack_.push_back(std::move(f));
  return g;
}

bool JsonGrammar::Done() const { return stack_.empty(); }

bool JsonGrammar::CanAccept(uint8_t byte) const {
  JsonGrammar copy = *this;
  return copy.Feed(byte);
}

bool JsonGrammar::Feed(uint8_t c) {
  const GrammarLimits& lim = *limits_;
  while (true) {
    if (stack_.empty()) return false;
    Frame& f = stack_.back();
    StepResult r = StepResult::kReject;
    switch (f.kind) {
      case Frame::kValue: {
        // The first byte decides which kind of value this is.
        const SchemaNode* n = f.node;
        if (!n->enum_texts.empty()) {
          Frame lit;
          lit.kind = Frame::kLiteral;
          lit.node = n;
          for (const auto& s : n->enum_texts) lit.candidates.push_back(&s);
          f = std::move(lit);
          continue;  // feed c to the literal
        }
        uint32_t t = AllowedTypes(n, lim);
        if (c == '{' && (t & kObject)) {
          f.kind = Frame::kObject;
          f.state = Frame::kObjOpen;
          f.used.assign(n->property_keys.size(), 0);
          return true;
        }
        if (c == '[' && (t & kArray)) {
          f.kind = Frame::kArray;
          f.state = 0;  // just opened
          return true;
        }
        if (c == '"' && (t & kString)) {
          f.kind = Frame::kString;
          f.state = Frame::kStrNormal;
          return true;
        }
        if ((c == '-' || (c >= '0' && c <= '9')) && (t & (kInteger | kNumber))) {
          f.kind = Frame::kNumber;
          f.integer_only = !(t & kNumber);
          f.state = Frame::kNumSign;
          f.count = 0;
          if (c == '-') return true;
          continue;  // the number frame reads the digit
        }
        if ((c == 't' || c == 'f') && (t & kBoolean)) {
          f.kind = Frame::kLiteral;
          f.candidates = {&kTrue, &kFalse};
          continue;
        }
        if (c == 'n' && (t & kNull)) {
          f.kind = Frame::kLiteral;
          f.candidates = {&kNullText};
          continue;
        }
        return false;
      }
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
      case Frame::kString: {
        int room = lim.max_string_bytes - f.count;
        if (f.state == Frame::kStrEscape) {
          if (std::string_view("\"\\/bfnrt").find(static_cast<char>(c)) == std::string_view::npos) return false;
          f.state = Frame::kStrNormal;
          f.count += 2;
          return true;
        }
        if (f.state == Frame::kStrUtf8) {
          if (c < f.utf8_lower || c > f.utf8_upper) return false;
          f.utf8_lower = 0x80;
          f.utf8_upper = 0xBF;
          if (--f.utf8_needed == 0) f.state = Frame::kStrNormal;
          ++f.count;
          return true;
        }
        if (c == '"') {
          r = StepResult::kConsumedDone;
          break;
        }
        if (c < 0x20) return false;
        if (c == '\\') {
          if (room < 2) return false;
          f.state = Frame::kStrEscape;
          return true;
        }
        if (c < 0x80) {
          if (room < 1) return false;
          ++f.count;
          return true;
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
        else return false;
        if (room < need + 1) return false;
        f.state = Frame::kStrUtf8;
        f.utf8_needed = static_cast<uint8_t>(need);
        f.utf8_lower = lo;
        f.utf8_upper = hi;
        ++f.count;
        return true;
      }
      case Frame::kNumber: {
        bool digit = c >= '0' && c <= '9';
        switch (f.state) {
          case Frame::kNumSign:
            if (!digit) return false;
            f.state = c == '0' ? Frame::kNumZero : Frame::kNumInt;
            f.count = 1;
            return true;
          case Frame::kNumZero:
            if (c == '.' && !f.integer_only) { f.state = Frame::kNumDot; f.count = 0; return true; }
            if (digit) return false;
            r = StepResult::kDoneNotConsumed;
            break;
          case Frame::kNumInt:
            if (digit && f.count < lim.max_integer_digits) { ++f.count; return true; }
            if (c == '.' && !f.integer_only) { f.state = Frame::kNumDot; f.count = 0; return true; }
            if (digit) return false;
            r = StepResult::kDoneNotConsumed;
            break;
          case Frame::kNumDot:
            if (!digit) return false;
            f.state = Frame::kNumFrac;
            f.count = 1;
            return true;
          case Frame::kNumFrac:
            if (digit && f.count < lim.max_fraction_digits) { ++f.count; return true; }
            if (digit) return false;
            r = StepResult::kDoneNotConsumed;
            break;
        }
        break;
      }
      case Frame::kArray: {
        // state 0: just opened; 1: after an item; 2: after a comma
        if (f.state == 0 && c == ']') { r = StepResult::kConsumedDone; break; }
        if (f.state == 1) {
          if (c == ']') { r = StepResult::kConsumedDone; break; }
          if (c == ',' && f.count < lim.max_items) { f.state = 2; return true; }
          return false;
        }
        // state 0 (first item) or 2 (after a comma): an item starts with c
        const SchemaNode* item = f.node->items ? f.node->items.get() : nullptr;
        std::shared_ptr<SchemaNode> any;
        if (!item) {
          // An array without `items` holds free values one level deeper.
          static thread_local std::vector<std::shared_ptr<SchemaNode>> any_by_depth;
          int d = f.node->depth + 1;
          while (static_cast<int>(any_by_depth.size()) <= d) any_by_depth.push_back(AnyNode(static_cast<int>(any_by_depth.size())));
          item = any_by_depth[d].get();
        }
        f.state = 1;
        ++f.count;
        Frame child;
        child.kind = Frame::kValue;
        child.node = item;
        stack_.push_back(std::move(child));
        continue;
      }
      case Frame::kObject: {
        switch (f.state) {
          case Frame::kObjOpen:
            if (c == '}' && AllRequiredWritten(f)) { r = StepResult::kConsumedDone; break; }
            if (c == '"' && AnyKeyAvailable(f, lim)) { f.state = Frame::kObjKey; f.key.clear(); return true; }
            return false;
          case Frame::kObjKeyStart:
            if (c == '"') { f.state = Frame::kObjKey; f.key.clear(); return true; }
            return false;
          case Frame::kObjKey: {
            if (f.node->has_properties) {
              // Keys are matched in their escaped form: a quote after an odd
              // run of backslashes is part of the key (\"), not its end.
              size_t backslashes = 0;
              while (backslashes < f.key.size() && f.key[f.key.size() - 1 - backslashes] == '\\') ++backslashes;
              if (c == '"' && backslashes % 2 == 0) {
                int idx = KeyExact(f, f.key);
                if (idx < 0) return false;
                f.current_property = idx;
                f.state = Frame::kObjColon;
                return true;
              }
              std::string next = f.key + static_cast<char>(c);
              if (!KeyPrefixPossible(f, next)) return false;
              f.key = std::move(next);
              return true;
            }
            // Free keys: a plain string frame reads them.
            Frame s;
            s.kind = Frame::kString;
            s.state = Frame::kStrNormal;
            s.is_key = true;
            f.state = Frame::kObjColon;
            f.current_property = -1;
            stack_.push_back(std::move(s));
            continue;
          }
          case Frame::kObjColon: {
            if (c != ':') return false;
            f.state = Frame::kObjValue;
            ++f.count;
            Frame child;
            child.kind = Frame::kValue;
            if (f.current_property >= 0) {
              f.used[f.current_property] = 1;
              child.node = f.node->property_schemas[f.current_property].get();
            } else {
              static thread_local std::vector<std::shared_ptr<SchemaNode>> any_by_depth;
              int d = f.node->depth + 1;
              while (static_cast<int>(any_by_depth.size()) <= d) any_by_depth.push_back(AnyNode(static_cast<int>(any_by_depth.size())));
              child.node = any_by_depth[d].get();
            }
            stack_.push_back(std::move(child));
            return true;
          }
          case Frame::kObjAfterValue:
            if (c == '}' && AllRequiredWritten(f)) { r = StepResult::kConsumedDone; break; }
            if (c == ',' && AnyKeyAvailable(f, lim)) { f.state = Frame::kObjKeyStart; return true; }
            return false;
          default:
            return false;
        }
        break;
      }
    }
    switch (r) {
      case StepResult::kReject:
        return false;
      case StepResult::kConsumed:
        return true;
      case StepResult::kConsumedDone:
      case StepResult::kDoneNotConsumed: {
        stack_.pop_back();
        // Tell the parent its child finished.
        if (!stack_.empty()) {
          Frame& p = stack_.back();
          if (p.kind == Frame::kObject && p.state == Frame::kObjValue) p.state = Frame::kObjAfterValue;
          // a free key string finished: the object already waits for ':'
        }
        if (r == StepResult::kConsumedDone) return true;
        continue;  // offer c to the parent
      }
    }
  }
}

Status CheckAgainstSchema(const ojson& value, const ojson& schema, const std::string& path) {
  if (!schema.is_object()) return Ok();
  if (auto e = schema.find("enum"); e != schema.end() && e->is_array() && !e->empty()) {
    std::string text = value.dump();
    bool found = false;
    for (const auto& v : *e) found |= v.dump() == text;
    if (!found) return Fail(Error::InvalidArgument(path + ": " + text + " is not one of the enum values"));
  }
  uint32_t types = kAny;
  if (auto t = schema.find("type"); t != schema.end()) {
    uint32_t bits = 0;
    if (t->is_string()) bits = TypeBitOf(t->get<std::string>());
    else if (t->is_array())
      for (const auto& x : *t)
        if (x.is_string()) bits |= TypeBitOf(x.get<std::string>());
    if (bits) types = bits;
  } else if (schema.contains("properties")) {
    types = kObject;
  }
  uint32_t actual = value.is_object() ? kObject : value.is_array() ? kArray : value.is_string() ? kString
                    : value.is_boolean() ? kBoolean : value.is_null() ? kNull
                    : value.is_number_float() ? kNumber : kInteger;
  if (!(types & actual)) return Fail(Error::InvalidArgument(path + ": " + value.dump() + " has the wrong type"));
  if (value.is_object()) {
    if (auto p = schema.find("properties"); p != schema.end() && p->is_object()) {
      // A key that "required" names but "properties" does not declare takes
      // any value, as the grammar builds it (see BuildObject above).
      const auto r = schema.find("required");
      const auto required_elsewhere = [&](const std::string& key) {
        return r != schema.end() && r->is_array() && std::find(r->begin(), r->end(), key) != r->end();
      };
      for (auto it = value.begin(); it != value.end(); ++it) {
        if (p->contains(it.key())) {
          MOE_TRY(CheckAgainstSchema(it.value(), (*p)[it.key()], path + "." + it.key()));
        } else if (!required_elsewhere(it.key())) {
          return Fail(Error::InvalidArgument(path + ": undeclared property '" + it.key() + "'"));
        }
      }
    }
    if (auto r = schema.find("required"); r != schema.end() && r->is_array())
      for (const auto& k : *r)
        if (k.is_string() && !value.contains(k.get<std::string>()))
          return Fail(Error::InvalidArgument(path + ": required property '" + k.get<std::string>() + "' is missing"));
  }
  if (value.is_array()) {
    if (auto items = schema.find("items"); items != schema.end())
      for (size_t i = 0; i < value.size(); ++i)
        MOE_TRY(CheckAgainstSchema(value[i], *items, path + "[" + std::to_string(i) + "]"));
  }
  return Ok();
}

}  // namespace moeserve::daemon
