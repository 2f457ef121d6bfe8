// The BPE model: a word's characters merged pair by pair, always the pair of
// lowest merge rank first and the leftmost of equal ranks (Word::merge_all in
// the `tokenizers` crate: a heap of candidate pairs over a linked list of
// symbols, so a long word costs n log n, not n^2).
#include <atomic>
#include <bit>
#include <algorithm>

#include "hf_tokenizer/pipeline.hpp"

namespace moeserve::engine::hf {

namespace {

uint64_t PairKey(int left, int right) { return MergeTable::Key(left, right); }

// Words already tokenized, per thread (Encode is const and shared): natural
// text repeats its words, and BPE of a word is most of the cost. Bounded by
// clearing; long words are not kept.
constexpr size_t kCacheEntries = 1 << 16;
constexpr size_t kCacheWordBytes = 256;
struct WordCache {
  uint64_t owner = 0;
  std::unordered_map<std::string, std::vector<int>, StringHash, std::equal_to<>> words;
};
thread_local WordCache word_cache;
std::atomic<uint64_t> next_instance{1};

struct Candidate {
  uint32_t rank;
  size_t pos;
  int new_id;
  // std::priority_queue pops the largest: make the lowest rank, then the leftmost, largest.
  bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

}  // namespace

void MergeTable::Reserve(size_t n) {
  size_t capacity = 16;
  while (capacity < 2 * n) capacity *= 2;
  if (capacity <= keys_.size()) return;
  std::vector<uint64_t> old_keys = std::move(keys_);
  std::vector<Merge> old_values = std::move(values_);
  keys_.assign(capacity, kEmpty);
  values_.assign(capacity, Merge{});
  mask_ = capacity - 1;
  shift_ = 64 - std::countr_zero(capacity);
  size_ = 0;
  for (size_t i = 0; i < old_keys.size(); ++i) {
    if (old_keys[i] != kEmpty) Set(old_keys[i], old_values[i]);
  }
}

void MergeTable::Set(uint64_t key, Merge merge) {
  if (2 * (size_ + 1) > keys_.size()) Reserve(size_ + 1);
  for (size_t i = Slot(key);; i = (i + 1) & mask_) {
    if (keys_[i] == key) {
      values_[i] = merge;
      return;
    }
    if (keys_[i] == kEmpty) {
      keys_[i] = key;
      values_[i] = merge;
      ++size_;
      return;
    }
  }
}

Bpe::Bpe() : instance_(next_instance.fetch_add(1)) {}

void Bpe::IndexCharacters() {
  char_ids_.assign(0x800, -1);
  std::string utf8;
  for (uint32_t cp = 0; cp < 0x800; ++cp) {
    utf8.clear();
    if (cp < 0x80) {
      utf8 += static_cast<char>(cp);
    } else {
      utf8 += static_cast<char>(0xC0 | (cp >> 6));
      utf8 += static_cast<char>(0x80 | (cp & 0x3F));
    }
    if (auto it = vocab.find(utf8); it != vocab.end()) char_ids_[cp] = it->second;
  }
}

void Bpe::Tokenize(std::string_view word, std::vector<int>& ids) const {
  if (word.empty()) return;
  WordCache& cache = word_cache;
  if (cache.owner != instance_) {
    cache.words.clear();
    cache.owner = instance_;
  }
  const bool cacheable = word.size() <= kCacheWordBytes;
  if (cacheable) {
    if (auto hit = cache.words.find(word); hit != cache.words.end()) {
      ids.insert(ids.end(), hit->second.begin(), hit->second.end());
      return;
    }
  }
  const size_t first = ids.size();
  TokenizeUncached(word, ids);
  if (cacheable) {
    if (cache.words.size() >= kCacheEntries) cache.words.clear();
    cache.words.emplace(std::string(word), std::vector<int>(ids.begin() + static_cast<std::ptrdiff_t>(first), ids.end()));
  }
}

void Bpe::TokenizeUncached(std::string_view word, std::vector<int>& ids) const {
  if (ignore_merges) {
    auto it = vocab.find(word);
    if (it != vocab.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  thread_local std::vector<int> symbols;
  symbols.clear();
  bool last_was_unk = false;
  for (size_t i = 0; i < word.size();) {
    const auto lead = static_cast<unsigned char>(word[i]);
    size_t n = std::min(Utf8Length(lead), word.size() - i);
    int id = -1;
    if (n <= 2 && !char_ids_.empty()) {
      // One- and two-byte characters (every byte-level char) from a table, not the hash map.
      uint32_t cp = n == 1 ? lead : ((lead & 0x1Fu) << 6) | (static_cast<unsigned char>(word[i + 1]) & 0x3Fu);
      id = char_ids_[cp];
    } else if (auto it = vocab.find(word.substr(i, n)); it != vocab.end()) {
      id = it->second;
    }
    i += n;
    if (id >= 0) {
      symbols.push_back(id);
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
  if (n <= kShortWord) {
    MergeShort(symbols);
    return;
  }
  // Scratch reused across words on this thread: a word's merge needs no allocation.
  thread_local std::vector<int64_t> prev, next;
  thread_local std::vector<char> removed;
  thread_local std::vector<Candidate> heap;
  prev.resize(n);
  next.resize(n);
  removed.assign(n, 0);
  heap.clear();
  auto push = [](Candidate c) {
    heap.push_back(c);
    std::push_heap(heap.begin(), heap.end());
  };
  for (size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int64_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int64_t>(i + 1) : -1;
  }
  for (size_t i = 0; i + 1 < n; ++i) {
    if (const Merge* m = merges.Find(PairKey(symbols[i], symbols[i + 1]))) heap.push_back({m->rank, i, m->new_id});
  }
  std::make_heap(heap.begin(), heap.end());
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    Candidate top = heap.back();
    heap.pop_back();
    if (removed[top.pos] || next[top.pos] < 0) continue;
    size_t right = static_cast<size_t>(next[top.pos]);
    // A stale entry: one of the two symbols has been merged since it was queued.
    const Merge* current = merges.Find(PairKey(symbols[top.pos], symbols[right]));
    if (!current || current->new_id != top.new_id) continue;

    symbols[top.pos] = top.new_id;
    removed[right] = 1;
    next[top.pos] = next[right];
    if (next[right] >= 0) prev[static_cast<size_t>(next[right])] = static_cast<int64_t>(top.pos);

    if (prev[top.pos] >= 0) {
      size_t p = static_cast<size_t>(prev[top.pos]);
      if (const Merge* m = merges.Find(PairKey(symbols[p], symbols[top.pos]))) push({m->rank, p, m->new_id});
    }
    if (next[top.pos] >= 0) {
      const Merge* m = merges.Find(PairKey(symbols[top.pos], symbols[static_cast<size_t>(next[top.pos])]));
      if (m) push({m->rank, top.pos, m->new_id});
    }
  }
  size_t kept = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!removed[i]) symbols[kept++] = symbols[i];
  }
  symbols.resize(kept);
}

// The same order of merges for a short word without the heap: each round
// merges the pair of lowest rank, the leftmost of equal ranks, which is the
// pair the heap would pop next (a stale heap entry is never a current pair).
void Bpe::MergeShort(std::vector<int>& symbols) const {
  while (symbols.size() >= 2) {
    const Merge* best = nullptr;
    size_t best_pos = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      const Merge* m = merges.Find(PairKey(symbols[i], symbols[i + 1]));
      if (m && (!best || m->rank < best->rank)) {
        best = m;
        best_pos = i;
      }
    }
    if (!best) return;
    symbols[best_pos] = best->new_id;
    symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(best_pos) + 1);
  }
}

}  // namespace moeserve::engine::hf
