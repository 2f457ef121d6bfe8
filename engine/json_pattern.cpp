#include "moeserve/engine/json_pattern.hpp"

#include <algorithm>
#include <bitset>
#include <cctype>
#include <map>
#include <string>

namespace moeserve::engine {

namespace {

using CharSet = std::bitset<128>;

constexpr int kMaxRepeat = 64;
constexpr size_t kMaxNfaStates = 8192;
constexpr size_t kMaxDfaStates = 512;

// The pattern as a tree: a set of characters, a sequence, a choice or a
// repetition.
struct Node {
  enum Kind { kChars, kConcat, kAlt, kRepeat } kind = kConcat;
  CharSet chars;
  std::vector<Node> children;
  int min = 0, max = 0;  // kRepeat; max -1: unbounded
};

CharSet Range(int lo, int hi) {
  CharSet s;
  for (int c = lo; c <= hi; ++c) s.set(static_cast<size_t>(c));
  return s;
}

CharSet Digits() { return Range('0', '9'); }
CharSet Word() { return Range('a', 'z') | Range('A', 'Z') | Digits() | Range('_', '_'); }
CharSet Space() { return Range(' ', ' ') | Range('\t', '\r'); }
CharSet All() { return Range(0, 127); }

class Parser {
 public:
  explicit Parser(std::string_view p) : p_(p) {}

  Result<Node> ParseAll() {
    auto n = Alt();
    if (!n) return n;
    if (pos_ != p_.size()) return Refuse("unbalanced ')'");
    return n;
  }

 private:
  Status RefuseStatus(const std::string& why) const {
    return Fail(Error::InvalidArgument("pattern: " + why + " (at offset " + std::to_string(pos_) + ")"));
  }
  Result<Node> Refuse(const std::string& why) const { return Fail(RefuseStatus(why).error()); }
  bool More() const { return pos_ < p_.size(); }
  char Peek() const { return p_[pos_]; }

  Result<Node> Alt() {
    Node alt;
    alt.kind = Node::kAlt;
    while (true) {
      auto c = Concat();
      if (!c) return c;
      alt.children.push_back(std::move(*c));
      if (More() && Peek() == '|') {
        ++pos_;
        continue;
      }
      break;
    }
    if (alt.children.size() == 1) return std::move(alt.children[0]);
    return alt;
  }

  Result<Node> Concat() {
    Node seq;
    seq.kind = Node::kConcat;
    while (More() && Peek() != '|' && Peek() != ')') {
      auto atom = Atom();
      if (!atom) return atom;
      auto rep = Quantified(std::move(*atom));
      if (!rep) return rep;
      seq.children.push_back(std::move(*rep));
    }
    return seq;
  }

  // {n}, {n,}, {n,m}: true and the bounds, or false when `{` is a literal.
  bool Braces(int* lo, int* hi) {
    size_t i = pos_ + 1;
    auto number = [&](int* out) {
      size_t start = i;
      long v = 0;
      while (i < p_.size() && p_[i] >= '0' && p_[i] <= '9' && v < 100000) v = v * 10 + (p_[i++] - '0');
      *out = static_cast<int>(v);
      return i > start;
    };
    if (!number(lo)) return false;
    *hi = *lo;
    if (i < p_.size() && p_[i] == ',') {
      ++i;
      if (!number(hi)) *hi = -1;
    }
    if (i >= p_.size() || p_[i] != '}') return false;
    pos_ = i + 1;
    return true;
  }

  Result<Node> Quantified(Node atom) {
    if (!More()) return atom;
    int lo = 0, hi = 0;
    char c = Peek();
    if (c == '*') lo = 0, hi = -1, ++pos_;
    else if (c == '+') lo = 1, hi = -1, ++pos_;
    else if (c == '?') lo = 0, hi = 1, ++pos_;
    else if (c == '{' && Braces(&lo, &hi)) {
      if (lo > kMaxRepeat || hi > kMaxRepeat) return Refuse("a repetition count above " + std::to_string(kMaxRepeat));
      if (hi >= 0 && hi < lo) return Refuse("a repetition {n,m} with m below n");
    } else {
      return atom;
    }
    if (More() && Peek() == '?') ++pos_;  // lazy: the same set of strings
    if (More() && (Peek() == '*' || Peek() == '+' || Peek() == '?' || Peek() == '{'))
      if (Peek() != '{' || p_.find('}', pos_) != std::string_view::npos) return Refuse("a quantifier after a quantifier");
    Node r;
    r.kind = Node::kRepeat;
    r.min = lo;
    r.max = hi;
    r.children.push_back(std::move(atom));
    return r;
  }

