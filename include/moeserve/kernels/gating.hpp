// The elementwise gates between a decode step's matrix products:
// out = silu(a) * b (SwiGLU, DeltaNet's output gate) and
// out = sigmoid(a) * b (MLA's output gate), vectorised.
//
// A decode step of the small preset evaluates ~22 thousand of these on the
// stepping thread alone; one scalar expf each was ~0.1 ms of a ~4.5 ms step.
// The vector exponential (range reduction by ln 2 in two parts, degree-6
// polynomial, scaling by 2^k) is within 2 ulp of expf over the float range;
// NaN inputs give NaN, and the tails saturate as the scalar forms do
// (sigmoid -> 0 or 1, silu -> 0 or a).
//
// Thread safety: pure functions over caller buffers.
#pragma once

#include <cstddef>


namespace moeserve::kernels {

// The vectorised forms are the KernelSet families silu_mul and sigmoid_mul
// (cpu_kernels.hpp); these are their reference variants, the scalar forms
// (kernels::Silu, kernels::Sigmoid). out may alias a or b.
// out[i] = silu(a[i]) * b[i]
void SiluMulRef(const float* a, const float* b, float* out, size_t n);
// out[i] = sigmoid(a[i]) * b[i]
void SigmoidMulRef(const float* a, const float* b, float* out, size_t n);

}  // namespace moeserve::kernels
