// Expert parallelism for Qwen3-Next as published (a tiny random checkpoint
// in the Hugging Face layout: fused DeltaNet projections, gated GQA with
// partial rotary, softmax routing over 8 experts with a sigmoid-gated
// shared expert, two shards with their index), mapped onto the shared layer
// graph by its family: the shared expert-parallel test
// (expert_parallel_family.hpp); the prompt is a ChatML turn's ids.
// (engine.expert_parallel compares the group's logits with one process's.)
#include "expert_parallel_family.hpp"

namespace moeserve::daemon::testing {
namespace {

TEST(ExpertParallelQwen3, MoeRunAndTheDaemonMatchOneProcessWithHalfTheExperts) {
  ExpectGroupsMatchOneProcess({"qwen3", "qwen3-next-expert-parallel-secret",
                               "151644,872,198,3838,374,220,17,10,17,30,151645,198,151644,77091,198",
                               "qwen3_next.py write --layers 4 --seed 6", "q3n"});
}

}  // namespace
}  // namespace moeserve::daemon::testing