  static Node Chars(CharSet s) {
    Node n;
    n.kind = Node::kChars;
    n.chars = s;
    return n;
  }

  // An escape after `\`: its characters, or an error.
  Result<CharSet> Escape(bool in_class) {
    if (!More()) return Fail(RefuseStatus("a pattern ending in '\\'").error());
    const char c = p_[pos_++];
    switch (c) {
      case 'd': return Digits();
      case 'D': return All() & ~Digits();
      case 'w': return Word();
      case 'W': return All() & ~Word();
      case 's': return Space();
      case 'S': return All() & ~Space();
      case 'n': return Range('\n', '\n');
      case 't': return Range('\t', '\t');
      case 'r': return Range('\r', '\r');
      case 'f': return Range('\f', '\f');
      case 'v': return Range('\v', '\v');
      case 'x':
      case 'u': {
        const size_t digits = c == 'x' ? 2 : 4;
        if (pos_ + digits > p_.size()) return Fail(RefuseStatus("a short \\x or \\u escape").error());
        unsigned v = 0;
        for (size_t i = 0; i < digits; ++i) {
          const char h = p_[pos_ + i];
          const int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
          if (d < 0) return Fail(RefuseStatus("a malformed \\x or \\u escape").error());
          v = v * 16 + static_cast<unsigned>(d);
        }
        pos_ += digits;
        if (v >= 0x80) return Fail(RefuseStatus("a character outside ASCII").error());
        return Range(static_cast<int>(v), static_cast<int>(v));
      }
      case 'b':
        if (in_class) return Range('\b', '\b');
        return Fail(RefuseStatus("word boundaries (\\b) are not supported").error());
      default:
        if (c >= '1' && c <= '9') return Fail(RefuseStatus("backreferences are not supported").error());
        if (std::isalnum(static_cast<unsigned char>(c)))
          return Fail(RefuseStatus(std::string("the escape \\") + c + " is not supported").error());
        if (static_cast<unsigned char>(c) >= 0x80) return Fail(RefuseStatus("a character outside ASCII").error());
        return Range(static_cast<unsigned char>(c), static_cast<unsigned char>(c));
    }
  }

  Result<Node> Class() {
    ++pos_;  // [
    bool negate = false;
    if (More() && Peek() == '^') negate = true, ++pos_;
    CharSet set;
    bool first = true;
    while (true) {
      if (!More()) return Refuse("an unterminated character class");
      char c = Peek();
      if (c == ']' && !first) {
        ++pos_;
        break;
      }
      first = false;
      CharSet item;
      int single = -1;
      ++pos_;
      if (c == '\\') {
        auto e = Escape(true);
        if (!e) return Fail(e.error());
        item = *e;
        if (item.count() == 1)
          for (int i = 0; i < 128; ++i)
            if (item.test(static_cast<size_t>(i))) single = i;
      } else {
        if (static_cast<unsigned char>(c) >= 0x80) return Refuse("a character outside ASCII");
        single = static_cast<unsigned char>(c);
        item = Range(single, single);
      }
      // a range a-b (a '-' last or first is itself)
      if (single >= 0 && pos_ + 1 < p_.size() && Peek() == '-' && p_[pos_ + 1] != ']') {
        ++pos_;
        int hi;
        char h = p_[pos_++];
        if (h == '\\') {
          auto e = Escape(true);
          if (!e) return Fail(e.error());
          if (e->count() != 1) return Refuse("a range ending in a class escape");
          hi = 0;
          for (int i = 0; i < 128; ++i)
            if (e->test(static_cast<size_t>(i))) hi = i;
        } else {
          if (static_cast<unsigned char>(h) >= 0x80) return Refuse("a character outside ASCII");
          hi = static_cast<unsigned char>(h);
        }
        if (hi < single) return Refuse("a range out of order");
        item = Range(single, hi);
      }
      set |= item;
    }
    return Chars(negate ? (All() & ~set) : set);
  }

