#include "moeserve/daemon/harmony_arguments.hpp"

#include <algorithm>
#include <limits>

namespace moeserve::daemon {

std::shared_ptr<const TokenByteIndex> TokenByteIndex::Build(const engine::HfTokenizer& tokenizer) {
  auto index = std::make_shared<TokenByteIndex>();
  const int vocab = tokenizer.vocab_size();
  index->by_id_.resize(static_cast<size_t>(vocab));
  for (int id = 0; id < vocab; ++id) {
    if (tokenizer.IsSpecial(id)) continue;
    std::string bytes(tokenizer.TokenBytes(id));
    if (bytes.empty()) continue;
    index->by_id_[static_cast<size_t>(id)] = bytes;
    index->entries_.push_back({std::move(bytes), id, 0});
  }
  std::sort(index->entries_.begin(), index->entries_.end(),
            [](const Entry& a, const Entry& b) { return a.bytes < b.bytes || (a.bytes == b.bytes && a.id < b.id); });
  for (size_t i = 1; i < index->entries_.size(); ++i) {
    const std::string& a = index->entries_[i - 1].bytes;
    const std::string& b = index->entries_[i].bytes;
    size_t n = 0;
    while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
    index->entries_[i].shared = static_cast<int>(n);
  }
  return index;
}

const std::string& TokenByteIndex::BytesOf(int id) const {
  static const std::string kNone;
  return id >= 0 && static_cast<size_t>(id) < by_id_.size() ? by_id_[static_cast<size_t>(id)] : kNone;
}

HarmonyArgumentsController::HarmonyArgumentsController(std::shared_ptr<const TokenByteIndex> index, JsonGrammar grammar,
                                                       int call_token)
    : index_(std::move(index)), grammar_(std::move(grammar)), call_token_(call_token) {}

std::vector<int> HarmonyArgumentsController::Allowed(int vocab) const {
  std::vector<int> out;
  if (done_) {
    if (call_token_ < vocab) out.push_back(call_token_);
    return out;
  }
  // states[k]: the grammar after the first k bytes of the entry being walked.
  std::vector<JsonGrammar> states;
  states.reserve(64);
  states.push_back(grammar_);
  int refused_at = std::numeric_limits<int>::max();  // byte of the last walk the grammar refused
  for (const auto& e : index_->entries()) {
    // Starts with a refused prefix (shares more than the bytes before the refusal): refused too.
    if (e.shared > refused_at) continue;
    refused_at = std::numeric_limits<int>::max();
    states.erase(states.begin() + e.shared + 1, states.end());
    bool ok = true;
    for (size_t k = static_cast<size_t>(e.shared); k < e.bytes.size(); ++k) {
      JsonGrammar next = states[k];
      if (!next.Feed(static_cast<uint8_t>(e.bytes[k]))) {
        refused_at = static_cast<int>(k);
        ok = false;
        break;
      }
      states.push_back(std::move(next));
    }
    if (ok && e.id < vocab) out.push_back(e.id);
  }
  return out;
}

void HarmonyArgumentsController::Mask(std::span<float> logits) {
  if (broken_) return;
  std::vector<char> keep(logits.size(), 0);
  for (int id : Allowed(static_cast<int>(logits.size()))) keep[static_cast<size_t>(id)] = 1;
  for (size_t i = 0; i < logits.size(); ++i)
    if (!keep[i]) logits[i] = -std::numeric_limits<float>::infinity();
}

std::vector<int> HarmonyArgumentsController::OnToken(int token) {
  if (done_ || broken_) return {};
  for (unsigned char c : index_->BytesOf(token)) {
    // A forced or unmasked token the grammar refuses: stop constraining, the
    // parser reports the arguments as generated.
    if (!grammar_.Feed(c)) {
      broken_ = true;
      return {};
    }
  }
  if (grammar_.Done()) {
    done_ = true;
    return {call_token_};  // the arguments are complete: the call ends
  }
  return {};
}

}  // namespace moeserve::daemon
