#include "families/gpt_oss/family.hpp"

#include "moeserve/engine/gpt_oss_model.hpp"
#include "moeserve/engine/model.hpp"

namespace moeserve::engine {

namespace {

bool Matches(const ConfigProbe& probe) { return probe.model_type == "gpt_oss"; }

Result<FamilyParts> Load(const std::string& dir, const ModelOptions& options) {
  if (options.deterministic)
    return Fail(Error::InvalidArgument("deterministic decode is not available for gpt-oss models"));
  if (options.ep_world > 1 || options.comm)
    return Fail(Error::InvalidArgument("expert parallelism is not supported for gpt-oss models"));
  // The routed experts are served as published (MXFP4); no conversion.
  if (options.experts && *options.experts != ExpertFormat::kMxfp4)
    return Fail(Error::InvalidArgument("experts: " + std::string(ExpertFormatName(*options.experts)) +
                                       " requested, but gpt-oss models serve their routed experts as published (mxfp4)"));
  const bool reference = options.kernels == KernelChoice::kReference;
  // As for every family (ModelOptions): the reference kernels stay fp32.
  return LoadGptOss(dir, reference ? kernels::Isa::kReference : kernels::BestIsa(),
                    options.bf16_activations && !reference);
}

// Published with MXFP4 routed experts (the format gpt-oss was trained in).
Result<std::optional<ExpertFormat>> StoredExperts(const std::string&) {
  return std::optional<ExpertFormat>(ExpertFormat::kMxfp4);
}

}  // namespace

FamilyEntry GptOssFamily() { return {"gpt-oss", Matches, Load, nullptr, nullptr, StoredExperts}; }

}  // namespace moeserve::engine
