// Shared pieces of the moectl tests: running the moectl binary of this build
// with arguments and environment, its stdout and stderr apart, and reading
// a PNG back with cairo.
#pragma once

#include <gtest/gtest.h>
#include <spawn.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cairo.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

extern char** environ;

namespace moeserve::moectl::testing {

inline std::string MoectlBinary() {
  const char* d = std::getenv("MOESERVE_BINARY_DIR");
  return std::string(d ? d : ".") + "/moectl/moectl";
}

inline std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/moectl_" + std::to_string(::getpid()) + "_" + name;
}

inline std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Run {
  int rc = -1;
  std::string out, err;
};

// Runs moectl with `args`; `env` entries replace (or, with an empty value,
// remove) variables of this process's environment.
inline Run Moectl(const std::vector<std::string>& args, const std::map<std::string, std::string>& env = {}) {
  static int counter = 0;
  const std::string base = TempPath("run" + std::to_string(++counter));
  const std::string out_path = base + ".out", err_path = base + ".err";
  std::vector<std::string> argv_s = {MoectlBinary()};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_s;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    if (!env.contains(kv.substr(0, kv.find('=')))) env_s.push_back(kv);
  }
  for (const auto& [k, v] : env)
    if (!v.empty()) env_s.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&fa, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  pid_t pid = -1;
  Run r;
  if (posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), envp.data()) != 0) {
    posix_spawn_file_actions_destroy(&fa);
    r.err = "cannot start " + argv_s[0];
    return r;
  }
  posix_spawn_file_actions_destroy(&fa);
  int status = 0;
  waitpid(pid, &status, 0);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = ReadAll(out_path);
  r.err = ReadAll(err_path);
  return r;
}

// A decoded PNG: width, height, and 0xRRGGBB per pixel.
struct Image {
  int width = 0, height = 0;
  std::vector<uint32_t> pixels;
  uint32_t At(int x, int y) const { return pixels[static_cast<size_t>(y) * width + x]; }
};

inline bool ReadPng(const std::string& path, Image* image, std::string* error) {
  cairo_surface_t* s = cairo_image_surface_create_from_png(path.c_str());
  if (cairo_surface_status(s) != CAIRO_STATUS_SUCCESS) {
    *error = cairo_status_to_string(cairo_surface_status(s));
    cairo_surface_destroy(s);
    return false;
  }
  cairo_surface_flush(s);
  image->width = cairo_image_surface_get_width(s);
  image->height = cairo_image_surface_get_height(s);
  const int stride = cairo_image_surface_get_stride(s);
  const unsigned char* data = cairo_image_surface_get_data(s);
  image->pixels.resize(static_cast<size_t>(image->width) * image->height);
  for (int y = 0; y < image->height; ++y) {
    const auto* row = reinterpret_cast<const uint32_t*>(data + static_cast<size_t>(y) * stride);
    for (int x = 0; x < image->width; ++x) image->pixels[static_cast<size_t>(y) * image->width + x] = row[x] & 0xffffff;
  }
  cairo_surface_destroy(s);
  return true;
}

inline uint32_t Rgb(const unsigned char (&c)[3]) { return (uint32_t{c[0]} << 16) | (uint32_t{c[1]} << 8) | c[2]; }

// Pixels of exactly `color` in row y between columns x0 and x1 (exclusive).
inline int CountInRow(const Image& im, int y, int x0, int x1, uint32_t color) {
  int n = 0;
  for (int x = x0; x < x1; ++x) n += im.At(x, y) == color;
  return n;
}

}  // namespace moeserve::moectl::testing
