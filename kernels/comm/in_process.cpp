#include "moeserve/kernels/comm/in_process.hpp"

#include <barrier>
#include <cstring>
#include <numeric>
#include <string>

namespace moeserve::kernels::comm {
namespace {

struct Hub {
  explicit Hub(int n) : size(n), sync(n), slots(static_cast<size_t>(n)) {}
  struct Slot {
    const void* send = nullptr;
    std::vector<int64_t> send_bytes;
    void* data = nullptr;
  };
  int size;
  std::barrier<> sync;
  std::vector<Slot> slots;
};

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<Hub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return hub_->size; }
  const char* backend() const override { return "in-process"; }
  uint64_t bytes_sent() const override { return bytes_sent_; }

  CommResult<std::vector<int64_t>> ExchangeCounts(std::span<const int64_t> send_counts) override {
    if (static_cast<int>(send_counts.size()) != size()) return CommFail("counts exchange: one count per rank expected");
    Publish(nullptr, {send_counts.begin(), send_counts.end()}, nullptr);
    std::vector<int64_t> recv(static_cast<size_t>(size()));
    for (int r = 0; r < size(); ++r) recv[static_cast<size_t>(r)] = hub_->slots[static_cast<size_t>(r)].send_bytes[static_cast<size_t>(rank_)];
    hub_->sync.arrive_and_wait();
    return recv;
  }

  CommResult<void> AllToAllV(const void* send, std::span<const int64_t> send_bytes, void* recv,
                             std::span<const int64_t> recv_bytes) override {
    if (static_cast<int>(send_bytes.size()) != size() || static_cast<int>(recv_bytes.size()) != size())
      return CommFail("all-to-all-v: one size per rank expected");
    Publish(send, {send_bytes.begin(), send_bytes.end()}, nullptr);
    std::string error;
    size_t at = 0;
    for (int r = 0; r < size(); ++r) {
      const Hub::Slot& s = hub_->slots[static_cast<size_t>(r)];
      const int64_t n = s.send_bytes[static_cast<size_t>(rank_)];
      if (n != recv_bytes[static_cast<size_t>(r)]) {
        error = "all-to-all-v: rank " + std::to_string(r) + " sends " + std::to_string(n) + " bytes, " +
                std::to_string(recv_bytes[static_cast<size_t>(r)]) + " expected";
        continue;
      }
      const int64_t off = std::accumulate(s.send_bytes.begin(), s.send_bytes.begin() + rank_, int64_t{0});
      if (n > 0) std::memcpy(static_cast<char*>(recv) + at, static_cast<const char*>(s.send) + off, static_cast<size_t>(n));
      at += static_cast<size_t>(n);
    }
    hub_->sync.arrive_and_wait();
    for (int64_t b : send_bytes) bytes_sent_ += static_cast<uint64_t>(b);
    if (!error.empty()) return CommFail(error);
    return {};
  }

  CommResult<void> Barrier() override {
    hub_->sync.arrive_and_wait();
    return {};
  }

  CommResult<void> Broadcast(void* data, size_t bytes, int root) override {
    if (root < 0 || root >= size()) return CommFail("broadcast: root " + std::to_string(root) + " is not a rank");
    Publish(nullptr, {static_cast<int64_t>(bytes)}, data);
    const Hub::Slot& s = hub_->slots[static_cast<size_t>(root)];
    std::string error;
    if (s.send_bytes[0] != static_cast<int64_t>(bytes)) error = "broadcast: ranks disagree on the size";
    else if (rank_ != root && bytes > 0) std::memcpy(data, s.data, bytes);
    hub_->sync.arrive_and_wait();
    if (rank_ == root) bytes_sent_ += bytes * static_cast<uint64_t>(size() - 1);
    if (!error.empty()) return CommFail(error);
    return {};
  }

 private:
  void Publish(const void* send, std::vector<int64_t> sizes, void* data) {
    Hub::Slot& mine = hub_->slots[static_cast<size_t>(rank_)];
    mine.send = send;
    mine.send_bytes = std::move(sizes);
    mine.data = data;
    hub_->sync.arrive_and_wait();
  }

  std::shared_ptr<Hub> hub_;
  int rank_;
  uint64_t bytes_sent_ = 0;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> MakeInProcessGroup(int size) {
  auto hub = std::make_shared<Hub>(size);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < size; ++r) out.push_back(std::make_unique<InProcessCommunicator>(hub, r));
  return out;
}

}  // namespace moeserve::kernels::comm
