// config.json of a Hugging Face gpt-oss checkpoint -> GptOssConfig, with the
// YaRN RoPE tables computed as the Hugging Face rope utilities do (see
// docs/model-format.md, "gpt-oss", for where OpenAI's reference differs).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numbers>
#include <sstream>

#include "moeserve/engine/gpt_oss_model.hpp"

namespace moeserve::engine {
namespace {

using json = nlohmann::json;

Error Bad(const std::string& what) { return Error::InvalidArgument("gpt-oss config.json: " + what); }

// An integer field in [lo, hi]; `fallback` when absent and fallback >= 0.
Result<int> IntField(const json& j, const char* key, long long lo, long long hi, long long fallback = -1) {
  if (!j.contains(key) || j[key].is_null()) {
    if (fallback >= 0) return static_cast<int>(fallback);
    return Fail(Bad(std::string("missing '") + key + "'"));
  }
  const json& v = j[key];
  if (!v.is_number_integer()) return Fail(Bad(std::string("'") + key + "' must be an integer"));
  long long x = v.get<long long>();
  if (x < lo || x > hi)
    return Fail(Bad(std::string("'") + key + "' = " + std::to_string(x) + " is outside [" + std::to_string(lo) + ", " +
                    std::to_string(hi) + "]"));
  return static_cast<int>(x);
}

Result<double> NumField(const json& j, const char* key, double lo, double hi, double fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  const json& v = j[key];
  if (!v.is_number()) return Fail(Bad(std::string("'") + key + "' must be a number"));
  double x = v.get<double>();
  if (!(x >= lo && x <= hi)) return Fail(Bad(std::string("'") + key + "' is outside its range"));
  return x;
}

}  // namespace

Result<GptOssConfig> ParseGptOssConfig(const std::string& text) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Fail(Bad("not a JSON object"));
  if (!j.contains("model_type") || j["model_type"] != "gpt_oss") return Fail(Bad("model_type is not \"gpt_oss\""));
  GptOssConfig c;
  constexpr long long kMaxDim = 1 << 16;
  MOE_ASSIGN_OR_RETURN(c.hidden, IntField(j, "hidden_size", 32, kMaxDim));
  MOE_ASSIGN_OR_RETURN(c.intermediate, IntField(j, "intermediate_size", 32, kMaxDim));
  MOE_ASSIGN_OR_RETURN(c.layers, IntField(j, "num_hidden_layers", 1, 1024));
  MOE_ASSIGN_OR_RETURN(c.heads, IntField(j, "num_attention_heads", 1, 1024));
  MOE_ASSIGN_OR_RETURN(c.kv_heads, IntField(j, "num_key_value_heads", 1, 1024));
  MOE_ASSIGN_OR_RETURN(c.head_dim, IntField(j, "head_dim", 2, 1024, c.hidden / c.heads));
  MOE_ASSIGN_OR_RETURN(c.experts, IntField(j, "num_local_experts", 1, 4096));
  int ept_fallback = -1;
  if (j.contains("experts_per_token") && j["experts_per_token"].is_number_integer())
    ept_fallback = j["experts_per_token"].get<int>();
  MOE_ASSIGN_OR_RETURN(c.experts_per_token, IntField(j, "num_experts_per_tok", 1, 4096, ept_fallback));
  MOE_ASSIGN_OR_RETURN(c.vocab, IntField(j, "vocab_size", 1, 1 << 22));
  MOE_ASSIGN_OR_RETURN(c.sliding_window, IntField(j, "sliding_window", 1, 1 << 24));
  MOE_ASSIGN_OR_RETURN(c.max_position, IntField(j, "max_position_embeddings", 1, 1 << 30, 4096));
  if (c.hidden % 32 || c.intermediate % 32)
    return Fail(Bad("hidden_size and intermediate_size must be multiples of 32 (MXFP4 blocks)"));
  if (c.heads % c.kv_heads) return Fail(Bad("num_attention_heads must be a multiple of num_key_value_heads"));
  if (c.head_dim % 2) return Fail(Bad("head_dim must be even (RoPE pairs)"));
  if (c.experts_per_token > c.experts) return Fail(Bad("num_experts_per_tok exceeds num_local_experts"));
  MOE_ASSIGN_OR_RETURN(double eps, NumField(j, "rms_norm_eps", 1e-12, 1, 1e-5));
  MOE_ASSIGN_OR_RETURN(double limit, NumField(j, "swiglu_limit", 1e-3, 1e6, 7.0));
  c.rms_eps = static_cast<float>(eps);
  c.swiglu_limit = static_cast<float>(limit);
  if (j.contains("tie_word_embeddings")) {
    if (!j["tie_word_embeddings"].is_boolean()) return Fail(Bad("'tie_word_embeddings' must be a boolean"));
    c.tie_embeddings = j["tie_word_embeddings"].get<bool>();
  }

