// The text of an exception caught with `catch (...)`, for errors and logs at
// the boundaries where exceptions from libraries are turned into values.
//
// Thread safety: a free function over its argument.
#pragma once

#include <exception>
#include <string>

namespace moeserve {

// what() of a std::exception; a fixed phrase for anything else.
std::string ExceptionText(std::exception_ptr e);

}  // namespace moeserve
