// <immintrin.h> for the kernels' x86 variants. GCC 12's AVX-512 headers start
// some intrinsics from an "undefined" vector and then warn, where those are
// inlined, that it may be used uninitialised: a known false positive, so the
// including file stops reporting it.
#pragma once

#if defined(__x86_64__)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>
#endif
