// The NCCL group at world size 1 (NCCL refuses two ranks on one GPU, and a
// test machine has at most one): the shared exchange checks through NCCL's
// send/recv with host staging, and a device-buffer all-to-all. Without NCCL
// or a device every test skips and the binary exits 77 (ctest: skipped).
#include <gtest/gtest.h>

#include "comm_checks.hpp"
#include "moeserve/kernels/comm/in_process.hpp"
#include "moeserve/kernels/comm/nccl_group.hpp"

namespace moeserve::kernels::comm {
namespace {

TEST(NcclGroup, WorldOfOneRunsTheExchangeChecks) {
  if (!NcclAvailable()) GTEST_SKIP() << "no NCCL in this build or no CUDA device";
  auto boot = MakeInProcessGroup(1);
  auto comm = JoinNcclGroup(*boot[0], 0);
  ASSERT_TRUE(comm) << comm.error().message;
  EXPECT_STREQ((*comm)->backend(), "nccl");
  EXPECT_EQ(testing::RunExchangeChecks(**comm), "");
}

TEST(NcclGroup, WithoutNcclJoiningSaysWhy) {
  if (NcclAvailable()) GTEST_SKIP() << "NCCL present: covered by the test above";
  auto boot = MakeInProcessGroup(1);
  auto comm = JoinNcclGroup(*boot[0], 0);
  ASSERT_FALSE(comm);
  EXPECT_FALSE(comm.error().message.empty());
}

}  // namespace
}  // namespace moeserve::kernels::comm

// Our own main: exit 77 when everything was skipped (SKIP_RETURN_CODE).
int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  int rc = RUN_ALL_TESTS();
  const auto& u = *::testing::UnitTest::GetInstance();
  if (rc == 0 && u.test_to_run_count() > 0 && u.skipped_test_count() == u.test_to_run_count()) return 77;
  return rc;
}
