#include "moeserve/engine/expert_group.hpp"

#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "moeserve/common/log.hpp"
#include "moeserve/kernels/comm/gloo_group.hpp"
#include "moeserve/kernels/comm/rendezvous.hpp"

namespace moeserve::engine {

namespace comm = kernels::comm;

const char* ExpertGroupStatus::name() const {
  switch (state) {
    case State::kJoining: return "joining";
    case State::kConnected: return "connected";
    case State::kDegraded: return "degraded";
    case State::kStopped: return "stopped";
  }
  return "unknown";
}

namespace {

Result<int> EnvInt(const char* name, int fallback, int min) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < min || x > 1000000)
    return Fail(Error::InvalidArgument(std::string(name) + "=" + v + ": expected an integer of at least " + std::to_string(min)));
  return static_cast<int>(x);
}

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace

Result<ExpertGroupSettings> ExpertGroupSettingsFromEnv() {
  ExpertGroupSettings s;
  MOE_ASSIGN_OR_RETURN(int nodes, EnvInt("MOE_NUM_NODES", 1, 1));
  if (nodes == 1) return s;
  MOE_ASSIGN_OR_RETURN(int node_rank, EnvInt("MOE_NODE_RANK", -1, 0));
  if (node_rank < 0) return Fail(Error::InvalidArgument("MOE_NUM_NODES=" + std::to_string(nodes) + " needs MOE_NODE_RANK"));
  if (node_rank >= nodes)
    return Fail(Error::InvalidArgument("MOE_NODE_RANK=" + std::to_string(node_rank) + " outside MOE_NUM_NODES=" + std::to_string(nodes)));
  MOE_ASSIGN_OR_RETURN(int local, EnvInt("MOE_LOCAL_RANKS", 1, 1));
  if (local != 1)
    return Fail(Error::InvalidArgument("MOE_LOCAL_RANKS=" + std::to_string(local) +
                                       ": this daemon's CPU engine runs one expert-parallel rank per pod"));
  s.rank = node_rank * local;
  s.world = nodes * local;
  s.master_addr = Env("MOE_MASTER_ADDR");
  if (s.master_addr.empty()) return Fail(Error::InvalidArgument("MOE_NUM_NODES > 1 needs MOE_MASTER_ADDR"));
  MOE_ASSIGN_OR_RETURN(s.rendezvous_port, EnvInt("MOE_RENDEZVOUS_PORT", 29400, 1));
  MOE_ASSIGN_OR_RETURN(int timeout_ms, EnvInt("MOE_GROUP_TIMEOUT_MS", 5000, 100));
  s.timeout = std::chrono::milliseconds(timeout_ms);
  s.heartbeat = std::min(std::chrono::milliseconds(1000), s.timeout / 3);
  const std::string secret_file = Env("MOE_GROUP_SECRET_FILE");
  if (!secret_file.empty()) {
    std::ifstream in(secret_file);
    if (!in) return Fail(Error::Io("MOE_GROUP_SECRET_FILE " + secret_file + ": cannot be opened"));
    std::stringstream ss;
    ss << in.rdbuf();
    s.secret = ss.str();
    while (!s.secret.empty() && std::isspace(static_cast<unsigned char>(s.secret.back()))) s.secret.pop_back();
  } else {
    s.secret = Env("MOE_GROUP_SECRET");
  }
  // Never the secret itself in a message.
  if (s.secret.size() < 16)
    return Fail(Error::InvalidArgument("the expert-parallel group secret (MOE_GROUP_SECRET_FILE or MOE_GROUP_SECRET) "
                                       "must be set and at least 16 bytes"));
  s.bind_addr = Env("MOE_POD_IP");
  if (s.bind_addr.empty()) {
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    s.bind_addr = host;
  }
  return s;
}

struct ExpertGroup::Impl {
  ExpertGroupSettings settings;
  const Model* model = nullptr;
  KvPool* pool = nullptr;  // followers
  Listener listener;
  std::unique_ptr<comm::RendezvousServer> server;  // rank 0
  std::unique_ptr<comm::Communicator> group;

  mutable std::mutex mu;
  std::condition_variable cv;
  ExpertGroupStatus status;
  std::atomic<bool> stop{false};
  std::thread thread;

