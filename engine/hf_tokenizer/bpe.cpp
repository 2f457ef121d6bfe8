// The BPE model: a word's characters merged pair by pair, always the pair of
// lowest merge rank first and the leftmost of equal ranks (Word::merge_all in
// the `tokenizers` crate: a heap of candidate pairs over a linked list of
// symbols, so a long word costs n log n, not n^2).
#include <queue>

#include "hf_tokenizer/pipeline.hpp"

namespace moeserve::engine::hf {

namespace {

uint64_t PairKey(int left, int right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

struct Candidate {
  uint32_t rank;
  size_t pos;
  int new_id;
  // std::priority_queue pops the largest: make the lowest rank, then the leftmost, largest.
  bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

}  // namespace

void Bpe::Tokenize(std::string_view word, std::vector<int>& ids) const {
  if (word.empty()) return;
  if (ignore_merges) {
    auto it = vocab.find(word);
    if (it != vocab.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  std::vector<int> symbols;
  symbols.reserve(word.size());
  bool last_was_unk = false;
  for (size_t i = 0; i < word.size();) {
    size_t n = std::min(Utf8Length(static_cast<unsigned char>(word[i])), word.size() - i);
    auto it = vocab.find(word.substr(i, n));
    i += n;
    if (it != vocab.end()) {
      symbols.push_back(it->second);
      last_was_unk = false;
    } else if (unk_id >= 0) {
      // Unknown characters become the unk token, a run of them one token when fuse_unk.
      if (!(fuse_unk && last_was_unk)) symbols.push_back(unk_id);
      last_was_unk = true;
    }
    // Without an unk token an unknown character is dropped, as the library does.
  }
  MergeAll(symbols);
  ids.insert(ids.end(), symbols.begin(), symbols.end());
}

void Bpe::MergeAll(std::vector<int>& symbols) const {
  const size_t n = symbols.size();
  if (n < 2) return;
  std::vector<int64_t> prev(n), next(n);
  std::vector<bool> removed(n, false);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int64_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int64_t>(i + 1) : -1;
  }
  std::priority_queue<Candidate> queue;
  for (size_t i = 0; i + 1 < n; ++i) {
    auto it = merges.find(PairKey(symbols[i], symbols[i + 1]));
    if (it != merges.end()) queue.push({it->second.rank, i, it->second.new_id});
  }
  while (!queue.empty()) {
    Candidate top = queue.top();
    queue.pop();
    if (removed[top.pos] || next[top.pos] < 0) continue;
    size_t right = static_cast<size_t>(next[top.pos]);
    // A stale entry: one of the two symbols has been merged since it was queued.
    auto current = merges.find(PairKey(symbols[top.pos], symbols[right]));
    if (current == merges.end() || current->second.new_id != top.new_id) continue;

    symbols[top.pos] = top.new_id;
    removed[right] = true;
    next[top.pos] = next[right];
    if (next[right] >= 0) prev[static_cast<size_t>(next[right])] = static_cast<int64_t>(top.pos);

    if (prev[top.pos] >= 0) {
      size_t p = static_cast<size_t>(prev[top.pos]);
      auto it = merges.find(PairKey(symbols[p], symbols[top.pos]));
      if (it != merges.end()) queue.push({it->second.rank, p, it->second.new_id});
    }
    if (next[top.pos] >= 0) {
      auto it = merges.find(PairKey(symbols[top.pos], symbols[static_cast<size_t>(next[top.pos])]));
      if (it != merges.end()) queue.push({it->second.rank, top.pos, it->second.new_id});
    }
  }
  size_t kept = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!removed[i]) symbols[kept++] = symbols[i];
  }
  symbols.resize(kept);
}

}  // namespace moeserve::engine::hf
