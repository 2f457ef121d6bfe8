#include "chat_load.hpp"

#include <curl/curl.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

namespace moeserve::bench {

namespace {

using Clock = std::chrono::steady_clock;

size_t Collect(char* data, size_t size, size_t n, void* out) {
  auto* body = static_cast<std::string*>(out);
  if (body->size() < (1 << 20)) body->append(data, size * n);
  return size * n;
}

// One request; "" when it succeeded, else what went wrong.
std::string Send(const ChatLoadOptions& o, const std::string& endpoint, int worker) {
  std::unique_ptr<CURL, decltype(&curl_easy_cleanup)> curl(curl_easy_init(), curl_easy_cleanup);
  if (!curl) return "curl_easy_init failed";
  const std::string body =
      nlohmann::json{{"model", o.model},
                     {"max_tokens", o.max_tokens},
                     {"messages", {{{"role", "user"}, {"content", o.prompt + " (" + std::to_string(worker) + ")"}}}}}
          .dump();
  curl_slist* headers = nullptr;
  headers = curl_slist_append(headers, ("Authorization: Bearer " + o.api_key).c_str());
  headers = curl_slist_append(headers, "Content-Type: application/json");
  headers = curl_slist_append(headers, "Expect:");
  std::unique_ptr<curl_slist, decltype(&curl_slist_free_all)> list(headers, curl_slist_free_all);
  std::string answer;
  const std::string url = endpoint + "/v1/chat/completions";
  CURL* c = curl.get();
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(c, CURLOPT_POSTFIELDS, body.c_str());
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, Collect);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &answer);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(o.request_timeout_seconds * 1000));
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_PROXY, "");
  const CURLcode rc = curl_easy_perform(c);
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  if (rc != CURLE_OK) return endpoint + ": " + curl_easy_strerror(rc);
  auto parsed = nlohmann::json::parse(answer, nullptr, false);
  if (status != 200 || parsed.is_discarded() || !parsed.contains("choices"))
    return endpoint + ": HTTP " + std::to_string(status) + ": " + answer.substr(0, 200);
  return "";
}

}  // namespace

ChatLoadResult RunChatLoad(const ChatLoadOptions& o, const std::atomic<bool>* stop) {
  ChatLoadResult result;
  std::mutex mu;
  const auto start = Clock::now();
  const double total = o.ramp_seconds + o.hold_seconds;
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  auto stopped = [&] { return (stop && stop->load()) || elapsed() >= total; };
  // Worker i starts when the ramp reaches i + 1 concurrent requests.
  auto starts_at = [&](int i) {
    if (i < o.start_concurrency || o.peak_concurrency <= o.start_concurrency) return 0.0;
    return o.ramp_seconds * (i + 1 - o.start_concurrency) / (o.peak_concurrency - o.start_concurrency);
  };
  std::vector<std::thread> workers;
  for (int i = 0; i < std::max(1, o.peak_concurrency); ++i) {
    workers.emplace_back([&, i] {
      while (!stopped() && elapsed() < starts_at(i)) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      while (!stopped()) {
        const std::string endpoint = o.pick_endpoint ? o.pick_endpoint() : "";
        if (endpoint.empty()) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
          continue;
        }
        const auto t0 = Clock::now();
        const std::string error = Send(o, endpoint, i);
        const double took = std::chrono::duration<double>(Clock::now() - t0).count();
        std::lock_guard lock(mu);
        result.sent++;
        if (error.empty()) {
          result.succeeded++;
          result.latencies_seconds.push_back(took);
        } else {
          result.failed++;
          if (result.failures.size() < 20) result.failures.push_back(error);
        }
      }
    });
  }
  for (auto& w : workers) w.join();
  result.wall_seconds = elapsed();
  return result;
}

}  // namespace moeserve::bench
