// A daemon's /metrics text into the few numbers the autoscaler needs, and
// the window over which TTFT is judged.
#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "moeserve/operator/autoscaling.hpp"

namespace moeserve::op {

namespace {

constexpr char kWaiting[] = "moe_requests_waiting";
constexpr char kRunning[] = "moe_requests_running";
constexpr char kKvUsage[] = "moe_kv_cache_usage_ratio";
constexpr char kTtftBucket[] = "moe_time_to_first_token_seconds_bucket";

// The value of label `name` in `{a="x",le="0.5"}`, or "" when absent.
std::string LabelValue(const std::string& labels, const std::string& name) {
  const std::string key = name + "=\"";
  size_t at = 0;
  while ((at = labels.find(key, at)) != std::string::npos) {
    if (at == 0 || labels[at - 1] == '{' || labels[at - 1] == ',') {
      const size_t start = at + key.size(), end = labels.find('"', start);
      return end == std::string::npos ? "" : labels.substr(start, end - start);
    }
    at += key.size();
  }
  return "";
}

bool ParseValue(const std::string& text, double& out) {
  if (text.empty()) return false;
  char* end = nullptr;
  out = std::strtod(text.c_str(), &end);
  return end == text.c_str() + text.size();
}

}  // namespace

Result<DaemonLoadReading> ParseDaemonLoad(const std::string& metrics_text) {
  DaemonLoadReading r;
  bool waiting = false, running = false, kv = false;
  std::istringstream in(metrics_text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t name_end = line.find_first_of("{ ");
    if (name_end == std::string::npos) continue;
    const std::string name = line.substr(0, name_end);
    if (name != kWaiting && name != kRunning && name != kKvUsage && name != kTtftBucket) continue;
    std::string labels;
    size_t value_at = name_end;
    if (line[name_end] == '{') {
      const size_t close = line.find('}', name_end);
      if (close == std::string::npos) return Fail(Error::InvalidArgument("/metrics: unterminated labels in " + name));
      labels = line.substr(name_end, close - name_end + 1);
      value_at = close + 1;
    }
    std::istringstream rest(line.substr(value_at));
    std::string value_text;
    rest >> value_text;
    double value = 0;
    if (!ParseValue(value_text, value) || std::isnan(value))
      return Fail(Error::InvalidArgument("/metrics: " + name + " has no numeric value"));
    if (name == kWaiting) {
      r.waiting = value, waiting = true;
    } else if (name == kRunning) {
      r.running = value, running = true;
    } else if (name == kKvUsage) {
      r.kv_cache_usage = value, kv = true;
    } else {
      double le = 0;
      if (!ParseValue(LabelValue(labels, "le"), le))
        return Fail(Error::InvalidArgument("/metrics: " + name + " has a bucket without a numeric le label"));
      r.ttft_buckets[le] = value;
    }
  }
  for (auto [seen, family] : {std::pair{waiting, kWaiting}, std::pair{running, kRunning}, std::pair{kv, kKvUsage}})
    if (!seen) return Fail(Error::InvalidArgument(std::string("/metrics: no ") + family + " (not a moe-daemon?)"));
  if (r.ttft_buckets.empty() || !std::isinf(r.ttft_buckets.rbegin()->first))
    return Fail(Error::InvalidArgument("/metrics: no moe_time_to_first_token_seconds histogram with a +Inf bucket"));
  return r;
}

double HistogramQuantile(const std::map<double, double>& cumulative, double q) {
  if (cumulative.empty()) return -1;
  const double total = cumulative.rbegin()->second;
  if (total <= 0) return -1;
  const double rank = q * total;
  double lower = 0, below = 0;
  for (const auto& [le, count] : cumulative) {
    if (count >= rank) {
      if (std::isinf(le)) return lower;  // past the last finite bound: its bound is all we know
      if (count == below) return le;
      return lower + (le - lower) * (rank - below) / (count - below);
    }
    lower = le, below = count;
  }
  return lower;
}

LoadSample LoadWindow::Add(double now, const std::map<std::string, DaemonLoadReading>& readings) {
  LoadSample s;
  s.time_seconds = now;
  std::map<double, double> delta;
  for (auto it = history_.begin(); it != history_.end();)
    it = readings.contains(it->first) ? std::next(it) : history_.erase(it);
  for (const auto& [group, r] : readings) {
    s.groups_read++;
    s.waiting_per_replica += r.waiting;
    s.kv_cache_usage += r.kv_cache_usage;
    auto& past = history_[group];
    // A count that went down means the daemon restarted: its past is gone.
    const double total = r.ttft_buckets.empty() ? 0 : r.ttft_buckets.rbegin()->second;
    if (!past.empty() && (past.back().second.empty() || past.back().second.rbegin()->second > total)) past.clear();
    while (past.size() > 1 && past[1].first <= now - window_seconds_) past.pop_front();
    // The baseline is the newest reading at or before the window's start
    // (else the oldest kept): the first reading of a group says nothing
    // about when its counts happened, so it only starts the window.
    if (!past.empty()) {
      const auto& base = past.front().second;
      for (const auto& [le, count] : r.ttft_buckets) {
        auto b = base.find(le);
        delta[le] += count - (b == base.end() ? 0 : b->second);
      }
    }
    past.emplace_back(now, r.ttft_buckets);
  }
  if (s.groups_read > 0) {
    s.waiting_per_replica /= s.groups_read;
    s.kv_cache_usage /= s.groups_read;
  }
  if (!delta.empty()) {
    s.ttft_observations = static_cast<uint64_t>(std::max(0.0, delta.rbegin()->second));
    s.ttft_p90_seconds = HistogramQuantile(delta, 0.9);
  }
  return s;
}

}  // namespace moeserve::op
