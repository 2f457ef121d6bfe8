#include "image_embedder.hpp"

#include <algorithm>
#include <exception>

#include "moeserve/common/exception_text.hpp"

namespace moeserve::engine {

struct ImageEmbedder::Slot {
  enum class State { kQueued, kRunning, kDone, kDropped };
  ImageInput image;  // read by the worker without the lock: nothing writes it after Enqueue
  std::shared_ptr<Core> core;
  // Guarded by core->mu:
  State state = State::kQueued;
  std::optional<Result<std::vector<float>>> result;
};

struct ImageEmbedder::Core {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<Slot>> queue;
  bool stopping = false;
};

ImageEmbedder::ImageEmbedder(Tower tower, std::function<void()> on_done)
    : tower_(std::move(tower)), on_done_(std::move(on_done)), core_(std::make_shared<Core>()) {}

ImageEmbedder::~ImageEmbedder() { Stop(); }

ImageEmbedder::Job ImageEmbedder::Enqueue(ImageInput image) {
  auto slot = std::make_shared<Slot>();
  slot->image = std::move(image);
  slot->core = core_;
  {
    std::lock_guard lock(core_->mu);
    if (core_->stopping) {
      slot->state = Slot::State::kDropped;
      return Job(std::move(slot));
    }
    if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
    core_->queue.push_back(slot);
  }
  core_->cv.notify_all();
  return Job(std::move(slot));
}

void ImageEmbedder::Stop() {
  std::deque<std::shared_ptr<Slot>> dropped;
  {
    std::lock_guard lock(core_->mu);
    core_->stopping = true;
    for (auto& slot : core_->queue) slot->state = Slot::State::kDropped;
    dropped.swap(core_->queue);
  }
  core_->cv.notify_all();
  if (thread_.joinable()) thread_.join();
}

void ImageEmbedder::Loop() {
  Core& core = *core_;
  std::unique_lock lock(core.mu);
  while (true) {
    core.cv.wait(lock, [&] { return core.stopping || !core.queue.empty(); });
    if (core.stopping) return;
    std::shared_ptr<Slot> slot = std::move(core.queue.front());
    core.queue.pop_front();
    slot->state = Slot::State::kRunning;
    lock.unlock();
    std::optional<Result<std::vector<float>>> rows;
    try {
      rows = tower_(slot->image);
    } catch (...) {
      rows = Fail(Error::Internal(ExceptionText(std::current_exception())));
    }
    lock.lock();
    if (slot->state != Slot::State::kRunning) {  // dropped while it ran: nobody reads it
      lock.unlock();
      rows.reset();  // freed outside the lock
      slot.reset();
      lock.lock();
      continue;
    }
    slot->result = std::move(rows);
    slot->state = Slot::State::kDone;
    slot.reset();
    lock.unlock();
    on_done_();
    lock.lock();
  }
}

ImageEmbedder::Job& ImageEmbedder::Job::operator=(Job&& other) noexcept {
  if (this != &other) {
    Drop();
    slot_ = std::move(other.slot_);
  }
  return *this;
}

ImageEmbedder::Job::~Job() { Drop(); }

void ImageEmbedder::Job::Drop() {
  if (!slot_) return;
  std::optional<Result<std::vector<float>>> freed;  // released after the lock
  {
    Core& core = *slot_->core;
    std::lock_guard lock(core.mu);
    if (slot_->state == Slot::State::kQueued)
      std::erase_if(core.queue, [&](const std::shared_ptr<Slot>& s) { return s == slot_; });
    freed.swap(slot_->result);
    slot_->state = Slot::State::kDropped;
  }
  slot_.reset();
}

bool ImageEmbedder::Job::ready() const {
  if (!slot_) return false;
  std::lock_guard lock(slot_->core->mu);
  return slot_->state == Slot::State::kDone;
}

Result<std::vector<float>> ImageEmbedder::Job::Take() {
  if (!slot_) return Fail(Error::Internal("image job: no job to take rows from"));
  std::optional<Result<std::vector<float>>> rows;
  {
    std::lock_guard lock(slot_->core->mu);
    if (slot_->state != Slot::State::kDone) return Fail(Error::Internal("image job: rows taken before they were ready"));
    rows.swap(slot_->result);
    slot_->state = Slot::State::kDropped;
  }
  slot_.reset();
  return std::move(*rows);
}

}  // namespace moeserve::engine
