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
  size_t bytes_reserved() const;

 private:
  struct Chunk {
    char* p;
    size_t size;
  };
  std::vector<Chunk> chunks_;
  size_t used_ = 0;  // in the last chunk
};

}  // namespace moeserve::kernels
