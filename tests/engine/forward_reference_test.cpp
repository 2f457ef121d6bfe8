// The CPU engine against the PyTorch reference (tools/reference), model.md
// section 10: logits at every position of a 300-token prefill and of 64
// greedy decode steps within 1e-3 * max|ref|, greedy tokens identical where
// the reference's top-2 margin exceeds that bound, DSA selected sets
// identical where the k-th/(k+1)-th indexer margin exceeds 1e-5 * max|I|.
#include <algorithm>
#include <cmath>

#include "moeserve/engine/model.hpp"
#include "test_models.hpp"

namespace moeserve::engine {
namespace {

using namespace testing_util;

struct Comparison {
  double worst_ratio = 0;  // max over positions of max|diff| / max|ref|
  int greedy_checked = 0, greedy_mismatch = 0;
  int dsa_checked = 0, dsa_mismatch = 0;
};

// `given`: the reference's run of this model, when a caller compares several
// kernel sets with one (each run takes seconds).
void CompareWithReference(const std::string& model_dir, KernelChoice kernels, Comparison* cmp,
                          const ReferenceRun* given = nullptr, int decode_activation_bits = 21) {
  auto dir = OpenModelDir(model_dir);
  ASSERT_TRUE(dir) << dir.error().ToString();
  const std::vector<int> prompt = TestPrompt(300);
  ReferenceRun own;
  if (!given) {
    ASSERT_TRUE(RunReference(model_dir, prompt, 64, &own));
  }
  const ReferenceRun& ref = given ? *given : own;
  ASSERT_EQ(ref.positions, 364);

  ModelOptions mo;
  mo.kernels = kernels;
  mo.decode_activation_bits = decode_activation_bits;
  auto model = Model::Load(*dir, mo);
  ASSERT_TRUE(model) << model.error().ToString();
  const int V = dir->config.vocab_size;
  KvPool pool(64, 16, (*model)->cache_floats_per_token());
  SequenceCache cache = (*model)->NewSequence();
  ForwardTrace trace;

  // Prefill all 300 prompt positions, then teacher-force the reference's tokens.
  std::vector<float> logits, all;
  ASSERT_TRUE(EnsureBlocks(pool, cache, 300));
  ForwardSegment seg{&cache, prompt, true};
  ASSERT_TRUE((*model)->Forward(pool, std::span(&seg, 1), &logits, &trace));
  all = logits;
  for (int step = 0; step < 64; ++step) {
    std::vector<int> tok = {ref.tokens[static_cast<size_t>(300 + step)]};
    ASSERT_TRUE(EnsureBlocks(pool, cache, cache.length + 1));
    ForwardSegment one{&cache, tok, false};
    ASSERT_TRUE((*model)->Forward(pool, std::span(&one, 1), &logits, &trace));
    all.insert(all.end(), logits.begin(), logits.end());
  }
  ASSERT_EQ(all.size(), static_cast<size_t>(364) * V);

  for (int p = 0; p < 364; ++p) {
    const float* a = &all[static_cast<size_t>(p) * V];
    const float* b = &ref.logits[static_cast<size_t>(p) * V];
    double max_ref = 0, max_diff = 0;
    for (int v = 0; v < 268; ++v) {
      max_ref = std::max(max_ref, std::fabs(static_cast<double>(b[v])));
      max_diff = std::max(max_diff, std::fabs(static_cast<double>(a[v]) - b[v]));
    }
    cmp->worst_ratio = std::max(cmp->worst_ratio, max_diff / max_ref);
    EXPECT_LE(max_diff, 1e-3 * max_ref) << "position " << p;
    // Greedy: argmax over non-padding ids, ties to the lower id.
    if (p >= 299 && ref.top2_margin[static_cast<size_t>(p)] > 1e-3 * max_ref) {
      int best = static_cast<int>(std::max_element(a, a + 268) - a);
      int want = p + 1 < 364 ? ref.tokens[static_cast<size_t>(p + 1)] : -1;
      if (want >= 0) {
        ++cmp->greedy_checked;
        if (best != want) ++cmp->greedy_mismatch;
        EXPECT_EQ(best, want) << "greedy token at position " << p;
      }
    }
  }

  // DSA selected sets.
  for (auto& [layer_key, per_pos] : ref.meta["dsa_selected"].items()) {
    int layer = std::stoi(layer_key);
    const auto& mine = trace.dsa_selected[layer];
    ASSERT_EQ(mine.size(), per_pos.size()) << "layer " << layer;
    const auto& margin = ref.meta["dsa_margin"][layer_key];
    const auto& max_i = ref.meta["dsa_max_abs_score"][layer_key];
    for (size_t t = 0; t < per_pos.size(); ++t) {
      bool decisive = margin[t].is_null() || margin[t].get<double>() > 1e-5 * max_i[t].get<double>();
      if (!decisive) continue;
      ++cmp->dsa_checked;
      auto want = per_pos[t].get<std::vector<int>>();
      if (mine[t] != want) ++cmp->dsa_mismatch;
      EXPECT_EQ(mine[t], want) << "layer " << layer << " position " << t;
    }
  }
  // The comparisons above are conditional (decisive margins only): require
  // that they really ran, so that a reference without margins cannot pass.
  // Here 64 of the 64 generated positions are decisive.
  EXPECT_GE(cmp->greedy_checked, 48) << "too few greedy positions were compared";
  EXPECT_GE(cmp->dsa_checked, 300) << "too few DSA selections were compared";
}

TEST(ForwardReference, TinyPresetMatchesReference) {
  Comparison cmp;
  CompareWithReference(TinyModel(1, 2048), KernelChoice::kReference, &cmp);
  std::printf("tiny (index_topk 2048): worst max|diff|/max|ref| = %.3g; greedy checked %d, mismatches %d; dsa sets checked %d\n",
              cmp.worst_ratio, cmp.greedy_checked, cmp.greedy_mismatch, cmp.dsa_checked);
}

TEST(ForwardReference, SparseIndexTopk16MatchesReference) {
  Comparison cmp;
  CompareWithReference(TinyModel(1, 16), KernelChoice::kReference, &cmp);
  std::printf("tiny (index_topk 16): worst max|diff|/max|ref| = %.3g; greedy checked %d, mismatches %d; dsa sets checked %d, mismatches %d\n",
              cmp.worst_ratio, cmp.greedy_checked, cmp.greedy_mismatch, cmp.dsa_checked, cmp.dsa_mismatch);
  EXPECT_GT(cmp.dsa_checked, 300);  // sparse selection really was exercised and compared
}

// The same comparisons through the fast (dispatched, threaded) CPU kernels,
// under the same 1e-3 * max|ref| bound.
TEST(ForwardReference, TinyPresetMatchesReferenceFastKernels) {
  Comparison cmp;
  CompareWithReference(TinyModel(1, 2048), KernelChoice::kFast, &cmp);
  std::printf("fast kernels, tiny (index_topk 2048): worst max|diff|/max|ref| = %.3g; greedy checked %d, mismatches %d\n",
              cmp.worst_ratio, cmp.greedy_checked, cmp.greedy_mismatch);
}

TEST(ForwardReference, SparseIndexTopk16MatchesReferenceFastKernels) {
  Comparison cmp;
  CompareWithReference(TinyModel(1, 16), KernelChoice::kFast, &cmp);
  std::printf("fast kernels, tiny (index_topk 16): worst max|diff|/max|ref| = %.3g; greedy checked %d, mismatches %d; dsa sets checked %d, mismatches %d\n",
              cmp.worst_ratio, cmp.greedy_checked, cmp.greedy_mismatch, cmp.dsa_checked, cmp.dsa_mismatch);
  EXPECT_GT(cmp.dsa_checked, 300);
}

// BF16 routed experts (model.md 1.2), through the reference and the fast
// kernels, under the same bounds; one reference run serves both.
TEST(ForwardReference, Bf16ExpertsMatchReference) {
  const std::string& model = TinyModel(1, 16, ExpertFormat::kBf16);
  ReferenceRun ref;
  ASSERT_TRUE(RunReference(model, TestPrompt(300), 64, &ref));
  for (KernelChoice k : {KernelChoice::kReference, KernelChoice::kFast}) {
    Comparison cmp;
    CompareWithReference(model, k, &cmp, &ref);
    std::printf("BF16 experts, %s kernels, tiny (index_topk 16): worst max|diff|/max|ref| = %.3g; greedy checked %d, mismatches %d; dsa sets checked %d, mismatches %d\n",
                k == KernelChoice::kReference ? "reference" : "fast", cmp.worst_ratio, cmp.greedy_checked,
                cmp.greedy_mismatch, cmp.dsa_checked, cmp.dsa_mismatch);
    EXPECT_GT(cmp.dsa_checked, 300);
  }
}

// The fast kernels with 16-bit activations in the MXFP4 products
// (ModelOptions::decode_activation_bits; two int8 parts, 4 vpdpbusd per line
// of codes instead of 6, in decode and, as integer products over tiles of
// rows, in prefill): the same bounds as the default (measured 1.3e-4 of
// max|ref|; 8 bits measured 0.72, with 11 of 64 greedy tokens and 69 DSA sets
// differing, so 8 bits is held to no bound here).
TEST(ForwardReference, Decode16BitActivationsMatchReference) {
  Comparison cmp;
  CompareWithReference(TinyModel(1, 16), KernelChoice::kFast, &cmp, nullptr, 16);
  std::printf("decode activations 16 bits, tiny (index_topk 16): worst max|diff|/max|ref| = %.3g; greedy checked %d, mismatches %d; dsa sets checked %d, mismatches %d\n",
              cmp.worst_ratio, cmp.greedy_checked, cmp.greedy_mismatch, cmp.dsa_checked, cmp.dsa_mismatch);
}

}  // namespace
}  // namespace moeserve::engine
