// Errors as values.
//
// Every fallible function in moeserve returns Result<T> (= std::expected<T,
// Error>) or Status (= Result<void>). An Error carries a category and a message
// a person can act on: it names the file, field or tensor and says what is
// wrong. Exceptions never cross a library boundary; code that calls a throwing
// third-party API catches at the call site and converts.
//
// Thread safety: Error is a plain value type; copies are independent.
#pragma once

#include <expected>
#include <string>
#include <string_view>
#include <utility>

namespace moeserve {

enum class ErrorCode {
  kInvalidArgument,   // the caller's input is wrong (config field, request body, flag)
  kOutOfRange,        // valid input past a limit of this deployment (context window)
  kNotFound,          // a file, tensor, key or object does not exist
  kCorruption,        // stored data is malformed (checkpoint, header, checksum)
  kIo,                // the operating system refused (open, read, mmap, write)
  kUnavailable,       // a peer or resource is temporarily unavailable; retrying may help
  kPermissionDenied,  // authentication or authorisation failed
  kResourceExhausted, // a pool, queue or budget is full
  kConflict,          // a concurrent writer won (optimistic concurrency)
  kTimeout,           // a deadline passed
  kInternal,          // a broken invariant: a bug in moeserve
};

std::string_view ErrorCodeName(ErrorCode code);

class Error {
 public:
  Error(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Error InvalidArgument(std::string msg) { return {ErrorCode::kInvalidArgument, std::move(msg)}; }
  static Error OutOfRange(std::string msg) { return {ErrorCode::kOutOfRange, std::move(msg)}; }
  static Error NotFound(std::string msg) { return {ErrorCode::kNotFound, std::move(msg)}; }
  // Corruption(file, "tensor 'x': offsets past end") -> "file: tensor 'x': offsets past end"
  static Error Corruption(std::string_view file, std::string_view what) {
    return {ErrorCode::kCorruption, std::string(file) + ": " + std::string(what)};
  }
  static Error Io(std::string msg) { return {ErrorCode::kIo, std::move(msg)}; }
  static Error Unavailable(std::string msg) { return {ErrorCode::kUnavailable, std::move(msg)}; }
  static Error PermissionDenied(std::string msg) { return {ErrorCode::kPermissionDenied, std::move(msg)}; }
  static Error ResourceExhausted(std::string msg) { return {ErrorCode::kResourceExhausted, std::move(msg)}; }
  static Error Conflict(std::string msg) { return {ErrorCode::kConflict, std::move(msg)}; }
  static Error Timeout(std::string msg) { return {ErrorCode::kTimeout, std::move(msg)}; }
  static Error Internal(std::string msg) { return {ErrorCode::kInternal, std::move(msg)}; }

  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // The input element at fault in the caller's own terms ("messages[3]",
  // "tools[0].function.parameters"), when known; empty otherwise. Callers
  // read this, never the message: messages are for people.
  const std::string& field() const { return field_; }
  Error WithField(std::string field) && {
    field_ = std::move(field);
    return std::move(*this);
  }
  // "corruption: model/x.safetensors: tensor 'a': ..."
  std::string ToString() const;

  // Prefixes context, keeping the category: e.WithContext("loading model /m").
  Error WithContext(std::string_view context) const {
    Error e(code_, std::string(context) + ": " + message_);
    e.field_ = field_;
    return e;
  }

 private:
  ErrorCode code_;
  std::string message_;
  std::string field_;
};

template <class T>
using Result = std::expected<T, Error>;
using Status = Result<void>;

inline std::unexpected<Error> Fail(Error e) { return std::unexpected<Error>(std::move(e)); }
inline Status Ok() { return {}; }

}  // namespace moeserve

// Propagates an error from an expression returning Result/Status.
#define MOE_TRY(expr)                                              \
  do {                                                             \
    auto moe_try_status_ = (expr);                                 \
    if (!moe_try_status_) return ::moeserve::Fail(std::move(moe_try_status_).error()); \
  } while (0)

// MOE_ASSIGN_OR_RETURN(auto x, Compute()) binds the value or returns the error.
#define MOE_CONCAT_INNER_(a, b) a##b
#define MOE_CONCAT_(a, b) MOE_CONCAT_INNER_(a, b)
#define MOE_ASSIGN_OR_RETURN(lhs, expr) MOE_ASSIGN_OR_RETURN_IMPL_(MOE_CONCAT_(moe_r_, __LINE__), lhs, expr)
#define MOE_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr)          \
  auto tmp = (expr);                                        \
  if (!tmp) return ::moeserve::Fail(std::move(tmp).error()); \
  lhs = std::move(*tmp)
