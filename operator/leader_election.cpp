#include "moeserve/operator/leader_election.hpp"

#include <cmath>
#include <random>
#include <thread>

#include "moeserve/common/log.hpp"
#include "moeserve/common/rfc3339.hpp"

namespace moeserve::op {

using Clock = std::chrono::steady_clock;

LeaderElector::LeaderElector(KubeClient& client, LeaderElectionOptions options)
    : client_(client), options_(std::move(options)) {}

bool LeaderElector::TryAcquireOrRenew(std::chrono::milliseconds budget) {
  const auto now = Clock::now();
  const auto until = now + budget;
  auto left = [&] {
    return std::max(std::chrono::milliseconds(1),
                    std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()));
  };
  const int duration_s =
      std::max(1, static_cast<int>(std::ceil(std::chrono::duration<double>(options_.lease_duration).count())));
  json spec = {{"holderIdentity", options_.identity}, {"leaseDurationSeconds", duration_s},
               {"renewTime", NowMicroTime()}};
  auto existing = client_.Get(resources::kLease, options_.lease_namespace, options_.lease_name, left());
  if (!existing) {
    if (existing.error().code() != ErrorCode::kNotFound) return false;
    if (Clock::now() >= until) return false;
    spec["acquireTime"] = spec["renewTime"];
    spec["leaseTransitions"] = 0;
    json lease = {{"apiVersion", "coordination.k8s.io/v1"},
                  {"kind", "Lease"},
                  {"metadata", {{"name", options_.lease_name}, {"namespace", options_.lease_namespace}}},
                  {"spec", spec}};
    auto created = client_.Create(resources::kLease, options_.lease_namespace, lease);
    if (!created) return false;
    observed_holder_ = options_.identity;
    observed_renew_ = spec["renewTime"];
    observed_at_ = now;
    return true;
  }
  json lease = *existing;
  const json old = lease.value("spec", json::object());
  const std::string holder = old.value("holderIdentity", "");
  const std::string renew = old.value("renewTime", "");
  if (holder != observed_holder_ || renew != observed_renew_) {
    observed_holder_ = holder;
    observed_renew_ = renew;
    observed_at_ = now;
  }
  // The holder's own duration counts, not ours: it promised to renew within it.
  const auto held_for = std::chrono::seconds(old.value("leaseDurationSeconds", duration_s));
  const bool held_by_other = !holder.empty() && holder != options_.identity;
  if (held_by_other && observed_at_ + held_for > now)
    return false;
  if (holder == options_.identity) {
    spec["acquireTime"] = old.value("acquireTime", spec["renewTime"].get<std::string>());
    spec["leaseTransitions"] = old.value("leaseTransitions", 0);
  } else {
    spec["acquireTime"] = spec["renewTime"];
    spec["leaseTransitions"] = old.value("leaseTransitions", 0) + 1;
  }
  lease["spec"] = spec;
  if (Clock::now() >= until) return false;
  auto updated = client_.Update(resources::kLease, lease, left());
  if (!updated) return false;
  observed_holder_ = options_.identity;
  observed_renew_ = spec["renewTime"];
  observed_at_ = now;
  return true;
}

void LeaderElector::Release() {
  auto existing = client_.Get(resources::kLease, options_.lease_namespace, options_.lease_name, options_.renew_deadline);
  if (!existing || (*existing)["spec"].value("holderIdentity", "") != options_.identity) return;
  json lease = *existing;
  lease["spec"]["holderIdentity"] = "";
  lease["spec"]["leaseDurationSeconds"] = 1;
  lease["spec"]["renewTime"] = NowMicroTime();
  (void)client_.Update(resources::kLease, lease, options_.renew_deadline);
}

void LeaderElector::Run(const std::atomic<bool>& stop, const std::function<void()>& on_started_leading,
                        const std::function<void()>& on_stopped_leading) {
  std::mt19937 rng(std::random_device{}());
  auto jittered = [&](std::chrono::milliseconds d) {
    // client-go's JitterFactor 1.2: up to 120% extra, so candidates do not move in lockstep.
    return d + std::chrono::milliseconds(std::uniform_int_distribution<int64_t>(0, d.count() * 6 / 5)(rng));
  };
  auto sleep = [&](std::chrono::milliseconds d) {
    const auto until = Clock::now() + d;
    while (!stop && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  };
  // Acquire.
  auto attempt_start = Clock::now();
  auto acquire = [&] {
    attempt_start = Clock::now();
    return TryAcquireOrRenew(options_.renew_deadline);
  };
  while (!stop && !acquire()) sleep(jittered(options_.retry_period));
  if (stop) return;
  auto deadline = attempt_start + options_.renew_deadline;
  if (options_.fence) options_.fence->ExtendTo(deadline);
  leader_ = true;
  log::Info("leader election: " + options_.identity + " became leader of " + options_.lease_namespace + "/" +
            options_.lease_name);
  if (on_started_leading) on_started_leading();
  // Renew, never past the deadline.
  while (!stop) {
    const auto next = std::min(Clock::now() + options_.retry_period, deadline);
    while (!stop && Clock::now() < next) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (stop) break;
    const auto start = Clock::now();
    if (start >= deadline) {
      log::Warn("leader election: " + options_.identity + " could not renew within the deadline; stepping down");
      break;
    }
    if (TryAcquireOrRenew(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - start))) {
      deadline = start + options_.renew_deadline;
      if (options_.fence) options_.fence->ExtendTo(deadline);
    }
  }
  if (options_.fence) options_.fence->Close();
  leader_ = false;
  if (stop && options_.release_on_cancel) Release();
  if (on_stopped_leading) on_stopped_leading();
}

}  // namespace moeserve::op
