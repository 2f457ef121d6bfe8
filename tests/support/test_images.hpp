// Small images written with the real encoders (libpng, libjpeg-turbo,
// libwebp), in the variants a decoder must handle (gray, 16-bit, palette,
// interlaced, progressive, CMYK), and hostile rewrites of their headers that
// declare a huge size. Shared by the decoder's tests and the generator of the
// image_decode fuzz target's seeds, so no binary files live in the tree.
#pragma once

#include <png.h>
#include <jpeglib.h>
#include <webp/encode.h>
#include <zlib.h>

#include <csetjmp>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

namespace moeserve::test_support {

// A w x h RGB gradient whose every pixel differs from its neighbours.
inline std::vector<uint8_t> Gradient(uint32_t w, uint32_t h) {
  std::vector<uint8_t> rgb(static_cast<size_t>(w) * h * 3);
  for (uint32_t y = 0; y < h; ++y)
    for (uint32_t x = 0; x < w; ++x) {
      uint8_t* p = &rgb[(static_cast<size_t>(y) * w + x) * 3];
      p[0] = static_cast<uint8_t>(x * 17);
      p[1] = static_cast<uint8_t>(y * 29);
      p[2] = static_cast<uint8_t>((x + y) * 7 + 3);
    }
  return rgb;
}

inline void AppendPngBytes(png_structp png, png_bytep data, size_t n) {
  static_cast<std::string*>(png_get_io_ptr(png))->append(reinterpret_cast<const char*>(data), n);
}

struct PngOptions {
  int color_type = PNG_COLOR_TYPE_RGB;  // RGB, RGB_ALPHA, GRAY, GRAY_ALPHA or PALETTE
  int bit_depth = 8;                    // 1, 2, 4, 8 or 16 as the colour type allows
  bool interlace = false;               // Adam7
  bool palette_transparency = false;    // a tRNS chunk (PALETTE only)
};

// Writes `samples`: one row after another, each width * channels samples of
// bit_depth bits, big-endian for 16 bits, packed for depths under 8 (libpng's
// own row layout).
inline std::string EncodePngRaw(uint32_t w, uint32_t h, const std::vector<uint8_t>& rows, size_t row_bytes,
                                const PngOptions& o, const std::vector<png_color>& palette = {}) {
  std::string out;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    throw std::runtime_error("libpng failed to encode a test image");
  }
  png_set_write_fn(png, &out, AppendPngBytes, nullptr);
  png_set_IHDR(png, info, w, h, o.bit_depth, o.color_type, o.interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  if (!palette.empty()) png_set_PLTE(png, info, palette.data(), static_cast<int>(palette.size()));
  png_byte alpha[1] = {0};
  if (o.palette_transparency) png_set_tRNS(png, info, alpha, 1, nullptr);
  png_write_info(png, info);
  std::vector<png_bytep> row_ptrs(h);
  for (uint32_t y = 0; y < h; ++y) row_ptrs[y] = const_cast<png_bytep>(&rows[y * row_bytes]);
  png_write_image(png, row_ptrs.data());
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return out;
}

// An 8-bit RGB PNG of `rgb`.
inline std::string EncodePng(uint32_t w, uint32_t h, const std::vector<uint8_t>& rgb, bool interlace = false) {
  return EncodePngRaw(w, h, rgb, static_cast<size_t>(w) * 3, PngOptions{.interlace = interlace});
}

struct JpegOptions {
  int quality = 95;
  J_COLOR_SPACE in_color_space = JCS_RGB;  // JCS_RGB (3 samples), JCS_GRAYSCALE (1) or JCS_CMYK (4)
  bool progressive = false;                // libjpeg's simple progression (about ten scans)
  // One scan per AC coefficient per component: 190 scans, a valid file that
  // costs a full pass over the image per scan.
  bool one_scan_per_coefficient = false;
};

// `samples`: w * h * components bytes for in_color_space.
inline std::string EncodeJpeg(uint32_t w, uint32_t h, const std::vector<uint8_t>& samples,
                              const JpegOptions& o = {}) {
  jpeg_compress_struct cinfo;
  jpeg_error_mgr err;
  cinfo.err = jpeg_std_error(&err);
  jpeg_create_compress(&cinfo);
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &buf, &size);
  cinfo.image_width = w;
  cinfo.image_height = h;
  cinfo.input_components = o.in_color_space == JCS_GRAYSCALE ? 1 : o.in_color_space == JCS_CMYK ? 4 : 3;
  cinfo.in_color_space = o.in_color_space;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, o.quality, TRUE);
  // No chroma subsampling: sharp colour edges then survive within a few levels.
  for (int c = 0; c < cinfo.num_components; ++c) cinfo.comp_info[c].h_samp_factor = cinfo.comp_info[c].v_samp_factor = 1;
  if (o.progressive) jpeg_simple_progression(&cinfo);
  std::vector<jpeg_scan_info> scans;
  if (o.one_scan_per_coefficient) {
    scans.push_back({cinfo.num_components, {0, 1, 2, 3}, 0, 0, 0, 0});
    for (int c = 0; c < cinfo.num_components; ++c)
      for (int k = 1; k < 64; ++k) scans.push_back({1, {c, 0, 0, 0}, k, k, 0, 0});
    cinfo.scan_info = scans.data();
    cinfo.num_scans = static_cast<int>(scans.size());
  }
  jpeg_start_compress(&cinfo, TRUE);
  const size_t row_bytes = static_cast<size_t>(w) * cinfo.input_components;
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<JSAMPROW>(&samples[cinfo.next_scanline * row_bytes]);
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::string out(reinterpret_cast<const char*>(buf), size);
  std::free(buf);
  return out;
}

