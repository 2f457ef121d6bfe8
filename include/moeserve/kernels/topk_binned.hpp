// The top k of a block of scores found through a histogram of their values:
// the DSA indexer's selection when k is a sizeable share of the scores
// (prefill: 2,048 of a few thousand to a few hundred thousand cached keys).
//
// Why: TopKIndicesRef (a radix select on the floats' bits) reads every score
// four times, and TopKIndicesStreamed's lower bound (the k-th of 2k group
// maxima) costs an nth_element over n/2 maxima when n is only a few times k;
// at prefill's 4K-16K keys a query either cost 60-170 us against 1-2 us
// to score the keys with a small indexer. Here the scores go into 2,048 bins
// equally wide between their minimum and maximum (one vector pass for the
// range, one for the bins, a scalar count), the bin holding the k-th best is
// found from the top, every score above that bin is in, and only the scores
// in that bin are ordered (nth_element over a few dozen entries on typical
// scores). The bin of a score is a monotone function of it (a subtraction,
// a multiplication and a truncation, each monotone in IEEE arithmetic), so
// the bins never reorder scores, equal scores (-0 and +0 too) share a bin,
// and the selection is TopKIndicesRef's bit for bit: score descending, ties
// to the lower position.
//
// Thread safety: scratch is thread_local; no shared state.
#pragma once

namespace moeserve::kernels {

// The best k of scores[0, n) (1 <= k < n; scores not NaN), positions
// ascending in out. Returns false, writing nothing, when a score is
// infinite or the scores' range does not give finite bins (another
// selection must then be used).
bool TopKIndicesBinned(const float* scores, int n, int k, int* out);

// The k-th largest of scores[0, n) (1 <= k <= n; not NaN) into *kth: a lower
// bound that at least k of the scores reach. False, *kth unchanged, as
// TopKIndicesBinned.
bool KthLargestBinned(const float* scores, int n, int k, float* kth);

}  // namespace moeserve::kernels
