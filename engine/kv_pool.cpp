#include "moeserve/engine/kv_pool.hpp"

#include <new>
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

// The mapping comes first: it is by far the largest allocation, so a pool the
// machine cannot hold fails there, as an error, before the per-block tables
// are sized (a throwing operator new of an impossible size aborts under
// AddressSanitizer instead of throwing).
KvPool::KvPool(int64_t num_blocks, int block_tokens, size_t floats_per_token)
    : block_tokens_(block_tokens),
      floats_per_token_(floats_per_token),
      bytes_(PoolBytes(num_blocks, block_tokens, floats_per_token)),
      data_(MapPool(bytes_)) {
  try {
    refs_.assign(static_cast<size_t>(num_blocks), 0);
    free_.reserve(static_cast<size_t>(num_blocks));
  } catch (...) {
    kernels::FreeZeroedPages(data_, bytes_);  // the destructor does not run for a throwing constructor
    throw;
  }
  // Hand out low block ids first (stack order).
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
