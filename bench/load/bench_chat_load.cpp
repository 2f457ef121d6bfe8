// bench_chat_load: a ramp of concurrent chat completions against one or more
// endpoints (round robin), e.g. to watch an autoscaled MoEDeployment grow:
//   bench_chat_load --endpoint http://ultra.team-a.svc:8000 --key sk-... \
//       [--model NAME] [--start 1] [--peak 32] [--ramp 60] [--hold 120] [--max-tokens 64]
// Prints requests sent, failed, and latency p50/p90/p99 as JSON.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat_load.hpp"

int main(int argc, char** argv) {
  moeserve::bench::ChatLoadOptions o;
  std::vector<std::string> endpoints;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--endpoint") endpoints.push_back(v);
    else if (a == "--key") o.api_key = v;
    else if (a == "--model") o.model = v;
    else if (a == "--start") o.start_concurrency = std::stoi(v);
    else if (a == "--peak") o.peak_concurrency = std::stoi(v);
    else if (a == "--ramp") o.ramp_seconds = std::stod(v);
    else if (a == "--hold") o.hold_seconds = std::stod(v);
    else if (a == "--max-tokens") o.max_tokens = std::stoi(v);
    else if (a == "--prompt") o.prompt = v;
    else {
      std::cerr << "bench_chat_load: unknown flag " << a << "\n";
      return 2;
    }
  }
  if (endpoints.empty()) {
    std::cerr << "usage: bench_chat_load --endpoint URL [--endpoint URL...] --key KEY [--model NAME] [--start N]\n"
                 "                       [--peak N] [--ramp S] [--hold S] [--max-tokens N] [--prompt TEXT]\n";
    return 2;
  }
  std::atomic<size_t> next{0};
  o.pick_endpoint = [&] { return endpoints[next++ % endpoints.size()]; };
  auto r = moeserve::bench::RunChatLoad(o);
  auto q = [&](double p) {
    if (r.latencies_seconds.empty()) return 0.0;
    std::sort(r.latencies_seconds.begin(), r.latencies_seconds.end());
    return r.latencies_seconds[std::min(r.latencies_seconds.size() - 1,
                                        static_cast<size_t>(p * static_cast<double>(r.latencies_seconds.size())))];
  };
  nlohmann::json out = {{"sent", r.sent},          {"succeeded", r.succeeded}, {"failed", r.failed},
                        {"wall_seconds", r.wall_seconds},
                        {"requests_per_second", r.wall_seconds > 0 ? static_cast<double>(r.sent) / r.wall_seconds : 0},
                        {"latency_p50_s", q(0.5)}, {"latency_p90_s", q(0.9)}, {"latency_p99_s", q(0.99)},
                        {"failures", r.failures}};
  std::cout << out.dump(2) << "\n";
  return r.failed == 0 ? 0 : 1;
}