  void Report(ExpertGroupStatus::State state, std::string detail) {
    ExpertGroupStatus copy;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (state == ExpertGroupStatus::State::kConnected) status.formations++;
      if (state == ExpertGroupStatus::State::kDegraded) status.failures++;
      status.state = state;
      status.detail = std::move(detail);
      copy = status;
    }
    cv.notify_all();  // WaitConnected
    log::Info("expert-parallel rank " + std::to_string(settings.rank) + "/" + std::to_string(settings.world) + ": " + copy.name() +
              (copy.detail.empty() ? "" : " (" + copy.detail + ")"));
    if (listener) listener(copy);
  }
  // Sleeps up to d; false when stopping.
  bool Pause(std::chrono::milliseconds d) {
    std::unique_lock<std::mutex> lock(mu);
    return !cv.wait_for(lock, d, [&] { return stop.load(); });
  }
  // One join attempt; true when connected.
  bool Join() {
    comm::GlooGroupOptions o;
    o.rank = settings.rank;
    o.size = settings.world;
    o.master_host = settings.rank == 0 ? settings.bind_addr : settings.master_addr;
    o.master_port = server ? server->port() : settings.rendezvous_port;
    o.secret = settings.secret;
    o.bind_host = settings.bind_addr;
    o.timeout = settings.timeout;
    uint64_t epoch = 0;
    auto g = comm::JoinGlooGroup(o, &epoch);
    {
      std::lock_guard<std::mutex> lock(mu);
      status.epoch = epoch;
    }
    if (!g) {
      log::Warn("expert-parallel rank " + std::to_string(settings.rank) + ": joining failed: " + g.error().message);
      return false;
    }
    group = std::move(*g);
    model->SetGroup(group.get());
    return true;
  }
  void Disconnect() {
    model->SetGroup(nullptr);
    group.reset();
  }

  void LeadLoop() {
    bool was_connected = false;
    while (!stop) {
      if (!was_connected) Report(ExpertGroupStatus::State::kJoining, "waiting for " + std::to_string(settings.world) + " ranks");
      if (!Join()) {
        // A rank that joined this epoch may be waiting on one that never
        // came: start the next epoch so everyone meets again.
        server->Reset();
        if (!Pause(std::chrono::milliseconds(200))) break;
        continue;
      }
      was_connected = true;
      Report(ExpertGroupStatus::State::kConnected, "all " + std::to_string(settings.world) + " ranks joined");
      Status st = Ok();
      while (!stop && st) {
        if (!Pause(settings.heartbeat)) break;
        st = model->Heartbeat();
      }
      if (stop) break;
      Disconnect();
      server->Reset();
      Report(ExpertGroupStatus::State::kDegraded, "a rank left the group: " + st.error().message() + "; waiting for it to rejoin");
    }
    if (group) {
      if (auto st = model->StopFollowers(); !st) log::Warn("expert-parallel: stopping the followers: " + st.error().message());
      Disconnect();
    }
    Report(ExpertGroupStatus::State::kStopped, "");
  }

  void FollowLoop() {
    while (!stop) {
      Report(ExpertGroupStatus::State::kJoining, "joining rank 0 at " + settings.master_addr);
      if (!Join()) {
        if (!Pause(std::chrono::milliseconds(200))) break;
        continue;
      }
      Report(ExpertGroupStatus::State::kConnected, "following rank 0");
      Status st = model->Follow(*pool, stop);
      Disconnect();
      if (stop) break;
      if (st) {
        log::Info("expert-parallel rank " + std::to_string(settings.rank) + ": rank 0 stopped the group");
      } else {
        Report(ExpertGroupStatus::State::kDegraded, st.error().message());
      }
    }
    Report(ExpertGroupStatus::State::kStopped, "");
  }
};

ExpertGroup::ExpertGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ExpertGroup::~ExpertGroup() { Stop(); }

Result<std::unique_ptr<ExpertGroup>> ExpertGroup::Lead(const ExpertGroupSettings& settings, const Model& model, Listener listener) {
  if (settings.rank != 0) return Fail(Error::InvalidArgument("only expert-parallel rank 0 leads"));
  if (model.ep_world() != settings.world || model.ep_rank() != 0)
    return Fail(Error::InvalidArgument("the model was loaded for another expert-parallel rank or world"));
  auto impl = std::make_unique<Impl>();
  impl->settings = settings;
  impl->model = &model;
  impl->listener = std::move(listener);
  auto server = comm::RendezvousServer::Start(settings.bind_addr, settings.rendezvous_port, settings.secret, settings.world);
  if (!server) return Fail(Error::Unavailable("expert-parallel rendezvous: " + server.error().message));
  impl->server = std::move(*server);
  Impl* p = impl.get();
  impl->thread = std::thread([p] { p->LeadLoop(); });
  return std::unique_ptr<ExpertGroup>(new ExpertGroup(std::move(impl)));
}

Result<std::unique_ptr<ExpertGroup>> ExpertGroup::Follow(const ExpertGroupSettings& settings, const Model& model, KvPool& pool,
                                                        Listener listener) {
  if (settings.rank == 0) return Fail(Error::InvalidArgument("expert-parallel rank 0 leads; it does not follow"));
  if (model.ep_world() != settings.world || model.ep_rank() != settings.rank)
    return Fail(Error::InvalidArgument("the model was loaded for another expert-parallel rank or world"));
  auto impl = std::make_unique<Impl>();
  impl->settings = settings;
  impl->model = &model;
  impl->pool = &pool;
  impl->listener = std::move(listener);
  Impl* p = impl.get();
  impl->thread = std::thread([p] { p->FollowLoop(); });
  return std::unique_ptr<ExpertGroup>(new ExpertGroup(std::move(impl)));
}

Status ExpertGroup::FollowOnce(const ExpertGroupSettings& settings, const Model& model, KvPool& pool,
                               std::chrono::milliseconds wait) {
  if (settings.rank == 0) return Fail(Error::InvalidArgument("expert-parallel rank 0 leads; it does not follow"));
  if (model.ep_world() != settings.world || model.ep_rank() != settings.rank)
    return Fail(Error::InvalidArgument("the model was loaded for another expert-parallel rank or world"));
  Impl impl;
  impl.settings = settings;
  impl.model = &model;
  const auto deadline = std::chrono::steady_clock::now() + wait;
  while (!impl.Join()) {
    if (std::chrono::steady_clock::now() >= deadline)
      return Fail(Error::Unavailable("expert-parallel rank " + std::to_string(settings.rank) + ": rank 0 at " +
                                     settings.master_addr + ":" + std::to_string(settings.rendezvous_port) +
                                     " did not form the group in time"));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  const std::atomic<bool> never{false};
  Status st = model.Follow(pool, never);
  impl.Disconnect();
  return st;
}

bool ExpertGroup::WaitConnected(std::chrono::milliseconds wait) const {
  std::unique_lock<std::mutex> lock(impl_->mu);
  return impl_->cv.wait_for(lock, wait, [&] { return impl_->status.state == ExpertGroupStatus::State::kConnected; });
}

void ExpertGroup::Stop() {
  if (!impl_ || !impl_->thread.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  impl_->thread.join();
}

ExpertGroupStatus ExpertGroup::status() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->status;
}

}  // namespace moeserve::engine
