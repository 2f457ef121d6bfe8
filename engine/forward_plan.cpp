#include "forward_plan.hpp"

#include <cstring>
#include <string>

namespace moeserve::engine {
namespace {

class Writer {
 public:
  template <typename T>
  void Put(T v) {
    const size_t at = out.size();
    out.resize(at + sizeof(T));
    std::memcpy(out.data() + at, &v, sizeof(T));
  }
  template <typename T>
  void PutVector(const std::vector<T>& v) {
    Put<uint32_t>(static_cast<uint32_t>(v.size()));
    for (const T& x : v) Put<T>(x);
  }
  std::vector<uint8_t> out;
};

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> b) : b_(b) {}
  template <typename T>
  bool Get(T* v) {
    if (b_.size() - at_ < sizeof(T)) return false;
    std::memcpy(v, b_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return true;
  }
  template <typename T>
  bool GetVector(std::vector<T>* v) {
    uint32_t n = 0;
    if (!Get(&n) || n > (b_.size() - at_) / sizeof(T)) return false;
    v->resize(n);
    for (uint32_t i = 0; i < n; ++i) Get(&(*v)[i]);
    return true;
  }
  bool done() const { return at_ == b_.size(); }

 private:
  std::span<const uint8_t> b_;
  size_t at_ = 0;
};

}  // namespace

std::vector<uint8_t> EncodeForwardPlan(const ForwardPlan& plan) {
  Writer w;
  w.Put<uint8_t>(static_cast<uint8_t>(plan.kind));
  w.PutVector(plan.retired);
  w.Put<uint32_t>(static_cast<uint32_t>(plan.segments.size()));
  for (const auto& s : plan.segments) {
    w.Put<uint64_t>(s.key);
    w.Put<int64_t>(s.pos0);
    w.Put<uint8_t>(s.all_logits ? 1 : 0);
    w.PutVector(s.tokens);
    w.PutVector(s.blocks);
  }
  return std::move(w.out);
}

Result<ForwardPlan> DecodeForwardPlan(std::span<const uint8_t> bytes) {
  auto bad = [](const std::string& what) { return Fail(Error::Corruption("forward plan", what)); };
  Reader r(bytes);
  ForwardPlan plan;
  uint8_t kind = 0;
  if (!r.Get(&kind) || kind < 1 || kind > 3) return bad("unknown kind");
  plan.kind = static_cast<ForwardPlan::Kind>(kind);
  if (!r.GetVector(&plan.retired)) return bad("truncated retired list");
  uint32_t n = 0;
  if (!r.Get(&n) || n > bytes.size()) return bad("truncated segment count");
  for (uint32_t i = 0; i < n; ++i) {
    ForwardPlan::Segment s;
    uint8_t all = 0;
    if (!r.Get(&s.key) || !r.Get(&s.pos0) || !r.Get(&all) || !r.GetVector(&s.tokens) || !r.GetVector(&s.blocks))
      return bad("segment " + std::to_string(i) + " truncated");
    if (s.pos0 < 0 || s.tokens.empty()) return bad("segment " + std::to_string(i) + " has no tokens or a negative position");
    s.all_logits = all != 0;
    plan.segments.push_back(std::move(s));
  }
  if (!r.done()) return bad("trailing bytes");
  return plan;
}

}  // namespace moeserve::engine
