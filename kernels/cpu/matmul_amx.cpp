// The amx row of the ISA registry: its detection (CPUID, XCR0, and the
// kernel's permission for the tile data) and its products, the tile program
// of amx_bf16_program.hpp on the hardware's tiles, threaded.
//
// The instructions are written as inline assembly, each with its operands
// (GCC 12's intrinsics give LDTILECFG an 8-byte memory operand and
// TILELOADD none, so the compiler could move stores to the operands past
// them): the file needs no ISA flags and runs nothing unless the registry
// found the row supported.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "amx_bf16_program.hpp"
#include "moeserve/kernels/amx_tiles.hpp"
#include "moeserve/kernels/thread_pool.hpp"
#include "variants.hpp"

namespace moeserve::kernels::cpu {
namespace {

#if defined(__x86_64__)
// The tile backend of AmxStrips: one instruction each.
struct AmxHardwareTiles {
  void Configure(const AmxTileConfig& config) { asm volatile("ldtilecfg %0" : : "m"(config) : "memory"); }
  void Release() { asm volatile("tilerelease" : : : "memory"); }
  template <int t>
  void Zero() {
    asm volatile("tilezero %%tmm%c0" : : "i"(t));
  }
  template <int t>
  void Load(const void* base, size_t stride_bytes) {
    asm volatile("tileloadd (%0,%1,1), %%tmm%c2" : : "r"(base), "r"(stride_bytes), "i"(t) : "memory");
  }
  template <int t>
  void Store(void* base, size_t stride_bytes) {
    asm volatile("tilestored %%tmm%c2, (%0,%1,1)" : : "r"(base), "r"(stride_bytes), "i"(t) : "memory");
  }
  // Intel's operand order: tdpbf16ps dst, src1 (A), src2 (B); AT&T reverses it.
  template <int c, int a, int b>
  void DotBf16() {
    asm volatile("tdpbf16ps %%tmm%c2, %%tmm%c1, %%tmm%c0" : : "i"(c), "i"(a), "i"(b));
  }
};
#endif

}  // namespace

bool DetectAmxBf16() {
#if defined(__x86_64__) && defined(__linux__)
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if (!(d & bit_AMX_TILE) || !(d & bit_AMX_BF16)) return false;
  if (!__builtin_cpu_supports("avx512bf16")) return false;  // the packing's vcvtne2ps2bf16
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return false;
  uint32_t lo, hi;
  asm volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  const uint64_t xcr0 = (static_cast<uint64_t>(hi) << 32) | lo;
  constexpr uint64_t kTileState = (uint64_t{1} << 17) | (uint64_t{1} << 18);  // XTILECFG, XTILEDATA
  if ((xcr0 & kTileState) != kTileState) return false;
  // Linux enables the 8 KiB tile data per process, on request (since 5.16);
  // the permission covers every thread of the process.
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

void matmul_bf16_bf16act_amx(const uint16_t* W, size_t out, size_t in, const float* X, size_t n, float* Y) {
#if defined(__x86_64__)
  AmxMatMulBf16Bf16Act<AmxHardwareTiles>(W, out, in, X, n, Y, kAmxAvx512Helpers);
#else
  matmul_bf16_bf16act_avx512(W, out, in, X, n, Y);
#endif
}

void matmul_mxfp4_bf16act_amx(const Mxfp4PackedView& w, const float* X, size_t n, float* Y) {
#if defined(__x86_64__)
  AmxMatMulMxfp4Bf16Act<AmxHardwareTiles>(w, X, n, Y, kAmxAvx512Helpers);
#else
  matmul_mxfp4_bf16act_avx512(w, X, n, Y);
#endif
}

}  // namespace moeserve::kernels::cpu