  Result<Node> Atom() {
    const char c = Peek();
    if (c == '(') {
      ++pos_;
      if (More() && Peek() == '?') {
        if (pos_ + 1 < p_.size() && p_[pos_ + 1] == ':') pos_ += 2;
        else return Refuse("lookaround and named groups are not supported");
      }
      auto inner = Alt();
      if (!inner) return inner;
      if (!More() || Peek() != ')') return Refuse("an unclosed '('");
      ++pos_;
      return inner;
    }
    if (c == '[') return Class();
    if (c == '.') {
      ++pos_;
      return Chars(All() & ~(Range('\n', '\n') | Range('\r', '\r')));
    }
    if (c == '\\') {
      ++pos_;
      auto e = Escape(false);
      if (!e) return Fail(e.error());
      return Chars(*e);
    }
    if (c == '^' || c == '$') return Refuse("'^' and '$' are supported only at the start and the end");
    if (c == '*' || c == '+' || c == '?') return Refuse("a quantifier with nothing to repeat");
    if (static_cast<unsigned char>(c) >= 0x80) return Refuse("a character outside ASCII");
    ++pos_;
    return Chars(Range(static_cast<unsigned char>(c), static_cast<unsigned char>(c)));
  }

  std::string_view p_;
  size_t pos_ = 0;
};

// Thompson NFA: each state has character edges (one set, one target) and
// epsilon edges.
struct Nfa {
  struct State {
    CharSet chars;
    int out = -1;
    std::vector<int> eps;
  };
  std::vector<State> states;
  bool too_large = false;

  int Add() {
    if (states.size() >= kMaxNfaStates) too_large = true;
    states.push_back({});
    return static_cast<int>(states.size()) - 1;
  }
  // Builds `n` between a new start and end; returns {start, end}.
  std::pair<int, int> Build(const Node& n) {
    if (too_large) {
      int s = Add();
      return {s, s};
    }
    switch (n.kind) {
      case Node::kChars: {
        int s = Add(), e = Add();
        states[static_cast<size_t>(s)].chars = n.chars;
        states[static_cast<size_t>(s)].out = e;
        return {s, e};
      }
      case Node::kConcat: {
        int s = Add(), cur = s;
        for (const auto& c : n.children) {
          auto [cs, ce] = Build(c);
          states[static_cast<size_t>(cur)].eps.push_back(cs);
          cur = ce;
        }
        return {s, cur};
      }
      case Node::kAlt: {
        int s = Add(), e = Add();
        for (const auto& c : n.children) {
          auto [cs, ce] = Build(c);
          states[static_cast<size_t>(s)].eps.push_back(cs);
          states[static_cast<size_t>(ce)].eps.push_back(e);
        }
        return {s, e};
      }
      case Node::kRepeat: {
        int s = Add(), cur = s;
        const Node& body = n.children[0];
        for (int i = 0; i < n.min; ++i) {
          auto [cs, ce] = Build(body);
          states[static_cast<size_t>(cur)].eps.push_back(cs);
          cur = ce;
        }
        if (n.max < 0) {
          auto [cs, ce] = Build(body);
          int e = Add();
          states[static_cast<size_t>(cur)].eps.push_back(cs);
          states[static_cast<size_t>(cur)].eps.push_back(e);
          states[static_cast<size_t>(ce)].eps.push_back(cs);
          states[static_cast<size_t>(ce)].eps.push_back(e);
          return {s, e};
        }
        int e = Add();
        states[static_cast<size_t>(cur)].eps.push_back(e);
        for (int i = n.min; i < n.max; ++i) {
          auto [cs, ce] = Build(body);
          states[static_cast<size_t>(cur)].eps.push_back(cs);
          states[static_cast<size_t>(ce)].eps.push_back(e);
          cur = ce;
        }
        return {s, e};
      }
    }
    return {0, 0};
  }

