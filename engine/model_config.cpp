#include "moeserve/engine/model_config.hpp"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "moeserve/common/json_limits.hpp"

namespace moeserve::engine {

using nlohmann::json;

std::string_view LayerKindName(LayerKind k) {
  switch (k) {
    case LayerKind::kMla: return "mla";
    case LayerKind::kDsa: return "dsa";
    case LayerKind::kDelta: return "delta";
    case LayerKind::kGqa: return "gqa";
  }
  return "?";
}

std::string_view ExpertFormatName(ExpertFormat f) {
  switch (f) {
    case ExpertFormat::kMxfp4: return "mxfp4";
    case ExpertFormat::kBf16: return "bf16";
  }
  return "?";
}

bool ModelConfig::HasKind(LayerKind k) const { return CountKind(k) > 0; }

int ModelConfig::CountKind(LayerKind k) const {
  int n = 0;
  for (auto t : layer_types) n += (t == k);
  return n;
}

namespace {

// Reads typed fields out of one JSON object, naming "section.field" on error.
class FieldReader {
 public:
  FieldReader(const json& obj, std::string source, std::string prefix)
      : obj_(obj), source_(std::move(source)), prefix_(std::move(prefix)) {}

  std::string Path(const std::string& f) const { return prefix_.empty() ? f : prefix_ + "." + f; }
  Error Bad(const std::string& field, const std::string& what) const {
    return Error::InvalidArgument(source_ + ": " + Path(field) + ": " + what);
  }
  bool Has(const std::string& f) const { return obj_.contains(f); }

  Result<int64_t> Int(const std::string& f, std::optional<int64_t> def = std::nullopt) const {
    if (!obj_.contains(f)) {
      if (def) return *def;
      return Fail(Bad(f, "missing (an integer is required)"));
    }
    const json& v = obj_[f];
    if (!v.is_number_integer()) return Fail(Bad(f, "must be an integer, got " + v.dump()));
    return v.get<int64_t>();
  }
  Result<int> PositiveInt(const std::string& f, std::optional<int64_t> def = std::nullopt) const {
    MOE_ASSIGN_OR_RETURN(int64_t v, Int(f, def));
    if (v <= 0 || v > (1ll << 31) - 1) return Fail(Bad(f, "must be a positive integer, got " + std::to_string(v)));
    return static_cast<int>(v);
  }
  Result<int> NonNegativeInt(const std::string& f, std::optional<int64_t> def = std::nullopt) const {
    MOE_ASSIGN_OR_RETURN(int64_t v, Int(f, def));
    if (v < 0 || v > (1ll << 31) - 1) return Fail(Bad(f, "must be a non-negative integer, got " + std::to_string(v)));
    return static_cast<int>(v);
  }
  Result<double> Number(const std::string& f, std::optional<double> def = std::nullopt) const {
    if (!obj_.contains(f)) {
      if (def) return *def;
      return Fail(Bad(f, "missing (a number is required)"));
    }
    const json& v = obj_[f];
    if (!v.is_number()) return Fail(Bad(f, "must be a number, got " + v.dump()));
    double d = v.get<double>();
    if (!std::isfinite(d)) return Fail(Bad(f, "must be finite"));
    return d;
  }
  Result<double> PositiveNumber(const std::string& f, std::optional<double> def = std::nullopt) const {
    MOE_ASSIGN_OR_RETURN(double d, Number(f, def));
    if (d <= 0) return Fail(Bad(f, "must be > 0, got " + json(d).dump()));
    return d;
  }
  Result<bool> Bool(const std::string& f, bool def) const {
    if (!obj_.contains(f)) return def;
    if (!obj_[f].is_boolean()) return Fail(Bad(f, "must be true or false, got " + obj_[f].dump()));
    return obj_[f].get<bool>();
  }
  Result<std::string> String(const std::string& f, std::optional<std::string> def = std::nullopt) const {
    if (!obj_.contains(f)) {
      if (def) return *def;
      return Fail(Bad(f, "missing (a string is required)"));
    }
    if (!obj_[f].is_string()) return Fail(Bad(f, "must be a string, got " + obj_[f].dump()));
    return obj_[f].get<std::string>();
  }
  Result<FieldReader> Object(const std::string& f) const {
    if (!obj_.contains(f)) return Fail(Bad(f, "missing (an object is required)"));
    if (!obj_[f].is_object()) return Fail(Bad(f, "must be an object, got " + obj_[f].dump()));
    return FieldReader(obj_[f], source_, Path(f));
  }
  const json& raw(const std::string& f) const { return obj_[f]; }

