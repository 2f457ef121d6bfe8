// Kernel sets whose MXFP4 products quantise activations to fewer bits than
// the default 21 (mxfp4_packed.hpp): an option, outside the default sets.
#pragma once

#include "moeserve/kernels/cpu_kernels.hpp"

namespace moeserve::kernels {

// The set for isa with its matmul_mxfp4 and matvec_mxfp4_many entries
// quantising activations to `bits` bits per element: 16 (two int8 parts, 4
// vpdpbusd per 64 weight bytes) or 8 (one int8, 2 vpdpbusd) instead of the
// default 21 (three parts, 6). Every row count takes the integer products
// (from kMxfp4GemmMinRows rows on, AVX-512's tiles of rows,
// mxfp4_gemm_vnni.cpp, instead of the fp32 GEMM), so a row's result is the
// one it gets alone. The other families are the set's own (with
// bf16_prefill, those of KernelsWithBf16Activations(isa), whose BF16 GEMM
// still takes the MXFP4 products from kBf16ActMinRows rows on). Any other
// bits value gives Kernels(isa) (KernelsWithBf16Activations(isa)); the
// reference set's products stay exact. Error: at most 0.5 / qmax of each
// block's largest activation per element (docs/model-format.md section 10
// has what the engine's tolerances allow). Names:
// "<family>_<isa>[+bf16act]+act<bits>". Refuses an unsupported isa as
// Kernels().
const KernelSet& KernelsWithDecodeActivationBits(Isa isa, int bits, bool bf16_prefill = false);

}  // namespace moeserve::kernels
