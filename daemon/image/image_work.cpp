#include "moeserve/daemon/image/image_work.hpp"

#include <algorithm>

#include "moeserve/common/log.hpp"

namespace moeserve::daemon {

ImageWork::ImageWork(ImageWorkSettings settings, prometheus::Registry* registry) : settings_(settings) {
  if (registry) {
    using prometheus::BuildCounter;
    decodes_ = &BuildCounter()
                    .Name("moe_image_decodes_total")
                    .Help("Image files decoded into pixels (new images, and kept ones the cache did not hold)")
                    .Register(*registry)
                    .Add({});
    fetches_ =
        &BuildCounter().Name("moe_image_fetches_total").Help("Image URLs fetched (started)").Register(*registry).Add({});
    cache_hits_ = &BuildCounter()
                       .Name("moe_image_decoded_cache_hits_total")
                       .Help("Kept images replayed from the decoded-image cache instead of decoded again")
                       .Register(*registry)
                       .Add({});
    refused_ = &BuildCounter()
                    .Name("moe_image_jobs_refused_total")
                    .Help("Requests with images refused before any fetch or decode, by reason "
                          "(tenant_share: image_tenant_max_in_flight; queue_full: image_max_queued)")
                    .Register(*registry);
  }
  for (int i = 0; i < std::max(1, settings_.workers); ++i) threads_.emplace_back([this] { Loop(); });
}

ImageWork::~ImageWork() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  ready_.notify_all();
  for (auto& t : threads_) t.join();
}

void ImageWork::Refused(const std::string& reason) {
  if (refused_) refused_->Add({{"reason", reason}}).Increment();
}

ApiResult<void> ImageWork::Submit(const std::string& tenant, std::function<void()> job) {
  {
    std::lock_guard lock(mu_);
    int& mine = in_flight_[tenant];
    if (mine >= settings_.tenant_max_in_flight) {
      const int held = mine;
      if (mine == 0) in_flight_.erase(tenant);
      Refused("tenant_share");
      return ApiFail(ApiError{429, "rate_limit_error", "too_many_image_requests",
                              "Tenant " + tenant + " already has " + std::to_string(held) +
                                  " requests whose images are being fetched or decoded, its limit "
                                  "(image_tenant_max_in_flight); retry when one has finished",
                              "", 1});
    }
    if (static_cast<int>(queue_.size()) >= settings_.max_queued) {
      if (mine == 0) in_flight_.erase(tenant);
      Refused("queue_full");
      return ApiFail(ApiError{503, "server_error", "image_workers_busy",
                              "Every image worker is busy and " + std::to_string(queue_.size()) +
                                  " requests wait for one (image_max_queued); retry shortly",
                              "", 1});
    }
    ++mine;
    queue_.push_back({tenant, std::move(job)});
  }
  ready_.notify_one();
  return {};
}

void ImageWork::Loop() {
  for (;;) {
    Job job;
    {
      std::unique_lock lock(mu_);
      ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    try {
      job.run();
    } catch (const std::exception& e) {
      // A job answers its own request; one that throws must not take the worker with it.
      log::Error(std::string("image worker: a job failed: ") + e.what());
    }
    std::lock_guard lock(mu_);
    if (--in_flight_[job.tenant] <= 0) in_flight_.erase(job.tenant);
  }
}

std::optional<engine::ImageInput> ImageWork::Cached(const std::string& tenant, const std::string& content_hash) {
  std::lock_guard lock(cache_mu_);
  auto it = index_.find({tenant, content_hash});
  if (it == index_.end()) return std::nullopt;
  lru_.splice(lru_.begin(), lru_, it->second);
  if (cache_hits_) cache_hits_->Increment();
  return it->second->second;
}

void ImageWork::Keep(const std::string& tenant, const engine::ImageInput& image) {
  if (!image.rgb) return;
  const int64_t bytes = static_cast<int64_t>(image.rgb->size());
  if (bytes > settings_.decoded_cache_bytes) return;  // would evict everything and still not fit
  std::lock_guard lock(cache_mu_);
  Key key{tenant, image.content_hash};
  if (auto it = index_.find(key); it != index_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second);
    return;
  }
  lru_.emplace_front(key, image);
  index_[key] = lru_.begin();
  cached_bytes_ += bytes;
  while (cached_bytes_ > settings_.decoded_cache_bytes && !lru_.empty()) {
    auto& last = lru_.back();
    cached_bytes_ -= static_cast<int64_t>(last.second.rgb->size());
    index_.erase(last.first);
    lru_.pop_back();
  }
}

void ImageWork::CountDecode() {
  if (decodes_) decodes_->Increment();
}

void ImageWork::CountFetch() {
  if (fetches_) fetches_->Increment();
}

}  // namespace moeserve::daemon