  // Layer kinds: layer_types when given, else OpenAI's rule (even layers banded).
  c.sliding.resize(c.layers);
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    const json& lt = j["layer_types"];
    if (!lt.is_array() || static_cast<int>(lt.size()) != c.layers)
      return Fail(Bad("'layer_types' must list num_hidden_layers entries"));
    for (int i = 0; i < c.layers; ++i) {
      if (lt[i] == "sliding_attention") c.sliding[i] = true;
      else if (lt[i] == "full_attention") c.sliding[i] = false;
      else return Fail(Bad("layer_types[" + std::to_string(i) + "] is neither sliding_attention nor full_attention"));
    }
  } else {
    for (int i = 0; i < c.layers; ++i) c.sliding[i] = i % 2 == 0;
  }

  // RoPE: YaRN by parts when rope_scaling says so, as the Hugging Face rope
  // utilities compute it (correction range clamped to [0, head_dim - 1],
  // floor/ceil unless rope_scaling.truncate is false).
  MOE_ASSIGN_OR_RETURN(double theta, NumField(j, "rope_theta", 1.0, 1e12, 10000.0));
  const int d = c.head_dim, half = d / 2;
  std::vector<double> freq(half);
  for (int i = 0; i < half; ++i) freq[i] = std::pow(theta, 2.0 * i / d);
  c.inv_freq.resize(half);
  for (int i = 0; i < half; ++i) c.inv_freq[i] = static_cast<float>(1.0 / freq[i]);
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    const json& rs = j["rope_scaling"];
    if (!rs.is_object()) return Fail(Bad("'rope_scaling' must be an object"));
    std::string type = rs.value("rope_type", rs.value("type", std::string()));
    if (type != "yarn") return Fail(Bad("rope_scaling.rope_type '" + type + "' is not supported (only yarn)"));
    MOE_ASSIGN_OR_RETURN(double factor, NumField(rs, "factor", 1.0, 1e6, -1));
    if (factor < 1.0) return Fail(Bad("rope_scaling.factor is missing or below 1"));
    MOE_ASSIGN_OR_RETURN(double beta_fast, NumField(rs, "beta_fast", 1e-6, 1e6, 32.0));
    MOE_ASSIGN_OR_RETURN(double beta_slow, NumField(rs, "beta_slow", 1e-6, 1e6, 1.0));
    MOE_ASSIGN_OR_RETURN(int max_pos, IntField(j, "max_position_embeddings", 1, 1 << 30, 4096));
    MOE_ASSIGN_OR_RETURN(int orig, IntField(rs, "original_max_position_embeddings", 1, 1 << 30, max_pos));
    if (rs.contains("truncate") && !rs["truncate"].is_boolean()) return Fail(Bad("rope_scaling.truncate must be a boolean"));
    bool truncate = rs.value("truncate", true);
    MOE_ASSIGN_OR_RETURN(double attn_factor, NumField(rs, "attention_factor", 1e-6, 1e6, 0.1 * std::log(factor) + 1.0));
    if (factor > 1.0) {
      auto corr = [&](double rot) { return d * std::log(orig / (rot * 2 * std::numbers::pi)) / (2 * std::log(theta)); };
      double low = corr(beta_fast), high = corr(beta_slow);
      if (truncate) low = std::floor(low), high = std::ceil(high);
      low = std::max(low, 0.0);
      high = std::min(high, static_cast<double>(d - 1));
      if (low == high) high += 0.001;
      for (int i = 0; i < half; ++i) {
        double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
        c.inv_freq[i] = static_cast<float>(1.0 / (factor * freq[i]) * ramp + 1.0 / freq[i] * (1 - ramp));
      }
      c.rope_concentration = static_cast<float>(attn_factor);
    }
  }

  if (j.contains("eos_token_id")) {
    const json& e = j["eos_token_id"];
    if (e.is_number_integer()) c.eos_tokens.push_back(e.get<int>());
    else if (e.is_array())
      for (const auto& x : e)
        if (x.is_number_integer()) c.eos_tokens.push_back(x.get<int>());
  }
  return c;
}

}  // namespace moeserve::engine
