// Gloo groups of separate processes on loopback, formed through the
// authenticated rendezvous store: the shared exchange checks at world sizes
// 1, 2 and 4, and a peer that dies mid-sequence failing the survivor's next
// collective within the timeout instead of hanging it (or, through SIGPIPE,
// killing it).
#include <gtest/gtest.h>

#include <csignal>
#include <cstdio>

#include "../support/fork_ranks.hpp"
#include "comm_checks.hpp"
#include "moeserve/kernels/comm/exchange.hpp"
#include "moeserve/kernels/comm/gloo_group.hpp"
#include "moeserve/kernels/comm/rendezvous.hpp"

namespace moeserve::kernels::comm {
namespace {

using test_support::ForkRanks;
const std::string kSecret = "test-group-secret-0123456789";

GlooGroupOptions Options(int rank, int size, int port) {
  GlooGroupOptions o;
  o.rank = rank;
  o.size = size;
  o.master_port = port;
  o.secret = kSecret;
  o.timeout = std::chrono::seconds(10);
  return o;
}

class GlooProcesses : public ::testing::TestWithParam<int> {};

TEST_P(GlooProcesses, ExchangesDeliverEveryRowToItsPlace) {
  const int W = GetParam();
  auto server = RendezvousServer::Start("127.0.0.1", 0, kSecret, W);
  ASSERT_TRUE(server) << server.error().message;
  const int port = (*server)->port();
  auto codes = ForkRanks(W, [&](int r) {
    auto comm = JoinGlooGroup(Options(r, W, port));
    if (!comm) {
      std::fprintf(stderr, "rank %d: %s\n", r, comm.error().message.c_str());
      return 2;
    }
    if ((*comm)->size() != W || (*comm)->rank() != r || std::string((*comm)->backend()) != "gloo") return 4;
    std::string err = testing::RunExchangeChecks(**comm);
    if (!err.empty()) std::fprintf(stderr, "rank %d: %s\n", r, err.c_str());
    return err.empty() ? 0 : 1;
  });
  for (int r = 0; r < W; ++r) EXPECT_EQ(codes[static_cast<size_t>(r)], 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, GlooProcesses, ::testing::Values(1, 2, 4));

// A peer that announces more rows than the batch allows (here 2^40, which
// would size rank 0's receive buffer at terabytes) is refused by the counts
// exchange and the all-gather before anything is allocated for them.
TEST(GlooGroup, RowCountsPastWhatTheBatchAllowsAreRefused) {
  auto server = RendezvousServer::Start("127.0.0.1", 0, kSecret, 2);
  ASSERT_TRUE(server) << server.error().message;
  const int port = (*server)->port();
  constexpr int64_t kHuge = int64_t{1} << 40;
  auto codes = ForkRanks(2, [&](int r) {
    auto comm = JoinGlooGroup(Options(r, 2, port));
    if (!comm) return 2;
    if (r == 1) {  // hostile: announces rows it never sends, twice
      const std::vector<int64_t> plan_counts = {kHuge, 0}, gather_counts = {kHuge, kHuge};
      if (!(*comm)->ExchangeCounts(plan_counts)) return 3;
      if (!(*comm)->ExchangeCounts(gather_counts)) return 3;
      return 0;
    }
    const std::vector<int> dest = {0, 1, 1};
    auto plan = PlanRows(**comm, dest, 8);
    if (plan) {
      std::fprintf(stderr, "rank 0: the plan accepted %lld rows from rank 1\n",
                   static_cast<long long>(plan->recv_rows[1]));
      return 1;
    }
    if (plan.error().message.find("rank 1 announced 1099511627776 rows, more than the 8") == std::string::npos) {
      std::fprintf(stderr, "rank 0: %s\n", plan.error().message.c_str());
      return 1;
    }
    const std::vector<float> rows(4 * 3, 1.0f);
    auto all = AllGatherRows(**comm, rows, 4, 3);
    if (all || all.error().message.find("rank 1 announced 1099511627776 rows") == std::string::npos) {
      std::fprintf(stderr, "rank 0: all-gather %s\n", all ? "accepted" : all.error().message.c_str());
      return 1;
    }
    return 0;
  });
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
}

TEST(GlooGroup, DeadPeerFailsTheNextCollectiveAndTheGroupReforms) {
  auto server = RendezvousServer::Start("127.0.0.1", 0, kSecret, 2);
  ASSERT_TRUE(server) << server.error().message;
  const int port = (*server)->port();
  auto codes = ForkRanks(2, [&](int r) {
    auto o = Options(r, 2, port);
    o.timeout = std::chrono::seconds(5);
    auto comm = JoinGlooGroup(o);
    if (!comm) return 2;
    if (!(*comm)->Barrier()) return 5;
    if (r == 1) ::_exit(0);  // dies without a word
    std::vector<int64_t> counts = {1, 1};
    auto got = (*comm)->ExchangeCounts(counts);
    if (got) return 6;  // must not succeed with a dead peer
    // Once broken, it stays broken, with the first error.
    auto again = (*comm)->Barrier();
    if (again || again.error().message != got.error().message) return 7;
    std::fprintf(stderr, "survivor saw: %s\n", got.error().message.c_str());
    return got.error().message.find("re-form") != std::string::npos ? 0 : 8;
  });
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
  // The next epoch forms again with both ranks.
  (*server)->Reset();
  codes = ForkRanks(2, [&](int r) {
    auto comm = JoinGlooGroup(Options(r, 2, port));
    if (!comm) return 2;
    return testing::RunExchangeChecks(**comm).empty() ? 0 : 1;
  });
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
}

TEST(GlooGroup, WrongSecretCannotJoin) {
  auto server = RendezvousServer::Start("127.0.0.1", 0, kSecret, 1);
  ASSERT_TRUE(server) << server.error().message;
  auto o = Options(0, 1, (*server)->port());
  o.secret = "some-other-secret-of-enough-length";
  auto comm = JoinGlooGroup(o);
  ASSERT_FALSE(comm);
  EXPECT_NE(comm.error().message.find("secret"), std::string::npos) << comm.error().message;
}

void CountPipes(int) {}

TEST(GlooGroup, JoiningIgnoresSigpipeUnlessTheProgramHandlesIt) {
  // Gloo writes to its peers with plain writev: under SIGPIPE's default
  // action a write to a peer that died kills the survivor (exit 141)
  // instead of failing the collective. Joining ignores SIGPIPE; a handler
  // the program set stays.
  for (const bool own_handler : {false, true}) {
    SCOPED_TRACE(own_handler ? "program's own handler" : "default action");
    auto server = RendezvousServer::Start("127.0.0.1", 0, kSecret, 1);
    ASSERT_TRUE(server) << server.error().message;
    const int port = (*server)->port();
    auto codes = ForkRanks(1, [&](int r) {
      std::signal(SIGPIPE, own_handler ? CountPipes : SIG_DFL);
      auto comm = JoinGlooGroup(Options(r, 1, port));
      if (!comm) return 2;
      struct sigaction now {};
      if (sigaction(SIGPIPE, nullptr, &now) != 0) return 3;
      if (own_handler) return now.sa_handler == CountPipes ? 0 : 4;
      return now.sa_handler == SIG_IGN ? 0 : 5;
    });
    EXPECT_EQ(codes[0], 0);
  }
}

}  // namespace
}  // namespace moeserve::kernels::comm
