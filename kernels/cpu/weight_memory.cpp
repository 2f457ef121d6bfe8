#include "moeserve/kernels/weight_memory.hpp"

#include <algorithm>
#include <cstdint>
#include <new>
#include <utility>

#include <sys/mman.h>

namespace moeserve::kernels {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kArenaChunk = size_t{64} << 20;

}  // namespace

void* AllocateWeights(size_t bytes) {
  if (bytes < 2 * kHugePage) return ::operator new(std::max<size_t>(bytes, 1), std::align_val_t(64));
  const size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* p = ::operator new(rounded, std::align_val_t(kHugePage));
  ::madvise(p, rounded, MADV_HUGEPAGE);  // advice only: failure leaves 4 KiB pages
  return p;
}

void FreeWeights(void* p, size_t bytes) {
  if (bytes < 2 * kHugePage) return ::operator delete(p, std::align_val_t(64));
  ::operator delete(p, std::align_val_t(kHugePage));
}

void* AllocateZeroedPages(size_t bytes) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + kHugePage - 1) / kHugePage * kHugePage;
  // Over-map by one huge page so the usable range can start 2 MiB aligned.
  const size_t mapped = rounded + kHugePage;
  // Without MAP_NORESERVE: a pool larger than the machine can back is refused
  // here (an error at start-up), not killed for memory later.
  void* m = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  const auto base = reinterpret_cast<uintptr_t>(m);
  const uintptr_t aligned = (base + kHugePage - 1) / kHugePage * kHugePage;
  if (aligned > base) ::munmap(m, aligned - base);
  const uintptr_t end = base + mapped, used_end = aligned + rounded;
  if (end > used_end) ::munmap(reinterpret_cast<void*>(used_end), end - used_end);
  ::madvise(reinterpret_cast<void*>(aligned), rounded, MADV_HUGEPAGE);  // advice only
  return reinterpret_cast<void*>(aligned);
}

void FreeZeroedPages(void* p, size_t bytes) {
  if (p == nullptr) return;
  const size_t rounded = (std::max<size_t>(bytes, 1) + kHugePage - 1) / kHugePage * kHugePage;
  ::munmap(p, rounded);
}

WeightArena::~WeightArena() {
  for (const Chunk& c : chunks_) FreeWeights(c.p, c.size);
}

void* WeightArena::Allocate(size_t bytes) {
  const size_t need = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
  if (chunks_.empty() || used_ + need > chunks_.back().size) {
    const size_t size = std::max(kArenaChunk, (need + kHugePage - 1) / kHugePage * kHugePage);
    chunks_.push_back({static_cast<char*>(AllocateWeights(size)), size});
    used_ = 0;
  }
  void* p = chunks_.back().p + used_;
  used_ += need;
  used_total_ += need;
  return p;
}

uint8_t* WeightArena::Adopt(WeightBuffer buffer) {
  used_total_ += (buffer.size() + 63) / 64 * 64;
  adopted_.push_back(std::move(buffer));
  return adopted_.back().data();
}

void WeightArena::KeepMapped(std::shared_ptr<const void> owner, size_t bytes) {
  used_total_ += (bytes + 63) / 64 * 64;
  mapped_owners_.push_back(std::move(owner));
}

size_t WeightArena::bytes_reserved() const {
  size_t total = 0;
  for (const Chunk& c : chunks_) total += c.size;
  for (const WeightBuffer& b : adopted_) total += b.size();
  return total;
}

}  // namespace moeserve::kernels
