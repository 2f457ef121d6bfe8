// Qwen3-Next's config.json (config.hpp). Keys and defaults as the Hugging
// Face configuration (configuration_qwen3_next.py) defines them; what this
// engine does not implement (biases, other activations, rope scaling) is
// refused by name rather than ignored.
#include "families/qwen3_next/config.hpp"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

namespace moeserve::engine::qwen3_next {

namespace {

using nlohmann::json;

class Reader {
 public:
  Reader(const json& j, std::string source) : j_(j), source_(std::move(source)) {}
  Error Bad(const std::string& field, const std::string& why) const {
    return Error::InvalidArgument(source_ + ": " + field + ": " + why);
  }
  // An integer in [lo, hi]; `def` when absent (required when def < lo).
  Result<int64_t> Int(const char* key, int64_t lo, int64_t hi, int64_t def) const {
    if (!j_.contains(key) || j_[key].is_null()) {
      if (def < lo) return Fail(Bad(key, "is required"));
      return def;
    }
    const json& v = j_[key];
    if (!v.is_number_integer()) return Fail(Bad(key, "must be an integer"));
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi)
      return Fail(Bad(key, std::to_string(x) + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]"));
    return x;
  }
  Result<double> Num(const char* key, double lo, double hi, double def, const json* in = nullptr) const {
    const json& o = in ? *in : j_;
    if (!o.contains(key) || o[key].is_null()) return def;
    if (!o[key].is_number()) return Fail(Bad(key, "must be a number"));
    const double x = o[key].get<double>();
    if (!(x >= lo && x <= hi)) return Fail(Bad(key, std::to_string(x) + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]"));
    return x;
  }
  Result<bool> Bool(const char* key, bool def) const {
    if (!j_.contains(key) || j_[key].is_null()) return def;
    if (!j_[key].is_boolean()) return Fail(Bad(key, "must be true or false"));
    return j_[key].get<bool>();
  }
  const json& j() const { return j_; }

 private:
  const json& j_;
  std::string source_;
};

constexpr int64_t kMaxDim = 1 << 20;

}  // namespace

Result<Config> ParseConfig(const std::string& text, const std::string& source) {
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Fail(Error::InvalidArgument(source + ": not a JSON object"));
  Reader r(j, source);
  if (!j.contains("model_type") || j["model_type"] != "qwen3_next")
    return Fail(r.Bad("model_type", "must be \"qwen3_next\""));
  Config c;
  MOE_ASSIGN_OR_RETURN(int64_t v, r.Int("vocab_size", 1, 1 << 24, 0)); c.vocab_size = static_cast<int>(v);
  MOE_ASSIGN_OR_RETURN(v, r.Int("hidden_size", 1, kMaxDim, 0)); c.hidden_size = static_cast<int>(v);
  MOE_ASSIGN_OR_RETURN(v, r.Int("num_hidden_layers", 1, 1024, 0)); c.num_layers = static_cast<int>(v);
  MOE_ASSIGN_OR_RETURN(v, r.Int("num_attention_heads", 1, 4096, 0)); c.num_heads = static_cast<int>(v);
  MOE_ASSIGN_OR_RETURN(v, r.Int("num_key_value_heads", 1, 4096, 0)); c.num_kv_heads = static_cast<int>(v);
  if (c.num_heads % c.num_kv_heads != 0)
    return Fail(r.Bad("num_key_value_heads", std::to_string(c.num_kv_heads) + " does not divide num_attention_heads (" +
                                                 std::to_string(c.num_heads) + ")"));
  MOE_ASSIGN_OR_RETURN(v, r.Int("head_dim", 2, 4096, c.hidden_size / c.num_heads)); c.head_dim = static_cast<int>(v);
  // Newer configurations nest rope_theta and partial_rotary_factor in rope_parameters.
  const json* rope = j.contains("rope_parameters") && j["rope_parameters"].is_object() ? &j["rope_parameters"] : nullptr;
  MOE_ASSIGN_OR_RETURN(double prf, r.Num("partial_rotary_factor", 0.0, 1.0, 0.25));
  MOE_ASSIGN_OR_RETURN(c.rope_theta, r.Num("rope_theta", 1.0, 1e12, 10000.0));
  if (rope) {
    MOE_ASSIGN_OR_RETURN(prf, r.Num("partial_rotary_factor", 0.0, 1.0, prf, rope));
    MOE_ASSIGN_OR_RETURN(c.rope_theta, r.Num("rope_theta", 1.0, 1e12, c.rope_theta, rope));
    if (rope->contains("rope_type") && (*rope)["rope_type"] != "default")
      return Fail(r.Bad("rope_parameters.rope_type", "only \"default\" is supported"));
  }
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null())
    return Fail(r.Bad("rope_scaling", "is not supported (only the default rotary embedding)"));
  c.rotary_dim = static_cast<int>(c.head_dim * prf);
  if (c.rotary_dim % 2 != 0 || c.rotary_dim < 2)
    return Fail(r.Bad("partial_rotary_factor", "gives a rotary dimension of " + std::to_string(c.rotary_dim) +
                                                   " (must be even and at least 2)"));
  MOE_ASSIGN_OR_RETURN(v, r.Int("linear_num_key_heads", 1, 4096, 16)); c.linear_k_heads = static_cast<int>(v);
  MOE_ASSIGN_OR_RETURN(v, r.Int("linear_num_value_heads", 1, 4096, 32)); c.linear_v_heads = static_cast<int>(v);
  if (c.linear_v_heads % c.linear_k_heads != 0)
    return Fail(r.Bad("linear_num_value_heads", std::to_string(c.linear_v_heads) + " is not a multiple of linear_num_key_heads (" +
                                                    std::to_string(c.linear_k_heads) + ")"));
  MOE_ASSIGN_OR_RETURN(v, r.Int("linear_key_head_dim", 1, 4096, 128)); c.linear_k_dim = static_cast<int>(v);
  MOE_ASSIGN_OR_RETURN(v, r.Int("linear_value_head_dim", 1, 4096, 128)); c.linear_v_dim = static_cast<int>(v);
  MOE_ASSIGN_OR_RETURN(v, r.Int("linear_conv_kernel_dim", 1, 64, 4)); c.conv_kernel = static_cast<int>(v);
  MOE_ASSIGN_OR_RETURN(v, r.Int("intermediate_size", 1, kMaxDim, 5632)); c.intermediate_size = static_cast<int>(v);
  MOE_ASSIGN_OR_RETURN(v, r.Int("num_experts", 0, 1 << 16, 512)); c.num_experts = static_cast<int>(v);
  MOE_ASSIGN_OR_RETURN(v, r.Int("num_experts_per_tok", 1, 1 << 16, 10)); c.experts_per_token = static_cast<int>(v);
  if (c.num_experts > 0 && c.experts_per_token > c.num_experts)
    return Fail(r.Bad("num_experts_per_tok", std::to_string(c.experts_per_token) + " is more than num_experts (" +
                                                 std::to_string(c.num_experts) + ")"));
  MOE_ASSIGN_OR_RETURN(v, r.Int("moe_intermediate_size", 1, kMaxDim, 512)); c.moe_intermediate_size = static_cast<int>(v);
  MOE_ASSIGN_OR_RETURN(v, r.Int("shared_expert_intermediate_size", 0, kMaxDim, 512));
  c.shared_expert_intermediate_size = static_cast<int>(v);
  MOE_ASSIGN_OR_RETURN(c.norm_topk_prob, r.Bool("norm_topk_prob", true));
  MOE_ASSIGN_OR_RETURN(c.rms_norm_eps, r.Num("rms_norm_eps", 1e-12, 1.0, 1e-6));
  MOE_ASSIGN_OR_RETURN(c.tie_word_embeddings, r.Bool("tie_word_embeddings", false));
  MOE_ASSIGN_OR_RETURN(c.max_position_embeddings, r.Int("max_position_embeddings", 1, int64_t{1} << 40, 32768));
  MOE_ASSIGN_OR_RETURN(bool attention_bias, r.Bool("attention_bias", false));
  if (attention_bias) return Fail(r.Bad("attention_bias", "true is not supported"));
  if (j.contains("hidden_act") && j["hidden_act"] != "silu") return Fail(r.Bad("hidden_act", "only \"silu\" is supported"));