  std::vector<int> Closure(std::vector<int> set) const {
    std::vector<bool> seen(states.size());
    std::vector<int> stack = set, out;
    while (!stack.empty()) {
      int s = stack.back();
      stack.pop_back();
      if (seen[static_cast<size_t>(s)]) continue;
      seen[static_cast<size_t>(s)] = true;
      out.push_back(s);
      for (int e : states[static_cast<size_t>(s)].eps) stack.push_back(e);
    }
    std::sort(out.begin(), out.end());
    return out;
  }
};

}  // namespace

Result<std::shared_ptr<const PatternDfa>> PatternDfa::Compile(std::string_view pattern) {
  // Anchors: '^' first and an unescaped '$' last; otherwise that side is open.
  bool anchored_start = !pattern.empty() && pattern.front() == '^';
  if (anchored_start) pattern.remove_prefix(1);
  bool anchored_end = false;
  if (!pattern.empty() && pattern.back() == '$') {
    size_t backslashes = 0;
    while (backslashes + 1 < pattern.size() && pattern[pattern.size() - 2 - backslashes] == '\\') ++backslashes;
    if (backslashes % 2 == 0) {
      anchored_end = true;
      pattern.remove_suffix(1);
    }
  }
  if (anchored_start || anchored_end) {
    // "^a|b$" anchors each alternative, not the whole: refused.
    int depth = 0;
    bool in_class = false;
    for (size_t i = 0; i < pattern.size(); ++i) {
      char c = pattern[i];
      if (c == '\\') ++i;
      else if (in_class) in_class = c != ']';
      else if (c == '[') in_class = true;
      else if (c == '(') ++depth;
      else if (c == ')') --depth;
      else if (c == '|' && depth == 0)
        return Fail(Error::InvalidArgument("pattern: anchors with a top-level '|' are not supported; group the alternatives: ^(a|b)$"));
    }
  }
  auto tree = Parser(pattern).ParseAll();
  if (!tree) return Fail(tree.error());
  Node whole;
  whole.kind = Node::kConcat;
  Node any;
  any.kind = Node::kRepeat;
  any.min = 0;
  any.max = -1;
  any.children.push_back([] {
    Node n;
    n.kind = Node::kChars;
    n.chars = All();
    return n;
  }());
  if (!anchored_start) whole.children.push_back(any);
  whole.children.push_back(std::move(*tree));
  if (!anchored_end) whole.children.push_back(any);

  Nfa nfa;
  auto [start, accept] = nfa.Build(whole);
  if (nfa.too_large) return Fail(Error::InvalidArgument("pattern: too large to enforce (repetitions expand too far)"));

  // Subset construction over the printable characters.
  auto dfa = std::make_shared<PatternDfa>();
  std::map<std::vector<int>, int> ids;
  std::vector<std::vector<int>> sets = {nfa.Closure({start})};
  ids[sets[0]] = 0;
  for (size_t i = 0; i < sets.size(); ++i) {
    if (sets.size() > kMaxDfaStates)
      return Fail(Error::InvalidArgument("pattern: too complex to enforce (more than " + std::to_string(kMaxDfaStates) + " states)"));
    std::array<int, 95> row;
    row.fill(kDead);
    for (int c = 0x20; c <= 0x7E; ++c) {
      std::vector<int> moved;
      for (int s : sets[i])
        if (nfa.states[static_cast<size_t>(s)].chars.test(static_cast<size_t>(c))) moved.push_back(nfa.states[static_cast<size_t>(s)].out);
      if (moved.empty()) continue;
      auto closure = nfa.Closure(std::move(moved));
      auto [it, inserted] = ids.emplace(closure, static_cast<int>(sets.size()));
      if (inserted) sets.push_back(closure);
      row[static_cast<size_t>(c - 0x20)] = it->second;
    }
    dfa->next_.push_back(row);
    dfa->accepting_.push_back(std::binary_search(sets[i].begin(), sets[i].end(), accept));
  }
  // Fewest bytes to an accepting state (Bellman-Ford; edges cost 1, or 2
  // for the characters JSON escapes).
  const size_t n = dfa->next_.size();
  dfa->bytes_to_accept_.assign(n, kUnreachable);
  for (size_t s = 0; s < n; ++s)
    if (dfa->accepting_[s]) dfa->bytes_to_accept_[s] = 0;
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t s = 0; s < n; ++s)
      for (int c = 0x20; c <= 0x7E; ++c) {
        const int t = dfa->next_[s][static_cast<size_t>(c - 0x20)];
        if (t == kDead || dfa->bytes_to_accept_[static_cast<size_t>(t)] == kUnreachable) continue;
        const int cost = dfa->bytes_to_accept_[static_cast<size_t>(t)] + (c == '"' || c == '\\' ? 2 : 1);
        if (cost < dfa->bytes_to_accept_[s]) dfa->bytes_to_accept_[s] = cost, changed = true;
      }
  }
  if (dfa->bytes_to_accept_[0] == kUnreachable)
    return Fail(Error::InvalidArgument("pattern: no string of printable ASCII characters matches it"));
  // Transitions into states that cannot reach acceptance are dead ends.
  for (auto& row : dfa->next_)
    for (int& t : row)
      if (t != kDead && dfa->bytes_to_accept_[static_cast<size_t>(t)] == kUnreachable) t = kDead;
  return std::shared_ptr<const PatternDfa>(std::move(dfa));
}

bool PatternDfa::Matches(std::string_view s) const {
  int state = start();
  for (char c : s) {
    state = Next(state, c);
    if (state == kDead) return false;
  }
  return Accepting(state);
}

}  // namespace moeserve::engine
