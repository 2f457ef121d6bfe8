// KernelsWithDecodeActivationBits: the sets derived from Kernels(isa) (or
// KernelsWithBf16Activations(isa)) with MXFP4 products over 16- or 8-bit
// activations, built once on first use.
#include "moeserve/kernels/mxfp4_activation_bits.hpp"

#include <array>
#include <string>

#include "variants.hpp"

namespace moeserve::kernels {
namespace {

// One derived set per (isa, bits, bf16_prefill), with its names.
struct Derived {
  KernelSet set;
  std::string matmul_name, many_name;
};

// In place: the entries point at the names stored beside them.
void Derive(Derived& d, Isa isa, int nparts, bool bf16) {
  d.set = bf16 ? KernelsWithBf16Activations(isa) : Kernels(isa);
  // The registry's composed products over nparts parts; none for the
  // reference, whose products stay exact.
  const cpu::Mxfp4PartsKernels e = cpu::Mxfp4PartsOf(isa, nparts);
  if (e.matmul == nullptr) return;
  const std::string sfx =
      std::string(IsaName(isa)) + (bf16 ? "+bf16act" : "") + "+act" + std::to_string(Mxfp4ActBits(nparts));
  d.matmul_name = "matmul_mxfp4_" + sfx;
  d.many_name = "matvec_mxfp4_many_" + sfx;
  d.set.matmul_mxfp4 = {bf16 ? e.matmul_bf16act : e.matmul, d.matmul_name.c_str()};
  d.set.matvec_mxfp4_many = {e.many, d.many_name.c_str()};
}

}  // namespace

const KernelSet& KernelsWithDecodeActivationBits(Isa isa, int bits, bool bf16_prefill) {
  const KernelSet& plain = bf16_prefill ? KernelsWithBf16Activations(isa) : Kernels(isa);  // refuses what this CPU cannot run
  const int nparts = Mxfp4ActPartsForBits(bits);
  if (nparts != 1 && nparts != 2) return plain;
  // Built on first use (thread-safe static initialisation); the names live
  // beside the sets, so their pointers stay valid.
  static const auto* sets = [] {
    auto* s = new std::array<std::array<std::array<Derived, 2>, 2>, kIsaCount>();
    for (int i = 0; i < kIsaCount; ++i)
      for (int p = 0; p < 2; ++p)
        for (int b = 0; b < 2; ++b)
          if (IsaSupported(static_cast<Isa>(i))) Derive((*s)[i][p][b], static_cast<Isa>(i), p + 1, b == 1);
    return s;
  }();
  return (*sets)[static_cast<int>(isa)][nparts - 1][bf16_prefill ? 1 : 0].set;
}

}  // namespace moeserve::kernels
