// Where the forward passes' scratch memory comes from between passes.
#pragma once

namespace moeserve::engine {

// Keeps freed scratch in the process heap instead of handing it back to the
// kernel. A forward pass allocates its per-layer scratch (hidden rows, the
// experts' gathered inputs and gate/up outputs, attention blocks) and frees
// it at the end of the layer; glibc serves blocks above its mmap threshold
// with fresh mappings and returns heap tops above its trim threshold, so
// every layer of every pass paid page faults on megabytes of new pages (and
// unmappings) again. A 2,048-row prefill of the `small` preset spent about
// two thirds of its expert time so, against passes of 512 rows, whose
// smaller blocks the dynamic threshold kept in the heap. Sets the mmap
// threshold to glibc's largest (32 MiB: larger blocks are still mapped and
// unmapped; none of the scratch here is that large) and stops trimming.
// Both at once: setting either switches off glibc's dynamic adjustment of
// the other, and either alone ran slower than neither (measured).
// Called by the model loaders; once per process, from any thread.
void KeepScratchInHeap();

}  // namespace moeserve::engine
