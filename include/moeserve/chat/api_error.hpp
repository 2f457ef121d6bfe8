// The error body of api.md: {"error":{"message","type","param","code"}} plus
// the HTTP status and, for 429/503, a Retry-After header.
//
// Request handling returns ApiResult<T> (errors as values, like Result<T>),
// because an HTTP error needs more than moeserve::Error carries: the status,
// the OpenAI `type`, the api.md `code` and the `param` naming the culprit.
//
// Thread safety: plain value types.
#pragma once

#include <expected>
#include <string>

#include <nlohmann/json.hpp>

#include "moeserve/common/status.hpp"

namespace moeserve::chat {

struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string code = "invalid_request_error";
  std::string message;
  std::string param;             // empty: JSON null
  int retry_after_seconds = 0;   // > 0: sent as Retry-After

  nlohmann::json ToJson() const;

  // 400 invalid_request_error: body not JSON, wrong types, missing fields.
  static ApiError InvalidRequest(std::string message, std::string param = "");
  // 400 invalid_tool_history.
  static ApiError InvalidToolHistory(std::string message, std::string param);
  // 400 context_length_exceeded.
  static ApiError ContextLengthExceeded(std::string message);
  // 404 model_not_found.
  static ApiError ModelNotFound(const std::string& model);
  // 401 invalid_api_key.
  static ApiError InvalidApiKey(std::string message);
  // 429 rate_limit_exceeded (the tenants work fills it in).
  static ApiError RateLimited(std::string message, int retry_after_seconds);
  // 503 unavailable: overloaded queue, draining, weights not ready.
  static ApiError Unavailable(std::string message, int retry_after_seconds);
  // 404 for a path the daemon does not serve, 405 for a wrong method.
  static ApiError NoSuchRoute(const std::string& method, const std::string& path);
  static ApiError MethodNotAllowed(const std::string& method, const std::string& path);
  // 413 for bodies over the configured limit.
  static ApiError BodyTooLarge(size_t limit_bytes);
  // 500: a bug or an engine failure; the message says which.
  static ApiError Internal(std::string message);

  // Maps an engine/common Error (e.g. from Engine::Submit) to its HTTP form.
  static ApiError FromError(const Error& e);
};

template <class T>
using ApiResult = std::expected<T, ApiError>;

inline std::unexpected<ApiError> ApiFail(ApiError e) { return std::unexpected<ApiError>(std::move(e)); }

}  // namespace moeserve::chat
