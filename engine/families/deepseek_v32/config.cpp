// DeepSeek-V3.2's config.json (the Hugging Face keys of
// deepseek-ai/DeepSeek-V3.2) into the engine's ModelConfig.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "moeserve/common/json_limits.hpp"
#include "moeserve/engine/families/deepseek_v32.hpp"

namespace moeserve::engine::deepseek_v32 {
namespace {

using nlohmann::json;

// Reads the fields of one JSON object; every error is "<source>: <field>: ...".
class Fields {
 public:
  Fields(const json& j, std::string source, std::string prefix = "")
      : j_(j), source_(std::move(source)), prefix_(std::move(prefix)) {}

  Error Bad(const std::string& field, const std::string& what) const {
    return Error::InvalidArgument(source_ + ": " + prefix_ + field + ": " + what);
  }
  bool Has(const std::string& f) const { return j_.contains(f) && !j_[f].is_null(); }
  const json& raw(const std::string& f) const { return j_[f]; }

  Result<int64_t> Int(const std::string& f, int64_t min, int64_t max) const {
    if (!Has(f)) return Fail(Bad(f, "missing (an integer is required)"));
    const json& v = j_[f];
    if (!v.is_number_integer()) return Fail(Bad(f, "must be an integer, got " + v.dump()));
    const int64_t x = v.get<int64_t>();
    if (x < min || x > max)
      return Fail(Bad(f, std::to_string(x) + " is outside [" + std::to_string(min) + ", " + std::to_string(max) + "]"));
    return x;
  }
  Result<int> Dim(const std::string& f, int min = 1) const {
    MOE_ASSIGN_OR_RETURN(int64_t x, Int(f, min, 1 << 24));
    return static_cast<int>(x);
  }
  Result<int> DimOr(const std::string& f, int fallback, int min = 0) const {
    if (!Has(f)) return fallback;
    return Dim(f, min);
  }
  Result<double> Number(const std::string& f, double fallback, bool positive = true) const {
    if (!Has(f)) return fallback;
    const json& v = j_[f];
    if (!v.is_number()) return Fail(Bad(f, "must be a number, got " + v.dump()));
    const double x = v.get<double>();
    if (!std::isfinite(x) || (positive && x <= 0)) return Fail(Bad(f, v.dump() + " must be a positive finite number"));
    return x;
  }
  Result<std::string> String(const std::string& f, const std::string& fallback) const {
    if (!Has(f)) return fallback;
    if (!j_[f].is_string()) return Fail(Bad(f, "must be a string, got " + j_[f].dump()));
    return j_[f].get<std::string>();
  }
  // A field whose only supported value is `want` (others would change the math).
  Status Only(const std::string& f, const json& want) const {
    if (Has(f) && j_[f] != want)
      return Fail(Bad(f, j_[f].dump() + " is not supported (the engine implements " + want.dump() + ")"));
    return Ok();
  }