  // Which layers are full attention: layer_types, else every
  // full_attention_interval-th layer (the last of each group).
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    const json& lt = j["layer_types"];
    if (!lt.is_array() || lt.size() != static_cast<size_t>(c.num_layers))
      return Fail(r.Bad("layer_types", "must list num_hidden_layers (" + std::to_string(c.num_layers) + ") entries"));
    for (size_t i = 0; i < lt.size(); ++i) {
      if (lt[i] == "full_attention") c.full_attention.push_back(true);
      else if (lt[i] == "linear_attention") c.full_attention.push_back(false);
      else return Fail(r.Bad("layer_types[" + std::to_string(i) + "]", "must be \"full_attention\" or \"linear_attention\""));
    }
  } else {
    MOE_ASSIGN_OR_RETURN(v, r.Int("full_attention_interval", 1, 1024, 4));
    for (int i = 0; i < c.num_layers; ++i) c.full_attention.push_back((i + 1) % v == 0);
  }
  MOE_ASSIGN_OR_RETURN(v, r.Int("decoder_sparse_step", 1, 1024, 1));
  const int64_t step = v;
  std::set<int64_t> mlp_only;
  if (j.contains("mlp_only_layers") && !j["mlp_only_layers"].is_null()) {
    if (!j["mlp_only_layers"].is_array()) return Fail(r.Bad("mlp_only_layers", "must be a list of layer indices"));
    for (const json& x : j["mlp_only_layers"]) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= c.num_layers)
        return Fail(r.Bad("mlp_only_layers", "holds something that is not a layer index in [0, " + std::to_string(c.num_layers) + ")"));
      mlp_only.insert(x.get<int64_t>());
    }
  }
  for (int i = 0; i < c.num_layers; ++i) c.sparse.push_back(!mlp_only.count(i) && c.num_experts > 0 && (i + 1) % step == 0);
  if (j.contains("eos_token_id")) {
    const json& e = j["eos_token_id"];
    auto add = [&](const json& x) -> Status {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= c.vocab_size)
        return Fail(r.Bad("eos_token_id", "must be token ids below vocab_size"));
      c.eos_token_ids.push_back(x.get<int>());
      return Ok();
    };
    if (e.is_array()) {
      for (const json& x : e) MOE_TRY(add(x));
    } else if (!e.is_null()) {
      MOE_TRY(add(e));
    }
  }
  return c;
}

Result<Config> LoadConfig(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  std::ifstream in(path, std::ios::binary);
  if (!in) return Fail(Error::NotFound(path + ": cannot open"));
  std::ostringstream text;
  text << in.rdbuf();
  return ParseConfig(text.str(), path);
}

}  // namespace moeserve::engine::qwen3_next
