// Row exchanges (exchange.hpp) over in-process communicators: the packing
// the Gloo and NCCL groups share, at world sizes 1, 2 and 4.
#include <gtest/gtest.h>

#include <thread>

#include "comm_checks.hpp"
#include "moeserve/kernels/comm/in_process.hpp"

namespace moeserve::kernels::comm {
namespace {

TEST(CommExchange, PlanSendGroupsRowsByDestinationStably) {
  std::vector<int> dest = {2, 0, 2, 1, 0};
  auto plan = PlanSend(dest, 3);
  ASSERT_TRUE(plan) << plan.error().message;
  EXPECT_EQ(plan->send_rows, (std::vector<int64_t>{2, 1, 2}));
  EXPECT_EQ(plan->order, (std::vector<int64_t>{1, 4, 3, 0, 2}));
  std::vector<float> rows = {0, 10, 20, 30, 40}, packed(5), back(5);
  PackRows(*plan, rows.data(), 1, packed.data());
  EXPECT_EQ(packed, (std::vector<float>{10, 40, 30, 0, 20}));
  UnpackRows(*plan, packed.data(), 1, back.data());
  EXPECT_EQ(back, rows);
}

TEST(CommExchange, DestinationOutsideTheWorldIsAnError) {
  std::vector<int> dest = {0, 3};
  auto plan = PlanSend(dest, 2);
  ASSERT_FALSE(plan);
  EXPECT_NE(plan.error().message.find("rank 3"), std::string::npos) << plan.error().message;
}

class InProcess : public ::testing::TestWithParam<int> {};

TEST_P(InProcess, ExchangesDeliverEveryRowToItsPlace) {
  const int W = GetParam();
  auto group = MakeInProcessGroup(W);
  std::vector<std::string> errors(static_cast<size_t>(W));
  std::vector<std::thread> threads;
  for (int r = 0; r < W; ++r)
    threads.emplace_back([&, r] { errors[static_cast<size_t>(r)] = testing::RunExchangeChecks(*group[static_cast<size_t>(r)]); });
  for (auto& t : threads) t.join();
  for (int r = 0; r < W; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
  // Every rank but the last sends rows away, so traffic was counted.
  if (W > 1) {
    EXPECT_GT(group[0]->bytes_sent(), 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, InProcess, ::testing::Values(1, 2, 4));

TEST(CommExchange, MismatchedSizesAreReportedNotCopied) {
  auto group = MakeInProcessGroup(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      std::vector<char> send(8), recv(8);
      // Rank 0 sends 4 bytes to rank 1, which expects 8.
      std::vector<int64_t> sb = {4, 4}, rb = {4, r == 1 ? int64_t{8} : int64_t{4}};
      if (r == 1) rb = {8, 4};
      auto st = group[static_cast<size_t>(r)]->AllToAllV(send.data(), sb, recv.data(), rb);
      errors[static_cast<size_t>(r)] = st ? "" : st.error().message;
    });
  for (auto& t : threads) t.join();
  EXPECT_NE(errors[1].find("expected"), std::string::npos) << errors[1];
}

}  // namespace
}  // namespace moeserve::kernels::comm
