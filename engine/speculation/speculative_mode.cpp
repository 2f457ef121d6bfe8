#include "moeserve/engine/engine.hpp"

namespace moeserve::engine {

std::optional<SpeculativeMode> ParseSpeculativeMode(std::string_view name) {
  if (name == "off") return SpeculativeMode::kOff;
  if (name == "mtp") return SpeculativeMode::kMtp;
  if (name == "lookup") return SpeculativeMode::kLookup;
  if (name == "auto") return SpeculativeMode::kAuto;
  return std::nullopt;
}

std::string_view SpeculativeModeName(SpeculativeMode mode) {
  switch (mode) {
    case SpeculativeMode::kOff: return "off";
    case SpeculativeMode::kMtp: return "mtp";
    case SpeculativeMode::kLookup: return "lookup";
    case SpeculativeMode::kAuto: return "auto";
  }
  return "off";
}

}  // namespace moeserve::engine
