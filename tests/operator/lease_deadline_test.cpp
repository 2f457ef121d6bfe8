// Leading ends at the renew deadline. Attacked as a slow or partitioned API
// server would: before, a renewal call could block for the client's whole
// timeout (30 s), longer than the lease, and the replica went on writing
// while another could already have taken over. Now every call of a renewal
// gets only the time left before the deadline, and the client's write fence
// closes when it passes: no write from the deposed leader reaches the
// server after it.
#include <gtest/gtest.h>

#include "moeserve/operator/moedeployment.hpp"
#include "operator_test_util.hpp"

namespace moeserve::op::testing {
namespace {

using Clock = std::chrono::steady_clock;

TEST(LeaseDeadline, ADeposedLeaderStopsWritingAtTheDeadline) {
  FakeCluster cluster;
  auto& server = cluster.server;
  auto client = cluster.Client("moe-operator/a");
  OperatorOptions options;
  options.leader_elect = true;
  options.election.identity = "a";
  options.election.lease_namespace = "default";
  options.election.lease_duration = 3000ms;
  options.election.renew_deadline = 2000ms;
  options.election.retry_period = 200ms;
  RunningOperator running(*client, options);
  ASSERT_TRUE(WaitFor([&] { return running.op.Leading(); }));
  ASSERT_TRUE(server.Create("moedeployments.moeserve.io", MoEDeploymentManifest("team-a", "m0", 1, 1)));
  ASSERT_TRUE(WaitFor([&] { return server.Get("statefulsets.apps", "team-a", "m0-r0").has_value(); }));
  EXPECT_LE(client->RequestTimeout(), options.election.renew_deadline);

  // The API server turns slow for Leases; tenants keep the workers busy.
  fakes::FakeFaults faults;
  faults.stall_resource = "leases";
  faults.stall_ms = 8000;
  server.SetFaults(faults);
  const auto stalled_at = Clock::now();
  std::atomic<bool> stop_creating{false};
  std::thread tenants([&] {
    for (int i = 1; i < 60 && !stop_creating; ++i) {
      (void)server.Create("moedeployments.moeserve.io", MoEDeploymentManifest("team-a", "m" + std::to_string(i), 1, 1));
      std::this_thread::sleep_for(80ms);
    }
  });
  // The last renewal was sent before the stall: leading ends within the renew deadline of it.
  const bool stepped_down = WaitFor([&] { return !running.op.Leading(); }, 4000ms);
  const auto down_at = Clock::now();
  stop_creating = true;
  tenants.join();
  ASSERT_TRUE(stepped_down) << "still leading " << std::chrono::duration_cast<std::chrono::milliseconds>(down_at - stalled_at).count()
                            << " ms into a stall";
  EXPECT_LE(down_at - stalled_at, options.election.renew_deadline + 500ms);

  // No write of this replica (its Lease aside) was handled after the deadline.
  const auto deadline = stalled_at + options.election.renew_deadline;
  int writes_while_leading = 0;
  for (const auto& w : server.Writes()) {
    if (w.user_agent != "moe-operator/a" || w.path.find("/leases") != std::string::npos) continue;
    if (w.handled > stalled_at && w.handled <= deadline) writes_while_leading++;
    EXPECT_LE(w.handled, deadline + 150ms)
        << w.method << " " << w.path << " handled "
        << std::chrono::duration_cast<std::chrono::milliseconds>(w.handled - deadline).count() << " ms after the deadline";
  }
  EXPECT_GT(writes_while_leading, 0) << "the workers had work while the lease was still good";
  running.Stop();
  EXPECT_FALSE(running.status) << "a replica that lost its lease exits non-zero";
}

TEST(LeaseDeadline, CallsEndAtTheirDeadlineAndAClosedFenceSendsNothing) {
  FakeCluster cluster;
  auto& server = cluster.server;
  auto client = cluster.Client();
  fakes::FakeFaults faults;
  faults.stall_resource = "leases";
  faults.stall_ms = 3000;
  server.SetFaults(faults);
  const auto start = Clock::now();
  auto got = client->Get(resources::kLease, "default", "any", 200ms);
  ASSERT_FALSE(got);
  EXPECT_EQ(got.error().code(), ErrorCode::kTimeout) << got.error().ToString();
  EXPECT_LT(Clock::now() - start, 1000ms);

  auto fence = std::make_shared<WriteFence>();
  client->SetWriteFence(fence, resources::kLease.Path("default"));
  const size_t writes = server.Writes().size();
  json cm = {{"apiVersion", "v1"}, {"kind", "ConfigMap"}, {"metadata", {{"name", "c"}, {"namespace", "team-a"}}}};
  auto refused = client->Create(resources::kConfigMap, "team-a", cm);
  ASSERT_FALSE(refused);
  EXPECT_EQ(server.Writes().size(), writes) << "a write left a replica that is not leading";
  fence->ExtendTo(Clock::now() + 5s);
  EXPECT_TRUE(client->Create(resources::kConfigMap, "team-a", cm));
  fence->Close();
  EXPECT_FALSE(client->Delete(resources::kConfigMap, "team-a", "c"));
  EXPECT_TRUE(server.Get("configmaps", "team-a", "c"));
}

}  // namespace
}  // namespace moeserve::op::testing
