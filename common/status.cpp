#include "moeserve/common/status.hpp"

namespace moeserve {

std::string_view ErrorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kOutOfRange: return "out of range";
    case ErrorCode::kNotFound: return "not found";
    case ErrorCode::kCorruption: return "corruption";
    case ErrorCode::kIo: return "io error";
    case ErrorCode::kUnavailable: return "unavailable";
    case ErrorCode::kPermissionDenied: return "permission denied";
    case ErrorCode::kResourceExhausted: return "resource exhausted";
    case ErrorCode::kConflict: return "conflict";
    case ErrorCode::kTimeout: return "timeout";
    case ErrorCode::kInternal: return "internal error";
  }
  return "unknown";
}

std::string Error::ToString() const { return std::string(ErrorCodeName(code_)) + ": " + message_; }

}  // namespace moeserve
