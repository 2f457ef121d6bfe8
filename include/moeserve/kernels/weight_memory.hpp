// Memory for weights the CPU kernels stream every decode step.
//
// Decode reads each weight matrix once a token. With 4 KiB pages the
// hardware prefetchers stop at every page boundary and each page costs a TLB
// walk; on the EPYC here a BF16 matrix-vector product streamed ~33 GB/s on
// average from 4 KiB pages and ~44 GB/s from 2 MiB pages. So weights live in
// 2 MiB-aligned memory advised for transparent huge pages (systems often set
// THP to "madvise"; where it is off, the advice is a no-op).
//
// Thread safety: AllocateWeights/FreeWeights are thread-safe; a WeightArena
// is not (it is filled once, at load, by one thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace moeserve::kernels {

// 64-byte aligned; buffers of 4 MiB or more are 2 MiB aligned and advised.
void* AllocateWeights(size_t bytes);
void FreeWeights(void* p, size_t bytes);

// Zero-filled memory straight from the kernel (anonymous mmap), 2 MiB
// aligned and advised for huge pages: pages are zeroed when first touched, so
// a large cache pool costs nothing at start-up for the part a run never uses.
// Returns nullptr when the system has no memory to map.
void* AllocateZeroedPages(size_t bytes);
void FreeZeroedPages(void* p, size_t bytes);

template <class T>
struct WeightAllocator {
  using value_type = T;
  WeightAllocator() = default;
  template <class U>
  WeightAllocator(const WeightAllocator<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(AllocateWeights(n * sizeof(T))); }
  void deallocate(T* p, size_t n) { FreeWeights(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const WeightAllocator<U>&) const { return true; }
};

// Storage of `bytes` from AllocateWeights, left uninitialised (a loader
// fills it whole: zeroing first would touch every page twice), freed with
// the buffer. Movable, not copyable.
class WeightBuffer {
 public:
  WeightBuffer() = default;
  explicit WeightBuffer(size_t bytes) : p_(static_cast<uint8_t*>(AllocateWeights(bytes))), size_(bytes) {}
  WeightBuffer(WeightBuffer&& o) noexcept : p_(o.p_), size_(o.size_) { o.p_ = nullptr, o.size_ = 0; }
  WeightBuffer& operator=(WeightBuffer&& o) noexcept {
    if (this != &o) {
      Reset();
      p_ = o.p_, size_ = o.size_;
      o.p_ = nullptr, o.size_ = 0;
    }
    return *this;
  }
  WeightBuffer(const WeightBuffer&) = delete;
  WeightBuffer& operator=(const WeightBuffer&) = delete;
  ~WeightBuffer() { Reset(); }
  uint8_t* data() const { return p_; }
  size_t size() const { return size_; }

 private:
  void Reset() {
    if (p_) FreeWeights(p_, size_);
    p_ = nullptr, size_ = 0;
  }
  uint8_t* p_ = nullptr;
  size_t size_ = 0;
};

// Many small matrices (a few hundred KiB to a few MiB each) packed into
// large huge-page chunks, so that they too stream from 2 MiB pages. Memory
// lives as long as the arena.
class WeightArena {
 public:
  WeightArena() = default;
  WeightArena(const WeightArena&) = delete;
  WeightArena& operator=(const WeightArena&) = delete;
  ~WeightArena();

  // 64-byte aligned storage for `bytes`.
  void* Allocate(size_t bytes);
  // Keeps a buffer filled elsewhere (a loader's converted tensor) for the
  // arena's life instead of copying it in; returns its data.
  uint8_t* Adopt(WeightBuffer buffer);
  // Keeps `owner` (what holds a mapping a weight is read from in place: a
  // checkpoint's shard, mapped from its file) for the arena's life, and
  // counts `bytes` of it as weights, as if they had been copied in.
  void KeepMapped(std::shared_ptr<const void> owner, size_t bytes);
  // The chunks' capacity plus the adopted buffers.
  size_t bytes_reserved() const;
  // What the weights take: every allocation and adopted buffer rounded up to
  // 64 bytes (the same whether a tensor was copied in or adopted; a chunk's
  // unused tail is never touched, so it is not resident).
  size_t bytes_used() const { return used_total_; }

 private:
  struct Chunk {
    char* p;
    size_t size;
  };
  std::vector<Chunk> chunks_;
  std::vector<WeightBuffer> adopted_;
  std::vector<std::shared_ptr<const void>> mapped_owners_;
  size_t used_ = 0;  // in the last chunk
  size_t used_total_ = 0;
};

}  // namespace moeserve::kernels
