// The top k scores of a stream of scores that arrives in position order (the
// DSA indexer's tiles of cached keys), ties to the lower position (-0 and +0
// tie): the same selection as TopKIndicesRef over all the scores at once,
// bit for bit, with scratch bounded by 2k entries whatever the stream's length.
//
// Why: the radix select (TopKIndicesRef) reads every score four times and
// was as costly as scoring the keys with a small indexer (~5 ns a score). Here
// a score is compared once against a threshold (the k-th best held so far;
// AVX-512: 16 at once, the few above compress-stored) and nearly all are
// rejected by that compare; those that can enter are appended to a buffer
// which, at 2k entries, is cut back to its best k (nth_element over the
// entries' exact order: score, then the lower position). A later position
// loses a tie, so a score equal to the threshold never enters: the compare
// is a strict "greater than". Worst case (an ascending stream: every score
// enters) a cut per k scores, O(n) still. Unseeded, short streams (under
// ~64k scores) would cost more than the radix select, the first 2k all
// entering: so a first Push of at least 4k scores seeds a lower bound on the
// k-th score from them (the k-th of 2k group maxima, or the exact k-th from
// topk_binned.hpp when the groups would be small), and only ~2.5k enter.
//
// Thread safety: one object per thread; no shared state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace moeserve::kernels {

class TopKStream {
 public:
  // Starts a selection of the best k (>= 1) of the scores pushed next.
  void Reset(int k);
  // The scores of positions [first, first + n); first is at least the end of
  // the previous push (positions ascend across calls). Scores are not NaN.
  void Push(const float* scores, int n, int first);
  // A bound known to have at least k scores at or above it (among this
  // stream's, or among all the streams FinishMerged will merge): a score
  // below it never enters; one equal to it may (it can win a tie at a lower
  // position). Any time; ignored for -inf or a bound below the last one.
  // Streams share what each has learnt through LowerBound(): k of all their
  // scores are at or above it (-inf until the stream has a threshold).
  void RaiseLowerBound(float bound);
  float LowerBound() const;
  // Writes the best min(k, pushed) positions, ascending; returns how many.
  int Finish(int* out);
  // Finish for several streams, each Reset with the same k, over ascending
  // disjoint position ranges (every position of streams[i] below those of
  // streams[i + 1]): the selection one stream over all their scores makes.
  // Why: a long context's scores split in ranges across threads, each kept
  // by its own stream while its scores are still in cache (a decode step's
  // indexer at 1M tokens), then merged from at most k entries a stream.
  static int FinishMerged(std::span<TopKStream> streams, int* out);

 private:
  static constexpr int kBlock = 16;  // scores compared at once
  size_t Capacity() const { return 2 * static_cast<size_t>(k_); }  // entries held before a cut
  void Cut();  // keeps the best k of buf_ (in position order), raises the threshold
  void SeedFrom(const float* scores, int n);  // RaiseLowerBound from n >= 4k scores about to be pushed
  int k_ = 0;
  size_t size_ = 0;  // entries held in buf_
  bool full_ = false;   // k entries held after a cut: the threshold applies
  float threshold_ = 0; // the k-th best score held after the last cut, or floor_ if higher
  float floor_ = -std::numeric_limits<float>::infinity();  // RaiseLowerBound's: only scores above it enter
  // (order key << 32 | ~position): larger is better, unique; in position order.
  std::vector<uint64_t> buf_, scratch_;
  std::vector<float> maxima_;  // SeedFrom's group maxima
};

// TopKIndices (attention.hpp) through a TopKStream: the same selection.
void TopKIndicesStreamed(const float* scores, int n, int k, int* out);

}  // namespace moeserve::kernels
