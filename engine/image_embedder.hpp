// The vision tower's own thread. Embedding a large image takes as long as
// many decode steps; run on the engine's step thread it would stall every
// other sequence's decode for that long. The engine hands each image a
// sequence still has to prefill to this worker when the sequence is admitted
// and prefills only up to the first image whose rows are not back yet; the
// other sequences keep running meanwhile.
//
// Jobs run one at a time, first in first out. A Job handle is the only way to
// a job's result: destroying it (the sequence finished, failed or was
// cancelled) drops a queued job before it runs, and a running job's result
// is discarded when it comes back. Stop() (and the destructor) drops every
// queued job, waits for the running one (the tower cannot be interrupted)
// and joins the thread; handles may outlive it (a dropped job's never
// becomes ready).
//
// The thread starts with the first Enqueue, so an engine that never sees an
// image never starts it.
//
// Thread safety: Enqueue and the Job calls may be called from any thread
// (one Job handle from one thread at a time); Stop from the owner's.
// `tower` runs on the worker thread, `on_done` there too, after a result is
// stored and with no lock of this class held.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "moeserve/common/status.hpp"
#include "moeserve/engine/vision.hpp"

namespace moeserve::engine {

class ImageEmbedder {
 public:
  // The tower (FamilyModel::EmbedImage): one image's rows, [tokens, hidden].
  using Tower = std::function<Result<std::vector<float>>(const ImageInput&)>;

  ImageEmbedder(Tower tower, std::function<void()> on_done);
  ~ImageEmbedder();
  ImageEmbedder(const ImageEmbedder&) = delete;
  ImageEmbedder& operator=(const ImageEmbedder&) = delete;

 private:
  struct Slot;
  struct Core;

 public:
  // One image's job, held by the sequence that needs its rows. An empty
  // handle (default) stands for no job.
  class Job {
   public:
    Job() = default;
    Job(Job&& other) noexcept = default;
    Job& operator=(Job&& other) noexcept;
    ~Job();  // drops the job (see the top of this file)
    explicit operator bool() const { return slot_ != nullptr; }
    // The tower came back (rows or an error); false for a dropped job.
    bool ready() const;
    // Once ready: the tower's rows or its error (a thrown exception becomes
    // Error::Internal). Moves them out: call once; the handle is empty after.
    Result<std::vector<float>> Take();

   private:
    friend class ImageEmbedder;
    explicit Job(std::shared_ptr<Slot> slot) : slot_(std::move(slot)) {}
    void Drop();
    std::shared_ptr<Slot> slot_;
  };

  // Queues the image (its pixels are shared, not copied). After Stop the job
  // is dropped at once: the handle never becomes ready.
  Job Enqueue(ImageInput image);
  // Drops queued jobs, waits for the running one, joins. Idempotent; from
  // the owner's thread.
  void Stop();

 private:
  void Loop();

  Tower tower_;
  std::function<void()> on_done_;
  std::shared_ptr<Core> core_;
  std::thread thread_;  // started by the first Enqueue, under core_->mu
};

}  // namespace moeserve::engine
