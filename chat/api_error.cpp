#include "moeserve/chat/api_error.hpp"

namespace moeserve::chat {

nlohmann::json ApiError::ToJson() const {
  nlohmann::json err = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", code}};
  if (!param.empty()) err["param"] = param;
  return {{"error", err}};
}

ApiError ApiError::InvalidRequest(std::string message, std::string param) {
  return {400, "invalid_request_error", "invalid_request_error", std::move(message), std::move(param), 0};
}
ApiError ApiError::InvalidToolHistory(std::string message, std::string param) {
  return {400, "invalid_request_error", "invalid_tool_history", std::move(message), std::move(param), 0};
}
ApiError ApiError::ContextLengthExceeded(std::string message) {
  return {400, "invalid_request_error", "context_length_exceeded", std::move(message), "messages", 0};
}
ApiError ApiError::ModelNotFound(const std::string& model) {
  return {404, "invalid_request_error", "model_not_found",
          "The model '" + model + "' does not exist on this server; GET /v1/models lists the one it serves",
          "model", 0};
}
ApiError ApiError::InvalidApiKey(std::string message) {
  return {401, "invalid_request_error", "invalid_api_key", std::move(message), "", 0};
}
ApiError ApiError::RateLimited(std::string message, int retry_after_seconds) {
  return {429, "rate_limit_error", "rate_limit_exceeded", std::move(message), "", retry_after_seconds};
}
ApiError ApiError::Unavailable(std::string message, int retry_after_seconds) {
  return {503, "server_error", "unavailable", std::move(message), "", retry_after_seconds};
}
ApiError ApiError::NoSuchRoute(const std::string& method, const std::string& path) {
  return {404, "invalid_request_error", "not_found", "No route for " + method + " " + path, "", 0};
}
ApiError ApiError::MethodNotAllowed(const std::string& method, const std::string& path) {
  return {405, "invalid_request_error", "method_not_allowed", path + " does not accept " + method, "", 0};
}
ApiError ApiError::BodyTooLarge(size_t limit_bytes) {
  return {413, "invalid_request_error", "invalid_request_error",
          "Request body is larger than the server's limit of " + std::to_string(limit_bytes) + " bytes", "", 0};
}
ApiError ApiError::Internal(std::string message) {
  return {500, "server_error", "internal_error", std::move(message), "", 0};
}

ApiError ApiError::FromError(const Error& e) {
  switch (e.code()) {
    case ErrorCode::kInvalidArgument:
      return InvalidRequest(e.message(), e.field());
    case ErrorCode::kOutOfRange:
      return ContextLengthExceeded(e.message());
    case ErrorCode::kResourceExhausted:
      return Unavailable("The server is overloaded: " + e.message() + "; retry later", 1);
    case ErrorCode::kUnavailable:
      return Unavailable(e.message(), 1);
    case ErrorCode::kPermissionDenied:
      return InvalidApiKey(e.message());
    case ErrorCode::kNotFound:
      return {404, "invalid_request_error", "not_found", e.message(), "", 0};
    default:
      return Internal(e.ToString());
  }
}

}  // namespace moeserve::chat
