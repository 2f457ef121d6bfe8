// Where a request's image work runs: fetching image URLs and decoding files
// (new ones, and a kept conversation's) happens on a small pool of image
// workers, never on the HTTP threads, and only for a request its tenant's
// admission (key, tiers, budgets, rate limits, concurrency) has let through
// (chat_service.hpp AdmitBeforeImages). A slow image host or a costly file
// then holds an image worker, not a thread /healthz and every other route
// need.
//
// Bounds:
//   - image_workers threads run jobs, in the order they came;
//   - image_tenant_max_in_flight: one tenant's jobs queued or running at once
//     (its share of the pool; one job is one request's images, fetched one
//     after the other, so it also caps the tenant's fetches in progress); more
//     are refused at once, 429 too_many_image_requests;
//   - image_max_queued: jobs waiting for a worker, every tenant's; more are
//     refused at once, 503 image_workers_busy.
//
// It also keeps the decoded pixels of images by tenant and content hash, up
// to image_decoded_cache_bytes (least recently used first out), so that a
// continued conversation (a session turn, previous_response_id) does not
// decode its kept images again; and it counts the decodes and fetches
// (moe_image_decodes_total, moe_image_fetches_total, moe_image_decoded_cache_hits_total,
// moe_image_jobs_refused_total{reason}).
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/registry.h>

#include "moeserve/daemon/chat_api.hpp"
#include "moeserve/engine/vision.hpp"

namespace moeserve::daemon {

struct ImageWorkSettings {
  int workers = 4;                                  // image_workers
  int tenant_max_in_flight = 2;                     // image_tenant_max_in_flight
  int max_queued = 64;                              // image_max_queued
  int64_t decoded_cache_bytes = int64_t{256} << 20;  // image_decoded_cache_bytes; 0 keeps nothing
};

class ImageWork {
 public:
  // `registry` (may be null: tests) receives the counters.
  ImageWork(ImageWorkSettings settings, prometheus::Registry* registry);
  // Runs the jobs still queued, then joins the workers.
  ~ImageWork();
  ImageWork(const ImageWork&) = delete;
  ImageWork& operator=(const ImageWork&) = delete;

  // Queues `job` for `tenant`, or refuses it (the tenant's share taken, the
  // queue full) without running it. A job answers its request itself.
  ApiResult<void> Submit(const std::string& tenant, std::function<void()> job);

  // The decoded-image cache.
  std::optional<engine::ImageInput> Cached(const std::string& tenant, const std::string& content_hash);
  void Keep(const std::string& tenant, const engine::ImageInput& image);

  void CountDecode();
  void CountFetch();

  const ImageWorkSettings& settings() const { return settings_; }

 private:
  struct Job {
    std::string tenant;
    std::function<void()> run;
  };
  void Loop();
  void Refused(const std::string& reason);

  const ImageWorkSettings settings_;
  std::mutex mu_;
  std::condition_variable ready_;
  std::deque<Job> queue_;
  std::map<std::string, int> in_flight_;  // tenant -> jobs queued or running
  bool stopping_ = false;
  std::vector<std::thread> threads_;

  // The cache: most recently used at the front.
  using Key = std::pair<std::string, std::string>;  // tenant, content hash
  std::mutex cache_mu_;
  std::list<std::pair<Key, engine::ImageInput>> lru_;
  std::map<Key, std::list<std::pair<Key, engine::ImageInput>>::iterator> index_;
  int64_t cached_bytes_ = 0;

  prometheus::Counter* decodes_ = nullptr;
  prometheus::Counter* fetches_ = nullptr;
  prometheus::Counter* cache_hits_ = nullptr;
  prometheus::Family<prometheus::Counter>* refused_ = nullptr;
};

}  // namespace moeserve::daemon
