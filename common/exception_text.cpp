#include "moeserve/common/exception_text.hpp"

namespace moeserve {

std::string ExceptionText(std::exception_ptr e) {
  if (!e) return "no exception";
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

}  // namespace moeserve
