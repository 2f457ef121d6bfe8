// Writes the image_decode fuzz target's seed corpus into the directory given:
// small PNG, JPEG and WebP files from the real encoders in every variant the
// decoder handles, each also cut short, and headers declaring huge sizes.
// Generated rather than committed so no binary files live in the tree. Each
// seed starts with the pixel-limit byte the target reads first (24: a limit
// of 2^24 pixels, the default).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../support/test_images.hpp"

namespace ts = moeserve::test_support;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);
  std::vector<std::pair<std::string, std::string>> seeds;
  const auto rgb = ts::Gradient(8, 8);
  seeds.emplace_back("png_rgb", ts::EncodePng(8, 8, rgb));
  seeds.emplace_back("png_interlaced", ts::EncodePng(8, 8, rgb, true));
  seeds.emplace_back("png_gray1", ts::EncodePngRaw(8, 2, std::vector<uint8_t>{0xA5, 0x5A}, 1,
                                                   ts::PngOptions{.color_type = PNG_COLOR_TYPE_GRAY, .bit_depth = 1}));
  seeds.emplace_back("png_rgb16", ts::EncodePngRaw(2, 1, std::vector<uint8_t>(12, 0x81), 12,
                                                   ts::PngOptions{.bit_depth = 16}));
  seeds.emplace_back("png_palette", ts::EncodePngRaw(2, 1, std::vector<uint8_t>{0, 1}, 2,
                                                     ts::PngOptions{.color_type = PNG_COLOR_TYPE_PALETTE,
                                                                    .palette_transparency = true},
                                                     {{1, 2, 3}, {4, 5, 6}}));
  seeds.emplace_back("png_huge", ts::WithPngSize(ts::EncodePng(8, 8, rgb), 100000, 100000));
  seeds.emplace_back("jpeg_rgb", ts::EncodeJpeg(8, 8, rgb));
  seeds.emplace_back("jpeg_gray", ts::EncodeJpeg(8, 8, std::vector<uint8_t>(64, 90),
                                                 ts::JpegOptions{.in_color_space = JCS_GRAYSCALE}));
  seeds.emplace_back("jpeg_cmyk", ts::EncodeJpeg(8, 8, std::vector<uint8_t>(256, 140),
                                                 ts::JpegOptions{.in_color_space = JCS_CMYK}));
  seeds.emplace_back("jpeg_progressive", ts::EncodeJpeg(8, 8, rgb, ts::JpegOptions{.progressive = true}));
  seeds.emplace_back("jpeg_huge", ts::WithJpegSize(ts::EncodeJpeg(8, 8, rgb), 65000, 65000));
  seeds.emplace_back("webp", ts::EncodeWebpLossless(8, 8, rgb));
  seeds.emplace_back("webp_huge", ts::WithLargestWebpSize(ts::EncodeWebpLossless(8, 8, rgb)));
  const size_t whole = seeds.size();
  for (size_t i = 0; i < whole; ++i) {
    const auto& [name, bytes] = seeds[i];
    seeds.emplace_back(name + "_cut_half", bytes.substr(0, bytes.size() / 2));
    seeds.emplace_back(name + "_cut_header", bytes.substr(0, 20));
  }
  for (const auto& [name, bytes] : seeds) {
    std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
    out.put(24);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) {
      std::fprintf(stderr, "cannot write %s\n", (dir / name).c_str());
      return 1;
    }
  }
  std::printf("%zu seeds in %s\n", seeds.size(), dir.c_str());
  return 0;
}