 private:
  const json& j_;
  std::string source_, prefix_;
};

}  // namespace

Result<Config> ParseConfig(const std::string& text, const std::string& source) {
  MOE_ASSIGN_OR_RETURN(json j, ParseJsonBounded<json>(text, {.max_bytes = 1 << 20, .max_depth = kMaxJsonDepth}, source));
  if (!j.is_object()) return Fail(Error::InvalidArgument(source + ": the top level must be a JSON object"));
  Fields r(j, source);
  MOE_ASSIGN_OR_RETURN(std::string model_type, r.String("model_type", ""));
  if (model_type != kModelType)
    return Fail(r.Bad("model_type", "'" + model_type + "' is not \"" + kModelType + "\""));

  Config out;
  ModelConfig& c = out.model;
  c.architecture = kModelType;
  MOE_ASSIGN_OR_RETURN(c.vocab_size, r.Dim("vocab_size"));
  MOE_ASSIGN_OR_RETURN(c.hidden_size, r.Dim("hidden_size"));
  MOE_ASSIGN_OR_RETURN(c.num_layers, r.Dim("num_hidden_layers"));
  MOE_ASSIGN_OR_RETURN(out.num_nextn_predict_layers, r.DimOr("num_nextn_predict_layers", 0));
  // The first MTP layer maps onto the graph's MTP module (model.md 15): a
  // DSA block with the MoE FFN, as every layer past the dense ones.
  c.num_nextn_predict_layers = out.num_nextn_predict_layers > 0 ? 1 : 0;
  c.mtp_kind = LayerKind::kDsa;
  c.mtp_moe = true;
  MOE_ASSIGN_OR_RETURN(c.first_dense_layers, r.DimOr("first_k_dense_replace", 0));
  if (c.first_dense_layers > c.num_layers)
    return Fail(r.Bad("first_k_dense_replace", std::to_string(c.first_dense_layers) + " exceeds num_hidden_layers (" +
                                                   std::to_string(c.num_layers) + ")"));
  c.layer_types.assign(static_cast<size_t>(c.num_layers), LayerKind::kDsa);
  MOE_ASSIGN_OR_RETURN(c.intermediate_size, r.Dim("intermediate_size"));
  MOE_ASSIGN_OR_RETURN(c.rms_norm_eps, r.Number("rms_norm_eps", 1e-6));
  MOE_ASSIGN_OR_RETURN(int64_t max_pos, r.Int("max_position_embeddings", 1, int64_t{1} << 40));
  c.max_position_embeddings = max_pos;

  // MLA without the output gate; every layer carries the indexer.
  MlaConfig& m = c.mla;
  MOE_ASSIGN_OR_RETURN(m.num_heads, r.Dim("num_attention_heads"));
  MOE_ASSIGN_OR_RETURN(m.q_lora_rank, r.Dim("q_lora_rank"));  // null (no query LoRA) is not this family
  MOE_ASSIGN_OR_RETURN(m.kv_lora_rank, r.Dim("kv_lora_rank"));
  MOE_ASSIGN_OR_RETURN(m.qk_nope_head_dim, r.Dim("qk_nope_head_dim"));
  MOE_ASSIGN_OR_RETURN(m.qk_rope_head_dim, r.Dim("qk_rope_head_dim"));
  MOE_ASSIGN_OR_RETURN(m.v_head_dim, r.Dim("v_head_dim"));
  m.output_gate = false;
  if (m.qk_rope_head_dim % 2) return Fail(r.Bad("qk_rope_head_dim", std::to_string(m.qk_rope_head_dim) + " must be even"));
  if (r.Has("num_key_value_heads")) {
    MOE_ASSIGN_OR_RETURN(int kvh, r.Dim("num_key_value_heads"));
    if (kvh != m.num_heads)
      return Fail(r.Bad("num_key_value_heads", std::to_string(kvh) + " must equal num_attention_heads (" +
                                                   std::to_string(m.num_heads) + "): MLA has one latent for every head"));
  }
  MOE_TRY(r.Only("attention_bias", false));

  DsaConfig& d = c.dsa;
  MOE_ASSIGN_OR_RETURN(d.index_n_heads, r.Dim("index_n_heads"));
  MOE_ASSIGN_OR_RETURN(d.index_head_dim, r.Dim("index_head_dim"));
  MOE_ASSIGN_OR_RETURN(d.index_topk, r.Dim("index_topk"));
  // The public indexer always rounds to FP8 in groups of 128 after a
  // Hadamard rotation of the whole head.
  if (d.index_head_dim % 128 || (d.index_head_dim & (d.index_head_dim - 1)))
    return Fail(r.Bad("index_head_dim", std::to_string(d.index_head_dim) +
                                            " must be a power of two and a multiple of 128 (Hadamard rotation, FP8 groups of 128)"));
  if (d.index_head_dim < m.qk_rope_head_dim)
    return Fail(r.Bad("index_head_dim", std::to_string(d.index_head_dim) + " must be >= qk_rope_head_dim (" +
                                            std::to_string(m.qk_rope_head_dim) + ")"));
  d.index_fp8 = true;

  // MoE: sigmoid scores, group-limited top-k, the correction bias ("noaux_tc").
  MoeConfig& e = c.moe;
  MOE_ASSIGN_OR_RETURN(e.num_experts, r.Dim("n_routed_experts"));
  MOE_ASSIGN_OR_RETURN(e.num_shared_experts, r.DimOr("n_shared_experts", 0));
  MOE_ASSIGN_OR_RETURN(e.experts_per_token, r.Dim("num_experts_per_tok"));
  MOE_ASSIGN_OR_RETURN(e.moe_intermediate_size, r.Dim("moe_intermediate_size"));
  MOE_ASSIGN_OR_RETURN(e.n_group, r.DimOr("n_group", 1, 1));
  MOE_ASSIGN_OR_RETURN(e.topk_group, r.DimOr("topk_group", 1, 1));
  MOE_ASSIGN_OR_RETURN(e.routed_scaling_factor, r.Number("routed_scaling_factor", 1.0));
  MOE_ASSIGN_OR_RETURN(e.score_func, r.String("scoring_func", "sigmoid"));
  if (e.score_func != "sigmoid")
    return Fail(r.Bad("scoring_func", "'" + e.score_func + "' is not supported (DeepSeek-V3.2 routes with \"sigmoid\")"));
  MOE_TRY(r.Only("topk_method", "noaux_tc"));
  MOE_TRY(r.Only("norm_topk_prob", true));
  MOE_TRY(r.Only("moe_layer_freq", 1));
  MOE_TRY(r.Only("hidden_act", "silu"));
  MOE_TRY(r.Only("tie_word_embeddings", false));
  if (e.num_experts % e.n_group)
    return Fail(r.Bad("n_group", std::to_string(e.n_group) + " must divide n_routed_experts (" + std::to_string(e.num_experts) + ")"));
  if (e.num_experts / e.n_group < 2)
    return Fail(r.Bad("n_group", "n_routed_experts / n_group must be >= 2 (a group scores its two best experts)"));
  if (e.topk_group > e.n_group)
    return Fail(r.Bad("topk_group", std::to_string(e.topk_group) + " must be <= n_group (" + std::to_string(e.n_group) + ")"));
  if (e.experts_per_token > e.topk_group * (e.num_experts / e.n_group))
    return Fail(r.Bad("num_experts_per_tok", std::to_string(e.experts_per_token) + " exceeds the experts of topk_group groups"));
  c.expert_format = ExpertFormat::kBf16;  // routed experts are dequantised to BF16 at load

  // RoPE: theta, and YaRN as DeepSeek's precompute_freqs_cis.
  RopeConfig& p = c.rope;
  MOE_ASSIGN_OR_RETURN(p.theta, r.Number("rope_theta", 10000.0));
  if (r.Has("rope_scaling")) {
    if (!r.raw("rope_scaling").is_object()) return Fail(r.Bad("rope_scaling", "must be an object or null"));
    Fields s(r.raw("rope_scaling"), source, "rope_scaling.");
    MOE_ASSIGN_OR_RETURN(std::string type, s.String("type", ""));
    MOE_ASSIGN_OR_RETURN(std::string rope_type, s.String("rope_type", type));
    if (rope_type != "yarn") return Fail(s.Bad("type", "'" + rope_type + "' is not supported (expected \"yarn\")"));
    p.yarn = true;
    MOE_ASSIGN_OR_RETURN(p.factor, s.Number("factor", 1.0));
    MOE_ASSIGN_OR_RETURN(p.original_max_position, s.Int("original_max_position_embeddings", 1, int64_t{1} << 40));
    MOE_ASSIGN_OR_RETURN(p.beta_fast, s.Number("beta_fast", 32));
    MOE_ASSIGN_OR_RETURN(p.beta_slow, s.Number("beta_slow", 1));
    MOE_ASSIGN_OR_RETURN(p.mscale, s.Number("mscale", 1.0));
    MOE_ASSIGN_OR_RETURN(double all_dim, s.Number("mscale_all_dim", p.mscale));
    // DeepSeek's code scales the softmax by mscale; Hugging Face's by
    // mscale_all_dim: the same only when they are equal (as published).
    if (all_dim != p.mscale)
      return Fail(s.Bad("mscale_all_dim", "must equal rope_scaling.mscale (the published configs have both 1.0)"));
  }

  // FP8 weights: e4m3 with 128x128 block scales (weight_scale_inv).
  if (r.Has("quantization_config")) {
    if (!r.raw("quantization_config").is_object()) return Fail(r.Bad("quantization_config", "must be an object"));
    Fields q(r.raw("quantization_config"), source, "quantization_config.");
    MOE_ASSIGN_OR_RETURN(std::string method, q.String("quant_method", ""));
    if (method != "fp8") return Fail(q.Bad("quant_method", "'" + method + "' is not supported (expected \"fp8\")"));
    MOE_TRY(q.Only("fmt", "e4m3"));
    MOE_TRY(q.Only("activation_scheme", "dynamic"));
    if (!q.Has("weight_block_size") || q.raw("weight_block_size") != json::array({128, 128}))
      return Fail(q.Bad("weight_block_size", "must be [128, 128]"));
    MOE_ASSIGN_OR_RETURN(std::string scale_fmt, q.String("scale_fmt", ""));
    if (!scale_fmt.empty() && scale_fmt != "ue8m0")
      return Fail(q.Bad("scale_fmt", "'" + scale_fmt + "' is not supported (\"ue8m0\" or absent)"));
    d.index_fp8_ue8m0 = scale_fmt == "ue8m0";
    out.fp8 = true;
  }
  // A directory WriteConverted made: the engine's tensors, no conversion.
  if (r.Has("moeserve_converted")) {
    if (!r.raw("moeserve_converted").is_object()) return Fail(r.Bad("moeserve_converted", "must be an object"));
    Fields m(r.raw("moeserve_converted"), source, "moeserve_converted.");
    MOE_ASSIGN_OR_RETURN(std::string experts, m.String("routed_experts", ""));
    if (experts == "mxfp4") out.converted_experts = ExpertFormat::kMxfp4;
    else if (experts == "bf16") out.converted_experts = ExpertFormat::kBf16;
    else return Fail(m.Bad("routed_experts", "'" + experts + "' is not \"mxfp4\" or \"bf16\""));
  }
  if (r.Has("bos_token_id")) {
    MOE_ASSIGN_OR_RETURN(out.bos_token_id, r.Dim("bos_token_id", 0));
  }
  if (r.Has("eos_token_id")) {
    MOE_ASSIGN_OR_RETURN(out.eos_token_id, r.Dim("eos_token_id", 0));
  }

  // The engine's own checks (sizes its kernels need) as a backstop.
  if (c.num_layers <= c.first_dense_layers) c.mtp_moe = false;  // no MoE parameters: a dense module
  MOE_TRY(ValidateModelConfig(c, source));
  return out;
}

Result<Config> LoadConfig(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  std::ifstream in(path);
  if (!in) return Fail(Error::NotFound(path + ": cannot open"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseConfig(ss.str(), path);
}

bool IsModelDir(const std::string& dir) {
  std::ifstream in(std::filesystem::path(dir) / "config.json");
  if (!in) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  auto j = ParseJsonBounded<json>(ss.str(), {.max_bytes = 1 << 20, .max_depth = kMaxJsonDepth}, "config.json");
  return j && j->is_object() && j->contains("model_type") && (*j)["model_type"] == kModelType;
}

}  // namespace moeserve::engine::deepseek_v32
