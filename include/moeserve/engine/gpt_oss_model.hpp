// The gpt-oss family on CPU, loaded from a Hugging Face checkpoint directory
// as published (config.json model_type "gpt_oss", safetensors shards listed by
// model.safetensors.index.json, MXFP4 experts as *_blocks / *_scales): no
// conversion step. docs/model-format.md ("gpt-oss") describes what is accepted.
//
// Weights stay as published: dense matrices BF16 (read in place from the
// mapped shards), experts MXFP4 (repacked once for the kernels, 4.25 bits a
// weight), so gpt-oss-20b needs about 13 GB. Products run through a KernelSet
// (cpu_kernels.hpp): the best this CPU supports, or the reference set. The
// daemon serves it through GptOssEngine (gpt_oss_engine.hpp): prefill chunks
// one sequence at a time, decode steps batched across sequences (ForwardBatch).
//
// Thread safety: immutable after Load(); Forward() may run concurrently on
// distinct states.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "moeserve/common/status.hpp"
#include "moeserve/kernels/cpu_kernels.hpp"

namespace moeserve::engine {

struct GptOssConfig {
  int hidden = 0, intermediate = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int experts = 0, experts_per_token = 0, vocab = 0, sliding_window = 0;
  int max_position = 4096;  // max_position_embeddings: the context window
  float rms_eps = 1e-5f, swiglu_limit = 7.0f, swiglu_alpha = 1.702f;
  bool tie_embeddings = false;
  std::vector<bool> sliding;  // per layer: banded (sliding_window) or full attention
  std::vector<float> inv_freq;  // head_dim / 2 RoPE inverse frequencies (YaRN applied)
  float rope_concentration = 1.0f;  // YaRN attention factor, multiplies cos and sin
  std::vector<int> eos_tokens;
};

// Whether DIR/config.json names model_type "gpt_oss" (false when unreadable).
bool IsGptOssModelDir(const std::string& dir);

// Parses and validates config.json text; errors name the field.
Result<GptOssConfig> ParseGptOssConfig(const std::string& text);

class GptOssModel {
 public:
  // One sequence's attention cache: per layer, [positions held, kv_heads,
  // head_dim] keys and values. A banded layer holds at most about twice
  // sliding_window positions: older ones, which no later query sees, are
  // dropped (dropped[layer] counts them), so a long sequence's banded layers
  // cost a bounded amount of memory.
  struct State {
    std::vector<std::vector<float>> k, v;
    std::vector<int> dropped;
    int length = 0;
  };

  static Result<std::unique_ptr<GptOssModel>> Load(const std::string& dir,
                                                   kernels::Isa isa = kernels::BestIsa());
  ~GptOssModel();

  const GptOssConfig& config() const { return cfg_; }
  // Bytes of weights held (dense as stored, experts packed), and those one
  // decoded token reads: every dense matrix, experts_per_token experts per
  // layer, the output head (the memory roofline's numerator).
  size_t weight_bytes() const;
  size_t active_weight_bytes_per_token() const;
  State NewState() const;
  // Appends `tokens` to the state and writes vocab floats of logits per token
  // (all_logits) or for the last token only.
  Status Forward(State& state, std::span<const int> tokens, bool all_logits, std::vector<float>* logits) const;
  // One decode step of several sequences together: tokens[i] is appended to
  // *states[i] (distinct states), and vocab floats of logits are written per
  // sequence, in order. The projections and experts run once over all rows
  // (each weight read once for the batch); attention runs per sequence. The
  // logits agree with Forward's on each state alone within the kernels'
  // rounding (matrix products over more rows may sum in another order).
  Status ForwardBatch(std::span<State* const> states, std::span<const int> tokens, std::vector<float>* logits) const;

 private:
  struct Weights;
  struct Run {  // consecutive rows of one sequence
    State* state;
    size_t first_row, rows;
  };
  Status ForwardRuns(std::span<const Run> runs, std::span<const int> tokens, bool all_logits,
                     std::vector<float>* logits) const;
  GptOssModel() = default;
  GptOssConfig cfg_;
  const kernels::KernelSet* kernels_ = nullptr;
  std::unique_ptr<Weights> w_;
};

}  // namespace moeserve::engine