// A lossless WebP of `rgb`.
inline std::string EncodeWebpLossless(uint32_t w, uint32_t h, const std::vector<uint8_t>& rgb) {
  uint8_t* buf = nullptr;
  const size_t size = WebPEncodeLosslessRGB(rgb.data(), static_cast<int>(w), static_cast<int>(h),
                                            static_cast<int>(w * 3), &buf);
  if (size == 0) throw std::runtime_error("libwebp failed to encode a test image");
  std::string out(reinterpret_cast<const char*>(buf), size);
  WebPFree(buf);
  return out;
}

// Rewrites a PNG's IHDR width and height and fixes the chunk's CRC, so only
// the declared size is hostile.
inline std::string WithPngSize(std::string png, uint32_t w, uint32_t h) {
  auto put32 = [&](size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) png[at + i] = static_cast<char>(v >> (24 - 8 * i));
  };
  put32(16, w);
  put32(20, h);
  put32(29, static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(png.data() + 12), 17)));
  return png;
}

// Rewrites a JPEG's first SOF0/SOF2 frame header to declare w x h.
inline std::string WithJpegSize(std::string jpeg, uint16_t w, uint16_t h) {
  for (size_t i = 2; i + 9 < jpeg.size(); ++i) {
    const auto marker = static_cast<uint8_t>(jpeg[i + 1]);
    if (static_cast<uint8_t>(jpeg[i]) == 0xFF && (marker == 0xC0 || marker == 0xC2)) {
      jpeg[i + 5] = static_cast<char>(h >> 8);
      jpeg[i + 6] = static_cast<char>(h);
      jpeg[i + 7] = static_cast<char>(w >> 8);
      jpeg[i + 8] = static_cast<char>(w);
      return jpeg;
    }
  }
  throw std::runtime_error("no SOF marker in the test JPEG");
}

// Rewrites a lossless WebP's VP8L header to declare 16384 x 16384, the
// format's largest size (268 million pixels).
inline std::string WithLargestWebpSize(std::string webp) {
  if (webp.size() < 25 || webp.substr(12, 4) != "VP8L") throw std::runtime_error("not a simple lossless WebP");
  // Byte 20 is the VP8L signature; then 14 bits width-1, 14 bits height-1.
  webp[21] = webp[22] = webp[23] = static_cast<char>(0xFF);
  webp[24] = static_cast<char>((static_cast<uint8_t>(webp[24]) & 0xF0) | 0x0F);
  return webp;
}

}  // namespace moeserve::test_support
