#include "moeserve/storage/pull_status.hpp"

#include <cstdio>

#include <nlohmann/json.hpp>

namespace moeserve::storage {

std::string_view PullStateName(PullState state) {
  switch (state) {
    case PullState::kIdle: return "idle";
    case PullState::kWaitingForLock: return "waiting_for_lock";
    case PullState::kFetchingManifest: return "fetching_manifest";
    case PullState::kDownloading: return "downloading";
    case PullState::kVerifying: return "verifying";
    case PullState::kReady: return "ready";
    case PullState::kFailed: return "failed";
  }
  return "unknown";
}

std::string FormatBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return buf;
}

std::string PullProgress::ToJson() const {
  nlohmann::json j = {{"state", PullStateName(state)}, {"uri", uri},           {"revision", revision},
                      {"bytes_total", bytes_total},   {"bytes_done", bytes_done}, {"bytes_fetched", bytes_fetched},
                      {"rate_bytes_per_s", rate_bytes_per_s}};
  if (eta_s >= 0) j["eta_s"] = eta_s;
  if (!message.empty()) j["message"] = message;
  return j.dump();
}

std::string PullProgress::ToLogLine() const {
  std::string s = "pull " + std::string(PullStateName(state)) + ": " + FormatBytes(static_cast<double>(bytes_done)) +
                  " / " + FormatBytes(static_cast<double>(bytes_total));
  if (bytes_total > 0) s += " (" + std::to_string(bytes_done * 100 / bytes_total) + "%)";
  s += ", " + FormatBytes(rate_bytes_per_s) + "/s";
  if (eta_s >= 0) s += ", ETA " + std::to_string(static_cast<long>(eta_s + 0.5)) + "s";
  return s;
}

void PullStatus::Begin(const std::string& uri, const std::string& revision) {
  std::lock_guard lock(mu_);
  base_ = PullProgress{};
  base_.uri = uri;
  base_.revision = revision;
  done_ = 0;
  fetched_ = 0;
  last_sample_ = std::chrono::steady_clock::now();
  last_fetched_ = 0;
  rate_ = 0;
}

void PullStatus::SetState(PullState state) {
  std::lock_guard lock(mu_);
  base_.state = state;
}

void PullStatus::SetTotal(uint64_t bytes_total, uint64_t bytes_done) {
  std::lock_guard lock(mu_);
  base_.bytes_total = bytes_total;
  done_ = bytes_done;
}

void PullStatus::Fail(const std::string& message) {
  std::lock_guard lock(mu_);
  base_.state = PullState::kFailed;
  base_.message = message;
}

PullProgress PullStatus::Snapshot() const {
  std::lock_guard lock(mu_);
  PullProgress p = base_;
  p.bytes_done = done_.load();
  p.bytes_fetched = fetched_.load();
  auto now = std::chrono::steady_clock::now();
  double dt = std::chrono::duration<double>(now - last_sample_).count();
  if (dt >= 0.25) {
    double instant = static_cast<double>(p.bytes_fetched - last_fetched_) / dt;
    rate_ = rate_ == 0 ? instant : 0.7 * rate_ + 0.3 * instant;  // smooth bursts between samples
    last_sample_ = now;
    last_fetched_ = p.bytes_fetched;
  }
  p.rate_bytes_per_s = rate_;
  if (rate_ > 0 && p.bytes_total >= p.bytes_done) p.eta_s = static_cast<double>(p.bytes_total - p.bytes_done) / rate_;
  return p;
}

}  // namespace moeserve::storage
