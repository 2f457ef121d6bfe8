// Expert parallelism for DeepSeek-V3.2 as published (a tiny random
// checkpoint in the exact Hugging Face layout: FP8 block-scaled shards with
// their index, sigmoid group-limited routing, shared experts, DSA): the
// shared expert-parallel test (expert_parallel_family.hpp).
#include "expert_parallel_family.hpp"

namespace moeserve::daemon::testing {
namespace {

TEST(ExpertParallelDeepseek, MoeRunAndTheDaemonMatchOneProcessWithHalfTheExperts) {
  // Ids below 1024: valid whether the checkpoint got the npm tokenizer's vocabulary or the writer's 1024.
  ExpectGroupsMatchOneProcess({"ds32", "deepseek-expert-parallel-secret!", "0,17,400,99,1000,7,7,23,500,61,8,900",
                               "deepseek_v32.py write --layers 3 --index-topk 8 --seed 4", "ds32"});
}

}  // namespace
}  // namespace moeserve::daemon::testing
