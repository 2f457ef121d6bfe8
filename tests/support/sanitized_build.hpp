// Whether this test binary was built with AddressSanitizer or
// ThreadSanitizer (./scripts/test --sanitize). Their allocators replace
// malloc's accounting (mallinfo2 reads zero) and multiply resident memory
// (shadow memory, redzones, quarantine), so checks of memory bounds hold only
// in the normal build; everything else a test checks runs in both.
#pragma once

namespace moeserve::test_support {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitizedBuild = true;
#else
inline constexpr bool kSanitizedBuild = false;
#endif

}  // namespace moeserve::test_support
