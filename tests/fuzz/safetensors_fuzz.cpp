// safetensors files in memory (SafetensorsFile::FromBytes, the parser that
// Open() runs over a mapping). safetensors.hpp guarantees that an accepted
// file's every tensor lies inside the file, overlaps no other and has exactly
// prod(shape) * sizeof(dtype) bytes; this checks it for every accepted input.
// ASan catches any read past the input (libFuzzer's copy is exactly `size`).
#include <algorithm>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "fuzz_check.hpp"
#include "moeserve/engine/safetensors.hpp"

using namespace moeserve;
using namespace moeserve::engine;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = SafetensorsFile::FromBytes("fuzz.safetensors", std::span<const uint8_t>(data, size));
  if (!file) {
    FUZZ_CHECK(!file.error().message().empty(), "a refusal says why");
    return 0;
  }
  std::vector<std::pair<const uint8_t*, const uint8_t*>> extents;
  for (const TensorView& t : (*file)->tensors()) {
    FUZZ_CHECK(t.data >= data && t.data + t.nbytes <= data + size, "tensor '" + t.name + "' leaves the file");
    for (int64_t dim : t.shape) FUZZ_CHECK(dim >= 0, "tensor '" + t.name + "' has shape " + t.ShapeString());
    FUZZ_CHECK(t.numel() >= 0, "tensor '" + t.name + "' has a negative element count");
    FUZZ_CHECK(t.nbytes == static_cast<size_t>(t.numel()) * DTypeSize(t.dtype),
               "tensor '" + t.name + "' has " + std::to_string(t.nbytes) + " bytes for shape " + t.ShapeString());
    FUZZ_CHECK((*file)->Find(t.name) == &t, "Find does not return tensor '" + t.name + "'");
    if (t.nbytes > 0) extents.emplace_back(t.data, t.data + t.nbytes);
  }
  std::sort(extents.begin(), extents.end());
  for (size_t i = 1; i < extents.size(); ++i)
    FUZZ_CHECK(extents[i - 1].second <= extents[i].first, "two tensors overlap");
  return 0;
}
