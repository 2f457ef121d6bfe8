// The vision tower's forward pass (model.md section 14.2-14.4): resize,
// normalise, patch, ViT blocks with 2D RoPE, merge, project. Every product
// runs on the model's KernelSet: the reference set gives the plain scalar
// path, the fast set the same GEMMs as text prefill (BF16 or fp32 weights).
#pragma once

#include <cstdint>
#include <vector>

#include "moeserve/common/status.hpp"
#include "moeserve/engine/vision.hpp"
#include "moeserve/kernels/cpu_kernels.hpp"
#include "weights.hpp"

namespace moeserve::engine {

// The image resampled to out_w x out_h with 14.2's tent filter: fp32 byte
// values, [out_h, out_w, 3].
std::vector<float> ResizeImage(const ImageInput& image, int out_w, int out_h);

// [ImageTokenCount, model_hidden] rows that replace the image's placeholders.
Result<std::vector<float>> RunVisionTower(const VisionConfig& config, const VisionWeights& weights, int model_hidden,
                                          const kernels::KernelSet& kernels, const ImageInput& image);

}  // namespace moeserve::engine
