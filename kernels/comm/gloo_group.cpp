#include "moeserve/kernels/comm/gloo_group.hpp"

#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <csignal>
#include <numeric>

#include "moeserve/kernels/comm/rendezvous.hpp"

namespace moeserve::kernels::comm {
namespace {

// Gloo's Store over our authenticated client. Gloo reports store failures by
// exception; they are caught where the mesh is formed.
class StoreAdapter final : public ::gloo::rendezvous::Store {
 public:
  StoreAdapter(RendezvousClient& client, std::chrono::milliseconds timeout) : client_(client), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    auto r = client_.Set(key, data);
    if (!r) throw std::runtime_error(r.error().message);
  }
  std::vector<char> get(const std::string& key) override {
    wait({key}, timeout_);
    auto r = client_.Get(key);
    if (!r) throw std::runtime_error(r.error().message);
    if (!*r) throw std::runtime_error("rendezvous: key " + key + " vanished");
    return std::move(**r);
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    auto r = client_.Wait(keys, std::min(timeout, timeout_));
    if (!r) throw std::runtime_error(r.error().message);
  }

 private:
  RendezvousClient& client_;
  std::chrono::milliseconds timeout_;
};

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<::gloo::Context> ctx, std::chrono::milliseconds timeout)
      : ctx_(std::move(ctx)), timeout_(timeout) {}
  int rank() const override { return ctx_->rank; }
  int size() const override { return ctx_->size; }
  const char* backend() const override { return "gloo"; }
  uint64_t bytes_sent() const override { return bytes_sent_; }

  CommResult<std::vector<int64_t>> ExchangeCounts(std::span<const int64_t> send_counts) override {
    if (static_cast<int>(send_counts.size()) != size()) return CommFail("counts exchange: one count per rank expected");
    std::vector<int64_t> in(send_counts.begin(), send_counts.end()), out(in.size());
    auto st = Run("counts exchange", [&] {
      ::gloo::AlltoallOptions o(ctx_);
      o.setInput(in.data(), in.size());
      o.setOutput(out.data(), out.size());
      o.setTag(1);
      o.setTimeout(timeout_);
      ::gloo::alltoall(o);
    });
    if (!st) return std::unexpected(st.error());
    return out;
  }

  CommResult<void> AllToAllV(const void* send, std::span<const int64_t> send_bytes, void* recv,
                             std::span<const int64_t> recv_bytes) override {
    if (static_cast<int>(send_bytes.size()) != size() || static_cast<int>(recv_bytes.size()) != size())
      return CommFail("all-to-all-v: one size per rank expected");
    // Gloo wants a buffer even when every part is empty.
    char dummy_in = 0, dummy_out = 0;
    const int64_t total_in = std::accumulate(send_bytes.begin(), send_bytes.end(), int64_t{0});
    const int64_t total_out = std::accumulate(recv_bytes.begin(), recv_bytes.end(), int64_t{0});
    auto* in = total_in ? static_cast<char*>(const_cast<void*>(send)) : &dummy_in;
    auto* out = total_out ? static_cast<char*>(recv) : &dummy_out;
    auto st = Run("all-to-all-v", [&] {
      ::gloo::AlltoallvOptions o(ctx_);
      o.setInput(in, std::vector<int64_t>(send_bytes.begin(), send_bytes.end()));
      o.setOutput(out, std::vector<int64_t>(recv_bytes.begin(), recv_bytes.end()));
      o.setTag(2);
      o.setTimeout(timeout_);
      ::gloo::alltoallv(o);
    });
    if (st) bytes_sent_ += static_cast<uint64_t>(total_in - send_bytes[static_cast<size_t>(rank())]);
    return st;
  }

  CommResult<void> Barrier() override {
    return Run("barrier", [&] {
      ::gloo::BarrierOptions o(ctx_);
      o.setTag(3);
      o.setTimeout(timeout_);
      ::gloo::barrier(o);
    });
  }

  CommResult<void> Broadcast(void* data, size_t bytes, int root) override {
    if (root < 0 || root >= size()) return CommFail("broadcast: root " + std::to_string(root) + " is not a rank");
    if (bytes == 0) return {};
    auto st = Run("broadcast", [&] {
      ::gloo::BroadcastOptions o(ctx_);
      o.setOutput(static_cast<char*>(data), bytes);
      o.setRoot(root);
      o.setTag(4);
      o.setTimeout(timeout_);
      ::gloo::broadcast(o);
    });
    if (st && rank() == root) bytes_sent_ += bytes * static_cast<uint64_t>(size() - 1);
    return st;
  }

 private:
  template <typename F>
  CommResult<void> Run(const char* what, F&& f) {
    if (!broken_.empty()) return CommFail(broken_);
    try {
      f();
      return {};
    } catch (const std::exception& e) {
      broken_ = std::string("gloo ") + what + " failed (a peer died or timed out; the group must re-form): " + e.what();
      return CommFail(broken_);
    }
  }

  std::shared_ptr<::gloo::Context> ctx_;
  std::chrono::milliseconds timeout_;
  std::string broken_;
  uint64_t bytes_sent_ = 0;
};

// Gloo's TCP transport writes with plain writev: a write to a peer that
// has died raises SIGPIPE, whose default action ends this process instead of
// failing the collective (the error the group's re-forming relies on).
// Ignored process-wide at every join (joins are rare; the program may have
// reset it since), unless the program set its own handler.
void IgnoreSigpipeUnlessHandled() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) std::signal(SIGPIPE, SIG_IGN);
}

}  // namespace

CommResult<std::unique_ptr<Communicator>> JoinGlooGroup(const GlooGroupOptions& o, uint64_t* epoch_out) {
  if (o.size < 1 || o.rank < 0 || o.rank >= o.size)
    return CommFail("gloo: rank " + std::to_string(o.rank) + " outside a world of " + std::to_string(o.size));
  IgnoreSigpipeUnlessHandled();
  auto client = RendezvousClient::Connect(o.master_host, o.master_port, o.secret, o.timeout);
  if (!client) return std::unexpected(client.error());
  auto epoch = (*client)->Join(o.rank, o.timeout);
  if (!epoch) return std::unexpected(epoch.error());
  if (epoch_out) *epoch_out = *epoch;
  try {
    StoreAdapter store(**client, o.timeout);
    ::gloo::rendezvous::PrefixStore prefixed("epoch" + std::to_string(*epoch), store);
    ::gloo::transport::tcp::attr attr;
    attr.hostname = o.bind_host;
    auto dev = ::gloo::transport::tcp::CreateDevice(attr);
    auto ctx = std::make_shared<::gloo::rendezvous::Context>(o.rank, o.size);
    ctx->setTimeout(o.timeout);
    ctx->connectFullMesh(prefixed, dev);
    return std::unique_ptr<Communicator>(new GlooCommunicator(ctx, o.timeout));
  } catch (const std::exception& e) {
    return CommFail("gloo: could not connect the group (epoch " + std::to_string(*epoch) + "): " + e.what());
  }
}

}  // namespace moeserve::kernels::comm
