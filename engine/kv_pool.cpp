#include "moeserve/engine/kv_pool.hpp"

#include <cstring>
#include <new>
#include <stdexcept>
#include <utility>
#include <string>

#include "moeserve/kernels/weight_memory.hpp"

namespace moeserve::engine {

namespace {
// The pool's bytes, or bad_alloc when they do not fit in size_t.
size_t PoolBytes(int64_t num_blocks, int block_tokens, size_t floats_per_token) {
  size_t bytes = 0;
  if (num_blocks < 0 || block_tokens < 0 ||
      __builtin_mul_overflow(static_cast<size_t>(num_blocks), static_cast<size_t>(block_tokens), &bytes) ||
      __builtin_mul_overflow(bytes, floats_per_token * sizeof(float), &bytes))
    throw std::bad_alloc();
  return bytes;
}

float* MapPool(size_t bytes) {
  void* p = kernels::AllocateZeroedPages(bytes);
  if (p == nullptr) throw std::bad_alloc();
  return static_cast<float*>(p);
}

}  // namespace

// Each stripe's (start, width), checked: ascending starts from 0, all inside
// the row. Empty starts: the whole row as one stripe.
std::vector<std::pair<size_t, size_t>> KvPool::StripeSpans(size_t floats_per_token, const std::vector<size_t>& starts) {
  if (starts.empty()) return {{0, floats_per_token}};
  if (starts.front() != 0) throw std::invalid_argument("KV pool stripes must start at float 0");
  std::vector<std::pair<size_t, size_t>> spans;
  for (size_t i = 0; i < starts.size(); ++i) {
    const size_t end = i + 1 < starts.size() ? starts[i + 1] : floats_per_token;
    if (end <= starts[i])
      throw std::invalid_argument("KV pool stripe starts must ascend inside the row's " + std::to_string(floats_per_token) +
                                  " floats (stripe " + std::to_string(i) + " starts at " + std::to_string(starts[i]) + ")");
    spans.emplace_back(starts[i], end - starts[i]);
  }
  return spans;
}

// The mapping comes first: it is by far the largest allocation, so a pool the
// machine cannot hold fails there, as an error, before the per-block tables
// are sized (a throwing operator new of an impossible size aborts under
// AddressSanitizer instead of throwing). The stripes are checked before it.
KvPool::KvPool(int64_t num_blocks, int block_tokens, size_t floats_per_token, const std::vector<size_t>& stripe_starts)
    : KvPool(num_blocks, block_tokens, floats_per_token, StripeSpans(floats_per_token, stripe_starts)) {}

KvPool::KvPool(int64_t num_blocks, int block_tokens, size_t floats_per_token,
               const std::vector<std::pair<size_t, size_t>>& spans)
    : block_tokens_(block_tokens),
      floats_per_token_(floats_per_token),
      bytes_(PoolBytes(num_blocks, block_tokens, floats_per_token)),
      data_(MapPool(bytes_)) {
  try {
    // Stripe s's region holds every block's share of it: it starts where the
    // stripes before it end, num_blocks x block_tokens x their widths.
    const size_t tokens = static_cast<size_t>(num_blocks) * static_cast<size_t>(block_tokens);
    stripe_of_.assign(floats_per_token + 1, 0);
    for (const auto& [start, floats] : spans) {
      stripes_.push_back({start, floats, data_ + tokens * start});
      for (size_t o = start; o <= start + floats; ++o) stripe_of_[o] = static_cast<uint32_t>(stripes_.size() - 1);
    }
    refs_.assign(static_cast<size_t>(num_blocks), 0);
    free_.reserve(static_cast<size_t>(num_blocks));
  } catch (...) {
    kernels::FreeZeroedPages(data_, bytes_);  // the destructor does not run for a throwing constructor
    throw;
  }
  // Hand out low block ids first (stack order): a sequence that grows in a
  // fresh pool gets consecutive blocks, so each stripe of it is one stream.
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int>(b));
}

KvPool::~KvPool() { kernels::FreeZeroedPages(data_, bytes_); }

Result<int> KvPool::Allocate() {
  if (free_.empty())
    return Fail(Error::ResourceExhausted("KV cache pool is full (" + std::to_string(num_blocks()) + " blocks of " +
                                         std::to_string(block_tokens_) + " tokens all in use)"));
  int b = free_.back();
  free_.pop_back();
  refs_[static_cast<size_t>(b)] = 1;
  return b;
}

void KvPool::Ref(int block) { ++refs_[static_cast<size_t>(block)]; }

void KvPool::Unref(int block) {
  int& r = refs_[static_cast<size_t>(block)];
  if (r > 0 && --r == 0) free_.push_back(block);
}

void KvPool::CopyBlockOut(int block, void* out) const {
  auto* to = static_cast<unsigned char*>(out);
  for (const Stripe& s : stripes_) {
    const size_t n = static_cast<size_t>(block_tokens_) * s.floats;
    std::memcpy(to, s.base + static_cast<size_t>(block) * n, n * sizeof(float));
    to += n * sizeof(float);
  }
}

void KvPool::CopyBlockIn(int block, const void* in) {
  const auto* from = static_cast<const unsigned char*>(in);
  for (const Stripe& s : stripes_) {
    const size_t n = static_cast<size_t>(block_tokens_) * s.floats;
    std::memcpy(s.base + static_cast<size_t>(block) * n, from, n * sizeof(float));
    from += n * sizeof(float);
  }
}

void KvPool::CopyBlock(int dst, int src) {
  for (const Stripe& s : stripes_) {
    const size_t n = static_cast<size_t>(block_tokens_) * s.floats;
    std::memcpy(s.base + static_cast<size_t>(dst) * n, s.base + static_cast<size_t>(src) * n, n * sizeof(float));
  }
}

Status EnsureBlocks(KvPool& pool, SequenceCache& cache, int64_t new_length) {
  const int64_t needed = (new_length + pool.block_tokens() - 1) / pool.block_tokens();
  while (static_cast<int64_t>(cache.blocks.size()) < needed) {
    MOE_ASSIGN_OR_RETURN(int b, pool.Allocate());
    cache.blocks.push_back(b);
  }
  return Ok();
}

void ReleaseBlocks(KvPool& pool, SequenceCache& cache) {
  for (int b : cache.blocks) pool.Unref(b);
  cache.blocks.clear();
}

}  // namespace moeserve::engine