 private:
  const json& obj_;
  std::string source_;
  std::string prefix_;
};

Status ParseMla(const FieldReader& r, MlaConfig& m) {
  MOE_ASSIGN_OR_RETURN(m.num_heads, r.PositiveInt("num_heads"));
  MOE_ASSIGN_OR_RETURN(m.q_lora_rank, r.PositiveInt("q_lora_rank"));
  MOE_ASSIGN_OR_RETURN(m.kv_lora_rank, r.PositiveInt("kv_lora_rank"));
  MOE_ASSIGN_OR_RETURN(m.qk_nope_head_dim, r.PositiveInt("qk_nope_head_dim"));
  MOE_ASSIGN_OR_RETURN(m.qk_rope_head_dim, r.PositiveInt("qk_rope_head_dim"));
  MOE_ASSIGN_OR_RETURN(m.v_head_dim, r.PositiveInt("v_head_dim"));
  MOE_ASSIGN_OR_RETURN(m.output_gate, r.Bool("output_gate", true));
  return Ok();
}

Status ParseDsa(const FieldReader& r, DsaConfig& d) {
  MOE_ASSIGN_OR_RETURN(d.index_n_heads, r.PositiveInt("index_n_heads"));
  MOE_ASSIGN_OR_RETURN(d.index_head_dim, r.PositiveInt("index_head_dim"));
  MOE_ASSIGN_OR_RETURN(d.index_topk, r.PositiveInt("index_topk"));
  return Ok();
}

Status ParseDelta(const FieldReader& r, DeltaConfig& d) {
  MOE_ASSIGN_OR_RETURN(d.num_heads, r.PositiveInt("num_heads"));
  MOE_ASSIGN_OR_RETURN(d.head_k_dim, r.PositiveInt("head_k_dim"));
  MOE_ASSIGN_OR_RETURN(d.head_v_dim, r.PositiveInt("head_v_dim"));
  MOE_ASSIGN_OR_RETURN(d.conv_size, r.PositiveInt("conv_size", 4));
  MOE_ASSIGN_OR_RETURN(d.norm_eps, r.PositiveNumber("norm_eps", 1e-5));
  return Ok();
}

Status ParseMoe(const FieldReader& r, MoeConfig& m) {
  MOE_ASSIGN_OR_RETURN(m.num_experts, r.PositiveInt("num_experts"));
  MOE_ASSIGN_OR_RETURN(m.experts_per_token, r.PositiveInt("experts_per_token"));
  MOE_ASSIGN_OR_RETURN(m.num_shared_experts, r.NonNegativeInt("num_shared_experts", 0));
  MOE_ASSIGN_OR_RETURN(m.moe_intermediate_size, r.PositiveInt("moe_intermediate_size"));
  MOE_ASSIGN_OR_RETURN(m.n_group, r.PositiveInt("n_group", 1));
  MOE_ASSIGN_OR_RETURN(m.topk_group, r.PositiveInt("topk_group", 1));
  MOE_ASSIGN_OR_RETURN(m.routed_scaling_factor, r.PositiveNumber("routed_scaling_factor", 1.0));
  MOE_ASSIGN_OR_RETURN(m.score_func, r.String("score_func", "sigmoid"));
  if (m.score_func != "sigmoid")
    return Fail(r.Bad("score_func", "'" + m.score_func + "' is not supported (only \"sigmoid\")"));
  return Ok();
}

Status ParseRope(const FieldReader& r, RopeConfig& p) {
  MOE_ASSIGN_OR_RETURN(p.theta, r.PositiveNumber("theta", 10000.0));
  MOE_ASSIGN_OR_RETURN(std::string scaling, r.String("scaling", "none"));
  if (scaling == "yarn") {
    p.yarn = true;
  } else if (scaling == "none") {
    p.yarn = false;
  } else {
    return Fail(r.Bad("scaling", "'" + scaling + "' is not one of \"yarn\", \"none\""));
  }
  MOE_ASSIGN_OR_RETURN(p.factor, r.PositiveNumber("factor", 1.0));
  MOE_ASSIGN_OR_RETURN(int64_t omp, r.Int("original_max_position", 4096));
  if (omp <= 0) return Fail(r.Bad("original_max_position", "must be a positive integer"));
  p.original_max_position = omp;
  MOE_ASSIGN_OR_RETURN(p.beta_fast, r.PositiveNumber("beta_fast", 32));
  MOE_ASSIGN_OR_RETURN(p.beta_slow, r.PositiveNumber("beta_slow", 1));
  MOE_ASSIGN_OR_RETURN(p.mscale, r.Number("mscale", 1.0));
  return Ok();
}

Status ParseVision(const FieldReader& r, VisionConfig& v) {
  MOE_ASSIGN_OR_RETURN(v.hidden_size, r.PositiveInt("hidden_size"));
  MOE_ASSIGN_OR_RETURN(v.num_layers, r.PositiveInt("num_layers"));
  MOE_ASSIGN_OR_RETURN(v.num_heads, r.PositiveInt("num_heads"));
  MOE_ASSIGN_OR_RETURN(v.intermediate_size, r.PositiveInt("intermediate_size"));
  MOE_ASSIGN_OR_RETURN(v.patch_size, r.PositiveInt("patch_size", 14));
  MOE_ASSIGN_OR_RETURN(v.merge_size, r.PositiveInt("merge_size", 2));
  MOE_ASSIGN_OR_RETURN(v.max_patches, r.PositiveInt("max_patches", 1024));
  MOE_ASSIGN_OR_RETURN(v.projector_hidden_size,
                       r.PositiveInt("projector_hidden_size", int64_t{v.merge_size} * v.merge_size * v.hidden_size));
  MOE_ASSIGN_OR_RETURN(v.norm_eps, r.PositiveNumber("norm_eps", 1e-6));
  MOE_ASSIGN_OR_RETURN(v.rope_theta, r.PositiveNumber("rope_theta", 10000.0));
  for (const char* key : {"image_mean", "image_std"}) {
    if (!r.Has(key)) continue;
    const json& a = r.raw(key);
    if (!a.is_array() || a.size() != 3)
      return Fail(r.Bad(key, "must be an array of 3 numbers (R, G, B), got " + a.dump()));
    auto& out = std::string(key) == "image_mean" ? v.image_mean : v.image_std;
    for (int c = 0; c < 3; ++c) {
      if (!a[c].is_number()) return Fail(r.Bad(key, "must be an array of 3 numbers (R, G, B), got " + a.dump()));
      out[c] = a[c].get<double>();
    }
  }
  MOE_ASSIGN_OR_RETURN(v.image_token_id, r.NonNegativeInt("image_token_id", 268));
  MOE_ASSIGN_OR_RETURN(v.image_start_token_id, r.NonNegativeInt("image_start_token_id", 269));
  MOE_ASSIGN_OR_RETURN(v.image_end_token_id, r.NonNegativeInt("image_end_token_id", 270));
  return Ok();
}

Error Invalid(const std::string& source, const std::string& field, const std::string& what) {
  return Error::InvalidArgument(source + ": " + field + ": " + what);
}

}  // namespace

Result<ModelConfig> ParseModelConfig(const std::string& text, const std::string& source) {
  // config.json is a few KB; the limits keep a hostile one (a tenant's bucket)
  // from reaching code that recurses, such as the dump() in an error message.
  MOE_ASSIGN_OR_RETURN(json j, ParseJsonBounded<json>(text, {.max_bytes = 1 << 20, .max_depth = kMaxJsonDepth}, source));
  if (!j.is_object()) return Fail(Error::InvalidArgument(source + ": the top level must be a JSON object"));
  FieldReader r(j, source, "");
  ModelConfig c;
  MOE_ASSIGN_OR_RETURN(c.architecture, r.String("architecture"));
  if (c.architecture != "moe-dsa-v1")
    return Fail(r.Bad("architecture", "'" + c.architecture + "' is not supported (expected \"moe-dsa-v1\")"));
  MOE_ASSIGN_OR_RETURN(c.vocab_size, r.PositiveInt("vocab_size"));
  MOE_ASSIGN_OR_RETURN(c.hidden_size, r.PositiveInt("hidden_size"));
  MOE_ASSIGN_OR_RETURN(c.num_layers, r.PositiveInt("num_layers"));
  if (!r.Has("layer_types") || !r.raw("layer_types").is_array())
    return Fail(r.Bad("layer_types", "missing or not an array of \"mla\"/\"dsa\"/\"delta\""));
  const json& types = r.raw("layer_types");
  for (size_t i = 0; i < types.size(); ++i) {
    std::string field = "layer_types[" + std::to_string(i) + "]";
    if (!types[i].is_string()) return Fail(Invalid(source, field, "must be a string, got " + types[i].dump()));
    std::string k = types[i].get<std::string>();
    if (k == "mla") c.layer_types.push_back(LayerKind::kMla);
    else if (k == "dsa") c.layer_types.push_back(LayerKind::kDsa);
    else if (k == "delta") c.layer_types.push_back(LayerKind::kDelta);
    else return Fail(Invalid(source, field, "'" + k + "' is not one of mla, dsa, delta"));
  }
  MOE_ASSIGN_OR_RETURN(c.first_dense_layers, r.NonNegativeInt("first_dense_layers", 0));
  if (c.first_dense_layers > 0) {
    MOE_ASSIGN_OR_RETURN(c.intermediate_size, r.PositiveInt("intermediate_size"));
  } else {
    MOE_ASSIGN_OR_RETURN(c.intermediate_size, r.NonNegativeInt("intermediate_size", 0));
  }
  MOE_ASSIGN_OR_RETURN(c.rms_norm_eps, r.PositiveNumber("rms_norm_eps", 1e-6));
  MOE_ASSIGN_OR_RETURN(c.max_position_embeddings, r.Int("max_position_embeddings"));
  if (c.max_position_embeddings <= 0)
    return Fail(r.Bad("max_position_embeddings", "must be a positive integer"));

  // Multi-token prediction (model.md 15): one mla block with a dense FFN.
  MOE_ASSIGN_OR_RETURN(c.num_nextn_predict_layers, r.NonNegativeInt("num_nextn_predict_layers", 0));
  if (c.num_nextn_predict_layers > 1)
    return Fail(r.Bad("num_nextn_predict_layers", std::to_string(c.num_nextn_predict_layers) +
                                                      " is not supported: 0 (none) or 1 (one module, chained for longer drafts)"));
  if (c.num_nextn_predict_layers > 0 && c.first_dense_layers == 0) {
    // The MTP block's dense FFN is intermediate_size wide.
    MOE_ASSIGN_OR_RETURN(c.intermediate_size, r.PositiveInt("intermediate_size"));
  }
  if (c.NeedsMla()) {
    MOE_ASSIGN_OR_RETURN(auto m, r.Object("mla"));
    MOE_TRY(ParseMla(m, c.mla));
  }
  if (c.HasKind(LayerKind::kDsa)) {
    MOE_ASSIGN_OR_RETURN(auto d, r.Object("dsa"));
    MOE_TRY(ParseDsa(d, c.dsa));
  }
  if (c.HasKind(LayerKind::kDelta)) {
    MOE_ASSIGN_OR_RETURN(auto d, r.Object("delta"));
    MOE_TRY(ParseDelta(d, c.delta));
  }
  if (c.num_layers > c.first_dense_layers) {
    MOE_ASSIGN_OR_RETURN(auto m, r.Object("moe"));
    MOE_TRY(ParseMoe(m, c.moe));
  }
  if (r.Has("rope")) {
    MOE_ASSIGN_OR_RETURN(auto p, r.Object("rope"));
    MOE_TRY(ParseRope(p, c.rope));
  }
  if (r.Has("quantization")) {
    MOE_ASSIGN_OR_RETURN(auto q, r.Object("quantization"));
    MOE_ASSIGN_OR_RETURN(std::string format, q.String("format"));
    if (format == "mxfp4") {
      c.expert_format = ExpertFormat::kMxfp4;
      MOE_ASSIGN_OR_RETURN(int block, q.PositiveInt("block_size", 32));
      if (block != 32) return Fail(q.Bad("block_size", "must be 32 (OCP MX), got " + std::to_string(block)));
    } else if (format == "bf16") {
      // BF16 experts are plain tensors: a block size would mean the file
      // was written for another format.
      c.expert_format = ExpertFormat::kBf16;
      if (q.Has("block_size"))
        return Fail(q.Bad("block_size", "has no meaning for format \"bf16\" (BF16 experts have no blocks)"));
    } else {
      return Fail(q.Bad("format", "'" + format + "' is not supported (expected \"mxfp4\" or \"bf16\")"));
    }
    if (q.Has("applies_to") && q.raw("applies_to") != json::array({"experts"}))
      return Fail(q.Bad("applies_to", "must be [\"experts\"], got " + q.raw("applies_to").dump()));
  }
  if (r.Has("thinking_budgets")) {
    MOE_ASSIGN_OR_RETURN(auto t, r.Object("thinking_budgets"));
    MOE_ASSIGN_OR_RETURN(c.thinking_budgets.low, t.NonNegativeInt("low"));
    MOE_ASSIGN_OR_RETURN(c.thinking_budgets.medium, t.NonNegativeInt("medium"));
    MOE_ASSIGN_OR_RETURN(c.thinking_budgets.high, t.NonNegativeInt("high"));
  }
  if (r.Has("vision")) {
    MOE_ASSIGN_OR_RETURN(auto v, r.Object("vision"));
    c.vision.emplace();
    MOE_TRY(ParseVision(v, *c.vision));
  }
  MOE_TRY(ValidateModelConfig(c, source));
  return c;
}

Status ValidateModelConfig(const ModelConfig& c, const std::string& source) {
  auto bad = [&](const std::string& field, const std::string& what) { return Fail(Invalid(source, field, what)); };
  auto s = [](auto v) { return std::to_string(v); };
  if (static_cast<int>(c.layer_types.size()) != c.num_layers)
    return bad("layer_types", "has " + s(c.layer_types.size()) + " entries but num_layers is " + s(c.num_layers));
  if (c.first_dense_layers > c.num_layers)
    return bad("first_dense_layers", s(c.first_dense_layers) + " exceeds num_layers (" + s(c.num_layers) + ")");
  if (c.vocab_size < 268) return bad("vocab_size", s(c.vocab_size) + " must be >= 268 (256 bytes + 12 special tokens)");
  if (c.hidden_size % 32) return bad("hidden_size", s(c.hidden_size) + " must be a multiple of 32");
  if (c.num_nextn_predict_layers < 0 || c.num_nextn_predict_layers > 1)
    return bad("num_nextn_predict_layers", s(c.num_nextn_predict_layers) + " must be 0 or 1");
  if (c.num_nextn_predict_layers > 0) {
    if (c.mtp_kind == LayerKind::kDelta)
      return bad("num_nextn_predict_layers", "a DeltaNet multi-token-prediction block is not supported");
    if (!c.mtp_moe && c.intermediate_size <= 0)
      return bad("intermediate_size", "must be positive: the multi-token-prediction block's dense FFN is that wide");
    if (c.mtp_kind == LayerKind::kDsa && !c.HasKind(LayerKind::kDsa))
      return bad("num_nextn_predict_layers", "a DSA multi-token-prediction block needs the dsa parameters of a DSA layer");
    if (c.mtp_kind == LayerKind::kGqa && !c.HasKind(LayerKind::kGqa))
      return bad("num_nextn_predict_layers", "a gated-GQA multi-token-prediction block needs a gated-GQA layer's parameters");
    if (c.mtp_moe && c.num_layers <= c.first_dense_layers)
      return bad("num_nextn_predict_layers", "an MoE multi-token-prediction block needs the moe parameters of an MoE layer");
  }
  if (c.NeedsMla()) {
    if (c.mla.qk_rope_head_dim % 2) return bad("mla.qk_rope_head_dim", s(c.mla.qk_rope_head_dim) + " must be even");
  }
  if (c.HasKind(LayerKind::kDsa)) {
    if (c.dsa.index_head_dim < c.mla.qk_rope_head_dim)
      return bad("dsa.index_head_dim", s(c.dsa.index_head_dim) + " must be >= mla.qk_rope_head_dim (" +
                                           s(c.mla.qk_rope_head_dim) + ")");
    if (c.dsa.index_head_dim % 2) return bad("dsa.index_head_dim", s(c.dsa.index_head_dim) + " must be even");
  }
  if (c.num_layers > c.first_dense_layers) {
    const MoeConfig& m = c.moe;
    if (m.moe_intermediate_size % 32)
      return bad("moe.moe_intermediate_size", s(m.moe_intermediate_size) + " must be a multiple of 32");
    if (m.num_experts % m.n_group)
      return bad("moe.num_experts", s(m.num_experts) + " must be divisible by moe.n_group (" + s(m.n_group) + ")");
    if (m.num_experts / m.n_group < 2)
      return bad("moe.n_group", "num_experts / n_group = " + s(m.num_experts / m.n_group) +
                                    " must be >= 2 (a group score sums its two best experts)");
    if (m.topk_group > m.n_group)
      return bad("moe.topk_group", s(m.topk_group) + " must be <= moe.n_group (" + s(m.n_group) + ")");
    if (m.topk_group * (m.num_experts / m.n_group) < m.experts_per_token)
      return bad("moe.experts_per_token", s(m.experts_per_token) + " exceeds the experts in the kept groups (topk_group * num_experts / n_group = " +
                                              s(m.topk_group * (m.num_experts / m.n_group)) + ")");
  }
  if (c.rope.yarn && static_cast<double>(c.max_position_embeddings) > c.rope.factor * c.rope.original_max_position)
    return bad("max_position_embeddings", s(c.max_position_embeddings) + " exceeds rope.factor * rope.original_max_position (" +
                                              nlohmann::json(c.rope.factor * c.rope.original_max_position).dump() + ")");
  const auto& t = c.thinking_budgets;
  if (!(t.low <= t.medium && t.medium <= t.high))
    return bad("thinking_budgets", "must satisfy low <= medium <= high");
  if (c.vision) MOE_TRY(ValidateVisionConfig(*c.vision, c.vocab_size, source));
  return Ok();
}

Status ValidateWorldSize(const ModelConfig& c, int world_size) {
  if (world_size <= 0) return Fail(Error::InvalidArgument("world size must be positive, got " + std::to_string(world_size)));
  if (c.moe.num_experts % world_size)
    return Fail(Error::InvalidArgument("moe.num_experts (" + std::to_string(c.moe.num_experts) +
                                       ") must be divisible by the expert-parallel world size (" +
                                       std::to_string(world_size) + ")"));
  return Ok();
}

Result<ModelConfig> LoadModelConfig(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Fail(Error::NotFound(path + ": cannot open"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseModelConfig(ss.str(), path);
}

std::string ModelConfig::ToJson() const {
  nlohmann::ordered_json j;
  j["architecture"] = architecture.empty() ? "moe-dsa-v1" : architecture;
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["num_layers"] = num_layers;
  j["layer_types"] = nlohmann::ordered_json::array();
  for (auto k : layer_types) j["layer_types"].push_back(LayerKindName(k));
  j["first_dense_layers"] = first_dense_layers;
  j["intermediate_size"] = intermediate_size;
  j["rms_norm_eps"] = rms_norm_eps;
  if (num_nextn_predict_layers > 0) j["num_nextn_predict_layers"] = num_nextn_predict_layers;
  if (NeedsMla())
    j["mla"] = {{"num_heads", mla.num_heads}, {"q_lora_rank", mla.q_lora_rank}, {"kv_lora_rank", mla.kv_lora_rank},
                {"qk_nope_head_dim", mla.qk_nope_head_dim}, {"qk_rope_head_dim", mla.qk_rope_head_dim},
                {"v_head_dim", mla.v_head_dim}, {"output_gate", mla.output_gate}};
  if (HasKind(LayerKind::kDsa))
    j["dsa"] = {{"index_n_heads", dsa.index_n_heads}, {"index_head_dim", dsa.index_head_dim}, {"index_topk", dsa.index_topk}};
  if (HasKind(LayerKind::kDelta))
    j["delta"] = {{"num_heads", delta.num_heads}, {"head_k_dim", delta.head_k_dim}, {"head_v_dim", delta.head_v_dim},
                  {"conv_size", delta.conv_size}, {"norm_eps", delta.norm_eps}};
  if (num_layers > first_dense_layers)
    j["moe"] = {{"num_experts", moe.num_experts}, {"experts_per_token", moe.experts_per_token},
                {"num_shared_experts", moe.num_shared_experts}, {"moe_intermediate_size", moe.moe_intermediate_size},
                {"n_group", moe.n_group}, {"topk_group", moe.topk_group},
                {"routed_scaling_factor", moe.routed_scaling_factor}, {"score_func", moe.score_func}};
  j["rope"] = {{"theta", rope.theta}, {"scaling", rope.yarn ? "yarn" : "none"}, {"factor", rope.factor},
               {"original_max_position", rope.original_max_position}, {"beta_fast", rope.beta_fast},
               {"beta_slow", rope.beta_slow}, {"mscale", rope.mscale}};
  j["max_position_embeddings"] = max_position_embeddings;
  if (expert_format == ExpertFormat::kBf16)
    j["quantization"] = {{"format", "bf16"}};
  else
    j["quantization"] = {{"format", "mxfp4"}, {"block_size", 32}, {"applies_to", {"experts"}}};
  j["thinking_budgets"] = {{"low", thinking_budgets.low}, {"medium", thinking_budgets.medium}, {"high", thinking_budgets.high}};
  if (vision) {
    const VisionConfig& v = *vision;
    j["vision"] = {{"hidden_size", v.hidden_size}, {"num_layers", v.num_layers}, {"num_heads", v.num_heads},
                   {"intermediate_size", v.intermediate_size}, {"patch_size", v.patch_size},
                   {"merge_size", v.merge_size}, {"max_patches", v.max_patches},
                   {"projector_hidden_size", v.projector_hidden_size}, {"norm_eps", v.norm_eps},
                   {"rope_theta", v.rope_theta}, {"image_mean", v.image_mean}, {"image_std", v.image_std},
                   {"image_token_id", v.image_token_id}, {"image_start_token_id", v.image_start_token_id},
                   {"image_end_token_id", v.image_end_token_id}};
  }
  return j.dump(2) + "\n";
}

namespace {

// model.md section 2, verbatim.
constexpr const char* kTinyConfig = R"({
  "architecture": "moe-dsa-v1",
  "vocab_size": 384, "hidden_size": 256, "num_layers": 6,
  "layer_types": ["mla", "mla", "delta", "dsa", "delta", "dsa"],
  "first_dense_layers": 1, "intermediate_size": 512, "rms_norm_eps": 1e-6,
  "mla":   {"num_heads": 4, "q_lora_rank": 96, "kv_lora_rank": 64,
            "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
            "output_gate": true},
  "dsa":   {"index_n_heads": 4, "index_head_dim": 32, "index_topk": 2048},
  "delta": {"num_heads": 4, "head_k_dim": 32, "head_v_dim": 64,
            "conv_size": 4, "norm_eps": 1e-5},
  "moe":   {"num_experts": 16, "experts_per_token": 4, "num_shared_experts": 1,
            "moe_intermediate_size": 128, "n_group": 4, "topk_group": 2,
            "routed_scaling_factor": 2.5, "score_func": "sigmoid"},
  "rope":  {"theta": 10000.0, "scaling": "yarn", "factor": 256.0,
            "original_max_position": 4096, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0},
  "max_position_embeddings": 1048576,
  "quantization": {"format": "mxfp4", "block_size": 32, "applies_to": ["experts"]},
  "thinking_budgets": {"low": 256, "medium": 2048, "high": 16384}
})";

// About 200 MB: large enough that decode is bound by memory bandwidth, small
// enough for CI's disk and a 2-core machine. Same mix of layer kinds as tiny.
constexpr const char* kSmallConfig = R"({
  "architecture": "moe-dsa-v1",
  "vocab_size": 512, "hidden_size": 1024, "num_layers": 8,
  "layer_types": ["mla", "mla", "delta", "dsa", "delta", "dsa", "delta", "dsa"],
  "first_dense_layers": 1, "intermediate_size": 2816, "rms_norm_eps": 1e-6,
  "mla":   {"num_heads": 8, "q_lora_rank": 384, "kv_lora_rank": 256,
            "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64,
            "output_gate": true},
  "dsa":   {"index_n_heads": 8, "index_head_dim": 64, "index_topk": 2048},
  "delta": {"num_heads": 8, "head_k_dim": 64, "head_v_dim": 128,
            "conv_size": 4, "norm_eps": 1e-5},
  "moe":   {"num_experts": 32, "experts_per_token": 4, "num_shared_experts": 1,
            "moe_intermediate_size": 384, "n_group": 4, "topk_group": 2,
            "routed_scaling_factor": 2.5, "score_func": "sigmoid"},
  "rope":  {"theta": 10000.0, "scaling": "yarn", "factor": 256.0,
            "original_max_position": 4096, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0},
  "max_position_embeddings": 1048576,
  "quantization": {"format": "mxfp4", "block_size": 32, "applies_to": ["experts"]},
  "thinking_budgets": {"low": 256, "medium": 2048, "high": 16384}
})";

