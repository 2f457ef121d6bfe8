// StopTrimmedContent (output_assembler.hpp): stop strings and the
// log-probabilities that travel with released text, for every chat format.
#include <algorithm>

#include "moeserve/chat/moe_dsa_v1/output_assembler.hpp"
#include "moeserve/chat/stop_hold.hpp"

namespace moeserve::chat {

void StopTrimmedContent::Release(OutputDelta& out, bool all) {
  size_t end = all_.size();
  if (!all) end -= StopHoldBack(all_, released_, stop_);
  if (end > released_) {
    const std::string piece = all_.substr(released_, end - released_);
    out.content += piece;
    released_text_ += piece;
    released_ = end;
  }
  // Tokens go out with the text they made, in order.
  size_t n = 0;
  while (n < held_.size() && held_[n].first <= released_) {
    out.logprobs.push_back(held_[n].second);
    logprobs_.push_back(std::move(held_[n].second));
    ++n;
  }
  held_.erase(held_.begin(), held_.begin() + static_cast<std::ptrdiff_t>(n));
}

void StopTrimmedContent::Append(const std::string& text, OutputDelta& out) {
  if (stop_matched_) undecoded_.clear();
  if (text.empty() || stop_matched_) return;
  // A match may start in held-back text, so search from what was released.
  const size_t search_from = released_;
  all_ += text;
  // The tokens whose bytes this text completes end where it ends.
  for (auto& lp : undecoded_) held_.emplace_back(all_.size(), std::move(lp));
  undecoded_.clear();
  size_t cut = std::string::npos;
  for (const auto& s : stop_) {
    if (s.empty()) continue;
    const size_t at = all_.find(s, search_from);
    if (at != std::string::npos) cut = std::min(cut, at);
  }
  if (cut != std::string::npos) {
    all_.resize(cut);
    // A token whose text runs past the cut is not part of the answer.
    std::erase_if(held_, [&](const auto& held) { return held.first > cut; });
    stop_matched_ = true;
    Release(out, /*all=*/true);
    return;
  }
  Release(out, /*all=*/false);
}

void StopTrimmedContent::Flush(OutputDelta& out) {
  if (!stop_matched_) Release(out, /*all=*/true);
}

}  // namespace moeserve::chat
