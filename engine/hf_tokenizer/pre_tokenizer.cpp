// Pre-tokenizers: Split (NormalizedString::split with its five behaviours)
// and ByteLevel, as the `tokenizers` crate runs them.
#include "hf_tokenizer/pipeline.hpp"

namespace moeserve::engine::hf {

namespace {

struct Span {
  size_t start, end;
  bool flag;  // is a match (before the behaviour), removed (after)
};

// The GPT-2 pattern ByteLevel splits with when use_regex is true.
const Regex& Gpt2Regex() {
  static const std::unique_ptr<Regex> regex = [] {
    std::string error;
    return Regex::Compile(R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)", error);
  }();
  return *regex;
}

// Pattern::find_matches: every byte of text in one span, matches flagged.
std::vector<Span> FindMatches(const SplitStep& step, std::string_view text) {
  if (text.empty()) return {{0, 0, false}};
  std::vector<std::pair<size_t, size_t>> found;
  if (step.regex) {
    step.regex->FindAll(text, found);
  } else {
    for (size_t pos = text.find(step.literal); pos != std::string_view::npos;
         pos = text.find(step.literal, pos + step.literal.size())) {
      found.emplace_back(pos, pos + step.literal.size());
    }
  }
  std::vector<Span> spans;
  size_t prev = 0;
  for (auto [start, end] : found) {
    if (prev != start) spans.push_back({prev, start, false});
    spans.push_back({start, end, true});
    prev = end;
  }
  if (prev != text.size()) spans.push_back({prev, text.size(), false});
  return spans;
}

// SplitDelimiterBehavior applied to flagged spans; the result's flag means "remove".
std::vector<Span> ApplyBehavior(std::vector<Span> matches, SplitBehavior behavior) {
  std::vector<Span> out;
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (Span& s : matches) s.flag = false;
      return matches;
    case SplitBehavior::kRemoved:
      return matches;
    case SplitBehavior::kContiguous:
      for (const Span& s : matches) {
        if (s.flag == previous_match && !out.empty()) {
          out.back().end = s.end;
        } else {
          out.push_back({s.start, s.end, false});
        }
        previous_match = s.flag;
      }
      return out;
    case SplitBehavior::kMergedWithPrevious:
      for (const Span& s : matches) {
        if (s.flag && !previous_match && !out.empty()) {
          out.back().end = s.end;
        } else {
          out.push_back({s.start, s.end, false});
        }
        previous_match = s.flag;
      }
      return out;
    case SplitBehavior::kMergedWithNext:
      for (auto it = matches.rbegin(); it != matches.rend(); ++it) {
        if (it->flag && !previous_match && !out.empty()) {
          out.back().start = it->start;
        } else {
          out.push_back({it->start, it->end, false});
        }
        previous_match = it->flag;
      }
      return {out.rbegin(), out.rend()};
  }
  return matches;
}

void RunSplit(const SplitStep& step, std::vector<std::string>& pieces) {
  std::vector<std::string> out;
  out.reserve(pieces.size());
  for (const std::string& piece : pieces) {
    std::vector<Span> spans = FindMatches(step, piece);
    if (step.invert) {
      for (Span& s : spans) s.flag = !s.flag;
    }
    for (const Span& s : ApplyBehavior(std::move(spans), step.behavior)) {
      if (!s.flag && s.end > s.start) out.emplace_back(piece, s.start, s.end - s.start);
    }
  }
  pieces = std::move(out);
}

void RunByteLevel(const ByteLevelStep& step, std::vector<std::string>& pieces) {
  std::vector<std::string> out;
  out.reserve(pieces.size());
  std::vector<std::pair<size_t, size_t>> found;
  auto emit = [&](std::string_view text) {
    if (text.empty()) return;
    std::string mapped;
    mapped.reserve(text.size() * 2);
    for (char c : text) mapped += ByteLevelChar(static_cast<uint8_t>(c));
    out.push_back(std::move(mapped));
  };
  for (std::string& piece : pieces) {
    if (step.add_prefix_space && !piece.starts_with(' ')) piece.insert(piece.begin(), ' ');
    if (!step.use_regex) {
      emit(piece);
      continue;
    }
    found.clear();
    Gpt2Regex().FindAll(piece, found);
    size_t prev = 0;
    for (auto [start, end] : found) {
      emit(std::string_view(piece).substr(prev, start - prev));
      emit(std::string_view(piece).substr(start, end - start));
      prev = end;
    }
    emit(std::string_view(piece).substr(prev));
  }
  pieces = std::move(out);
}

}  // namespace

void PreTokenize(const std::vector<PreTokenizerStep>& steps, std::vector<std::string>& pieces) {
  for (const PreTokenizerStep& step : steps) {
    if (const auto* split = std::get_if<SplitStep>(&step)) {
      RunSplit(*split, pieces);
    } else {
      RunByteLevel(std::get<ByteLevelStep>(step), pieces);
    }
  }
  std::erase_if(pieces, [](const std::string& p) { return p.empty(); });
}

}  // namespace moeserve::engine::hf
