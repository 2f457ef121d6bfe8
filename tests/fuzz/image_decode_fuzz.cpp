// DecodeImage and ParseImageUrl over arbitrary bytes: headers, truncated
// files, huge declared dimensions, corrupt entropy data. Input: one byte
// choosing the pixel limit (2^(b%25), so small inputs reach it), then the
// file. Checked:
//   - nothing aborts, leaks or reads out of bounds (libpng and libjpeg errors
//     come back as values);
//   - a decoded image is within the limit and holds exactly width*height*3
//     bytes; a refusal names the image;
//   - the same bytes as a data: URL are accepted only if their magic matches.
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_check.hpp"
#include "moeserve/common/base64.hpp"
#include "moeserve/daemon/image/image_decode.hpp"

using namespace moeserve;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  ImageLimits limits;
  limits.max_pixels = uint64_t{1} << (data[0] % 25);
  limits.max_bytes = 1 << 20;
  const std::string_view file(reinterpret_cast<const char*>(data + 1), size - 1);

  auto img = DecodeImage(file, limits, 7);
  if (img) {
    FUZZ_CHECK(uint64_t{img->width} * img->height <= limits.max_pixels, "decoded past image_max_pixels");
    FUZZ_CHECK(img->width > 0 && img->height > 0, "decoded an empty image");
    FUZZ_CHECK(img->rgb.size() == size_t{img->width} * img->height * 3, "pixel buffer size is wrong");
  } else {
    FUZZ_CHECK(img.error().message().starts_with("image 7: "), img.error().message());
  }

  ImageUrlPolicy policy;
  policy.limits = limits;
  auto src = ParseImageUrl("data:image/png;base64," + Base64Encode(file), policy, 0);
  if (src) {
    FUZZ_CHECK(src->format == ImageFormat::kPng && src->bytes == file, "data: URL changed the bytes");
    FUZZ_CHECK(SniffImageFormat(file, 0).value_or(ImageFormat::kJpeg) == ImageFormat::kPng,
               "data: URL accepted bytes whose magic is not PNG");
  }
  return 0;
}