// Long contexts at small width: the flagship's mix of layer kinds (mostly
// Gated DeltaNet, whose state does not grow, one DSA layer in four, whose
// cache row and indexer do) at tiny's widths, with MXFP4 experts. Its cache
// is 2 DSA layers x 4 x (64 + 16 + 32) = 896 bytes per token (896 MiB at
// 1M tokens) and 6 DeltaNet states of 38,912 bytes per sequence, so a
// million-token prefill fits a small node and its time is the context's:
// bench/long_context's bench_long_prefill runs it.
constexpr const char* kLongConfig = R"({
  "architecture": "moe-dsa-v1",
  "vocab_size": 384, "hidden_size": 256, "num_layers": 8,
  "layer_types": ["delta", "delta", "delta", "dsa", "delta", "delta", "delta", "dsa"],
  "first_dense_layers": 1, "intermediate_size": 512, "rms_norm_eps": 1e-6,
  "mla":   {"num_heads": 4, "q_lora_rank": 96, "kv_lora_rank": 64,
            "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
            "output_gate": true},
  "dsa":   {"index_n_heads": 4, "index_head_dim": 32, "index_topk": 2048},
  "delta": {"num_heads": 4, "head_k_dim": 32, "head_v_dim": 64,
            "conv_size": 4, "norm_eps": 1e-5},
  "moe":   {"num_experts": 16, "experts_per_token": 4, "num_shared_experts": 1,
            "moe_intermediate_size": 128, "n_group": 4, "topk_group": 2,
            "routed_scaling_factor": 2.5, "score_func": "sigmoid"},
  "rope":  {"theta": 10000.0, "scaling": "yarn", "factor": 256.0,
            "original_max_position": 4096, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0},
  "max_position_embeddings": 1048576,
  "quantization": {"format": "mxfp4", "block_size": 32, "applies_to": ["experts"]},
  "thinking_budgets": {"low": 256, "medium": 2048, "high": 16384}
})";

}  // namespace

Result<ModelConfig> PresetConfig(const std::string& name) {
  if (name == "tiny") return ParseModelConfig(kTinyConfig, "preset 'tiny'");
  if (name == "small") return ParseModelConfig(kSmallConfig, "preset 'small'");
  if (name == "long") return ParseModelConfig(kLongConfig, "preset 'long'");
  return Fail(Error::InvalidArgument("unknown preset '" + name + "' (expected tiny, small or long)"));
}

}  // namespace moeserve::engine
