# Sanitizer and fuzzing builds. Both are opt-in and change nothing when off,
# so the default build (what CI runs) is untouched.
#
# MOESERVE_SANITIZE=address  AddressSanitizer + UndefinedBehaviorSanitizer
# MOESERVE_SANITIZE=thread   ThreadSanitizer
#   Everything we compile is instrumented (Boost.Asio and nlohmann are header
#   only, so they are too); shared libraries from Debian (cpprestsdk, libcurl,
#   OpenSSL, yaml-cpp, sqlite) are not: tests/sanitizers/ holds the
#   suppressions for what they do behind the sanitizers' backs.
#   ./scripts/test --sanitize builds these in build-asan and build-tsan.
#
# MOESERVE_FUZZ=ON  libFuzzer targets under tests/fuzz (clang only). The
#   libraries get -fsanitize=fuzzer-no-link so the fuzzer sees coverage inside
#   them, not only in the target's own file. ./scripts/fuzz builds this.
set(MOESERVE_SANITIZE "" CACHE STRING "Sanitizer build: empty, address (ASan+UBSan) or thread (TSan)")
set_property(CACHE MOESERVE_SANITIZE PROPERTY STRINGS "" address thread)
option(MOESERVE_FUZZ "Build the libFuzzer targets in tests/fuzz (clang)" OFF)

# UBSan findings abort, so a test that triggers one fails instead of printing
# a line nobody reads. Frame pointers keep the reports' stacks cheap and whole.
# vptr alone stays recoverable: UBSan can only suppress recoverable checks,
# and tests/sanitizers/ubsan.supp suppresses its false reports in cpprestsdk's
# headers; UBSAN_OPTIONS=halt_on_error=1 still stops at any other vptr report.
set(_moeserve_san_common -fno-omit-frame-pointer -fno-sanitize-recover=all -fsanitize-recover=vptr)

if(MOESERVE_SANITIZE STREQUAL "address")
  add_compile_options(-fsanitize=address,undefined ${_moeserve_san_common})
  add_link_options(-fsanitize=address,undefined)
elseif(MOESERVE_SANITIZE STREQUAL "thread")
  add_compile_options(-fsanitize=thread ${_moeserve_san_common})
  add_link_options(-fsanitize=thread)
elseif(NOT MOESERVE_SANITIZE STREQUAL "")
  message(FATAL_ERROR "MOESERVE_SANITIZE must be empty, 'address' or 'thread', not '${MOESERVE_SANITIZE}'")
endif()

if(MOESERVE_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "MOESERVE_FUZZ needs clang (libFuzzer): configure with CMAKE_CXX_COMPILER=clang++-19")
  endif()
  if(NOT MOESERVE_SANITIZE STREQUAL "")
    message(FATAL_ERROR "MOESERVE_FUZZ brings its own sanitizers; leave MOESERVE_SANITIZE empty")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined ${_moeserve_san_common})
  add_link_options(-fsanitize=address,undefined)
endif()
