// PNG, JPEG and WebP decoding behind hard limits. libpng and libjpeg report
// fatal errors by longjmp; each decode runs in a function whose locals are plain C
// values (no destructors for longjmp to skip), and every buffer it allocates
// is owned by a context the C++ caller frees.
#include <png.h>
#include <jpeglib.h>
#include <webp/decode.h>

#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "moeserve/daemon/image/image_decode.hpp"

namespace moeserve {
namespace {

constexpr size_t kMessageSize = 200;
// A progressive JPEG may hold any number of scans, each a pass over the whole
// coefficient buffer: a small file could cost minutes of CPU. Real encoders
// write about ten.
constexpr int kMaxJpegScans = 100;

std::string Prefix(size_t index) { return "image " + std::to_string(index) + ": "; }

std::unexpected<Error> PixelsOverLimit(size_t index, uint64_t width, uint64_t height, uint64_t max_pixels) {
  return Fail(Error::InvalidArgument(Prefix(index) + std::to_string(width) + "x" + std::to_string(height) +
                                " pixels is over the limit of " + std::to_string(max_pixels) +
                                " (image_max_pixels)"));
}

// ---- PNG ----

struct PngContext {
  const uint8_t* data = nullptr;
  size_t size = 0;
  size_t pos = 0;
  uint64_t max_pixels = 0;
  uint32_t width = 0;
  uint32_t height = 0;
  bool over_limit = false;
  uint8_t* pixels = nullptr;      // malloc'd, freed by the caller
  png_bytep* rows = nullptr;      // malloc'd, freed by the caller
  char message[kMessageSize] = {};
};

void PngRead(png_structp png, png_bytep out, size_t n) {
  auto* ctx = static_cast<PngContext*>(png_get_io_ptr(png));
  if (n > ctx->size - ctx->pos) png_error(png, "file ends before the image does");
  std::memcpy(out, ctx->data + ctx->pos, n);
  ctx->pos += n;
}

void PngFail(png_structp png, png_const_charp msg) {
  auto* ctx = static_cast<PngContext*>(png_get_error_ptr(png));
  std::snprintf(ctx->message, sizeof ctx->message, "%s", msg);
  png_longjmp(png, 1);
}

// Benign warnings (an unknown chunk, an sRGB profile libpng dislikes) do not
// make an image unreadable.
void PngWarn(png_structp, png_const_charp) {}

// Returns true on success. Only C values live in this frame.
bool PngDecodeInto(png_structp png, png_infop info, PngContext* ctx) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_set_read_fn(png, ctx, PngRead);
  // libpng's own default (1000000 per side) would refuse large headers with
  // its own words; lifting it lets the check below name image_max_pixels.
  png_set_user_limits(png, 0x7fffffff, 0x7fffffff);
  png_read_info(png, info);
  ctx->width = png_get_image_width(png, info);
  ctx->height = png_get_image_height(png, info);
  if (static_cast<uint64_t>(ctx->width) * ctx->height > ctx->max_pixels) {
    ctx->over_limit = true;
    return false;
  }
  const int color = png_get_color_type(png, info);
  const int depth = png_get_bit_depth(png, info);
  if (depth == 16) png_set_strip_16(png);
  if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (png_get_valid(png, info, PNG_INFO_tRNS)) png_set_tRNS_to_alpha(png);
  if (color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
  png_set_strip_alpha(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  if (png_get_rowbytes(png, info) != static_cast<size_t>(ctx->width) * 3) {
    std::snprintf(ctx->message, sizeof ctx->message, "unexpected row layout after conversion to RGB");
    return false;
  }
  const size_t row_bytes = static_cast<size_t>(ctx->width) * 3;
  ctx->pixels = static_cast<uint8_t*>(std::malloc(row_bytes * ctx->height));
  ctx->rows = static_cast<png_bytep*>(std::malloc(sizeof(png_bytep) * ctx->height));
  if (!ctx->pixels || !ctx->rows) {
    std::snprintf(ctx->message, sizeof ctx->message, "out of memory");
    return false;
  }
  for (uint32_t y = 0; y < ctx->height; ++y) ctx->rows[y] = ctx->pixels + y * row_bytes;
  png_read_image(png, ctx->rows);
  png_read_end(png, nullptr);
  return true;
}

Result<DecodedImage> DecodePng(std::string_view bytes, const ImageLimits& limits, size_t index) {
  PngContext ctx;
  ctx.data = reinterpret_cast<const uint8_t*>(bytes.data());
  ctx.size = bytes.size();
  ctx.max_pixels = limits.max_pixels;
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &ctx, PngFail, PngWarn);
  if (!png) return Fail(Error::Internal(Prefix(index) + "png_create_read_struct failed"));
  png_infop info = png_create_info_struct(png);
  const bool ok = info && PngDecodeInto(png, info, &ctx);
  png_destroy_read_struct(&png, info ? &info : nullptr, nullptr);
  std::free(ctx.rows);
  if (!ok) {
    std::free(ctx.pixels);
    if (ctx.over_limit) return PixelsOverLimit(index, ctx.width, ctx.height, limits.max_pixels);
    return Fail(Error::InvalidArgument(Prefix(index) + "not a readable PNG: " +
                                  (ctx.message[0] ? ctx.message : "info struct allocation failed")));
  }
  DecodedImage out;
  out.width = ctx.width;
  out.height = ctx.height;
  out.rgb.assign(ctx.pixels, ctx.pixels + static_cast<size_t>(ctx.width) * ctx.height * 3);
  std::free(ctx.pixels);
  return out;
}

// ---- JPEG ----

struct JpegError {
  jpeg_error_mgr mgr;  // first member: libjpeg hands back a jpeg_error_mgr*
  jmp_buf jump;
  char message[kMessageSize];
};

void JpegFail(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegError*>(cinfo->err);
  char text[JMSG_LENGTH_MAX];
  (*cinfo->err->format_message)(cinfo, text);
  std::snprintf(err->message, sizeof err->message, "%s", text);
  std::longjmp(err->jump, 1);
}

// libjpeg treats a truncated file or corrupt entropy data as a warning and
// fills the rest with gray; a request's image must be whole, so warnings are
// fatal here. Trace messages (level > 0) are ignored.
void JpegMessage(j_common_ptr cinfo, int level) {
  if (level < 0) JpegFail(cinfo);
}

void JpegProgress(j_common_ptr cinfo) {
  auto* d = reinterpret_cast<j_decompress_ptr>(cinfo);
  if (d->input_scan_number > kMaxJpegScans) {
    auto* err = reinterpret_cast<JpegError*>(cinfo->err);
    std::snprintf(err->message, sizeof err->message, "more than %d progressive scans", kMaxJpegScans);
    std::longjmp(err->jump, 1);
  }
}

struct JpegContext {
  jpeg_decompress_struct cinfo;
  JpegError err;
  jpeg_progress_mgr progress;
  uint64_t max_pixels = 0;
  uint32_t width = 0;
  uint32_t height = 0;
  bool over_limit = false;
  uint8_t* pixels = nullptr;  // malloc'd, freed by the caller
  uint8_t* cmyk_row = nullptr;  // malloc'd, freed by the caller (CMYK files only)
};

// libjpeg does not convert CMYK or YCCK to RGB; it hands back CMYK and the
// conversion is ours. Adobe's encoders (the usual source of CMYK JPEGs, which
// announce themselves with an APP14 marker) store the channels inverted.
void CmykRowToRgb(const uint8_t* cmyk, uint8_t* rgb, uint32_t width, bool inverted) {
  for (uint32_t x = 0; x < width; ++x, cmyk += 4, rgb += 3) {
    const unsigned k = inverted ? cmyk[3] : 255u - cmyk[3];
    for (int c = 0; c < 3; ++c) {
      const unsigned v = inverted ? cmyk[c] : 255u - cmyk[c];
      rgb[c] = static_cast<uint8_t>((v * k + 127) / 255);
    }
  }
}

bool JpegDecodeInto(JpegContext* ctx, const uint8_t* data, size_t size) {
  if (setjmp(ctx->err.jump)) return false;
  jpeg_mem_src(&ctx->cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&ctx->cinfo, TRUE);
  ctx->width = ctx->cinfo.image_width;
  ctx->height = ctx->cinfo.image_height;
  if (static_cast<uint64_t>(ctx->width) * ctx->height > ctx->max_pixels) {
    ctx->over_limit = true;
    return false;
  }
  const bool cmyk = ctx->cinfo.jpeg_color_space == JCS_CMYK || ctx->cinfo.jpeg_color_space == JCS_YCCK;
  ctx->cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  ctx->cinfo.progress = &ctx->progress;
  jpeg_start_decompress(&ctx->cinfo);
  if (ctx->cinfo.output_components != (cmyk ? 4 : 3) || ctx->cinfo.output_width != ctx->width ||
      ctx->cinfo.output_height != ctx->height) {
    std::snprintf(ctx->err.message, sizeof ctx->err.message, "unexpected output layout");
    return false;
  }
  const size_t row_bytes = static_cast<size_t>(ctx->width) * 3;
  ctx->pixels = static_cast<uint8_t*>(std::malloc(row_bytes * ctx->height));
  if (cmyk) ctx->cmyk_row = static_cast<uint8_t*>(std::malloc(static_cast<size_t>(ctx->width) * 4));
  if (!ctx->pixels || (cmyk && !ctx->cmyk_row)) {
    std::snprintf(ctx->err.message, sizeof ctx->err.message, "out of memory");
    return false;
  }
  while (ctx->cinfo.output_scanline < ctx->cinfo.output_height) {
    uint8_t* out = ctx->pixels + ctx->cinfo.output_scanline * row_bytes;
    JSAMPROW row = cmyk ? ctx->cmyk_row : out;
    jpeg_read_scanlines(&ctx->cinfo, &row, 1);
    if (cmyk) CmykRowToRgb(ctx->cmyk_row, out, ctx->width, ctx->cinfo.saw_Adobe_marker);
  }
  jpeg_finish_decompress(&ctx->cinfo);
  return true;
}

Result<DecodedImage> DecodeJpeg(std::string_view bytes, const ImageLimits& limits, size_t index) {
  auto ctx = std::make_unique<JpegContext>();
  std::memset(&ctx->cinfo, 0, sizeof ctx->cinfo);
  std::memset(&ctx->err, 0, sizeof ctx->err);
  std::memset(&ctx->progress, 0, sizeof ctx->progress);
  ctx->max_pixels = limits.max_pixels;
  ctx->cinfo.err = jpeg_std_error(&ctx->err.mgr);
  ctx->err.mgr.error_exit = JpegFail;
  ctx->err.mgr.emit_message = JpegMessage;
  ctx->progress.progress_monitor = JpegProgress;
  jpeg_create_decompress(&ctx->cinfo);
  const bool ok = JpegDecodeInto(ctx.get(), reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  jpeg_destroy_decompress(&ctx->cinfo);
  std::free(ctx->cmyk_row);
  if (!ok) {
    std::free(ctx->pixels);
    if (ctx->over_limit) return PixelsOverLimit(index, ctx->width, ctx->height, limits.max_pixels);
    return Fail(Error::InvalidArgument(Prefix(index) + "not a readable JPEG: " + ctx->err.message));
  }
  DecodedImage out;
  out.width = ctx->width;
  out.height = ctx->height;
  out.rgb.assign(ctx->pixels, ctx->pixels + static_cast<size_t>(ctx->width) * ctx->height * 3);
  std::free(ctx->pixels);
  return out;
}

// ---- WebP ----

// libwebp reports errors as return values. Animated files are refused: an
// image part is one picture.
Result<DecodedImage> DecodeWebp(std::string_view bytes, const ImageLimits& limits, size_t index) {
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  WebPBitstreamFeatures features;
  const VP8StatusCode status = WebPGetFeatures(data, bytes.size(), &features);
  if (status != VP8_STATUS_OK)
    return Fail(Error::InvalidArgument(Prefix(index) + "not a readable WebP: header status " + std::to_string(status)));
  if (features.width <= 0 || features.height <= 0)
    return Fail(Error::InvalidArgument(Prefix(index) + "not a readable WebP: empty image"));
  const uint64_t width = static_cast<uint64_t>(features.width), height = static_cast<uint64_t>(features.height);
  if (width * height > limits.max_pixels) return PixelsOverLimit(index, width, height, limits.max_pixels);
  if (features.has_animation) return Fail(Error::InvalidArgument(Prefix(index) + "animated WebP is not supported"));
  DecodedImage out;
  out.width = static_cast<uint32_t>(width);
  out.height = static_cast<uint32_t>(height);
  out.rgb.resize(width * height * 3);
  if (!WebPDecodeRGBInto(data, bytes.size(), out.rgb.data(), out.rgb.size(), static_cast<int>(width * 3)))
    return Fail(Error::InvalidArgument(Prefix(index) + "not a readable WebP: the image data is corrupt or cut short"));
  return out;
}

}  // namespace

std::string_view ImageFormatMediaType(ImageFormat format) {
  switch (format) {
    case ImageFormat::kPng: return "image/png";
    case ImageFormat::kJpeg: return "image/jpeg";
    case ImageFormat::kWebp: return "image/webp";
  }
  return "image/unknown";
}

Result<ImageFormat> SniffImageFormat(std::string_view bytes, size_t index) {
  static constexpr std::string_view kPngMagic("\x89PNG\r\n\x1a\n", 8);
  static constexpr std::string_view kJpegMagic("\xff\xd8\xff", 3);
  if (bytes.starts_with(kPngMagic)) return ImageFormat::kPng;
  if (bytes.starts_with(kJpegMagic)) return ImageFormat::kJpeg;
  if (bytes.size() >= 12 && bytes.substr(0, 4) == "RIFF" && bytes.substr(8, 4) == "WEBP") return ImageFormat::kWebp;
  return Fail(Error::InvalidArgument(Prefix(index) + "not a PNG, JPEG or WebP file (unrecognised leading bytes)"));
}

Result<DecodedImage> DecodeImage(std::string_view bytes, const ImageLimits& limits, size_t index) {
  if (bytes.size() > limits.max_bytes)
    return Fail(Error::InvalidArgument(Prefix(index) + std::to_string(bytes.size()) + " bytes is over the limit of " +
                                  std::to_string(limits.max_bytes) + " (image_max_bytes)"));
  auto format = SniffImageFormat(bytes, index);
  if (!format) return std::unexpected(format.error());
  switch (*format) {
    case ImageFormat::kPng: return DecodePng(bytes, limits, index);
    case ImageFormat::kJpeg: return DecodeJpeg(bytes, limits, index);
    case ImageFormat::kWebp: return DecodeWebp(bytes, limits, index);
  }
  return Fail(Error::Internal(Prefix(index) + "unknown image format"));
}

}  // namespace moeserve
