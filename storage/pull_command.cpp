// `moe-daemon pull URI --revision R --cache DIR [options]`: the weight puller
// on its own, e.g. in an init container. Prints the model directory on success.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

#include "moeserve/common/log.hpp"
#include "moeserve/storage/commands.hpp"
#include "moeserve/storage/weight_puller.hpp"
#include "cli_values.hpp"

namespace moeserve::storage {
namespace {

constexpr const char* kUsage =
    "usage: moe-daemon pull URI --revision R --cache DIR [options]\n"
    "  URI                      s3://bucket/prefix/, https://host/path/, http://..., file:///dir\n"
    "  --revision R             revision label; with URI, the cache key\n"
    "  --cache DIR              node-local cache directory\n"
    "  --endpoint URL           S3-compatible endpoint (default: AWS)\n"
    "  --region R               S3 region (default: AWS_REGION, AWS_DEFAULT_REGION, us-east-1)\n"
    "  --path-style | --virtual-host   S3 addressing (default: path style with --endpoint, else virtual host)\n"
    "  --credentials-file F     shared-credentials INI file (default: AWS_* variables, ~/.aws/credentials)\n"
    "  --ca-bundle F            PEM certificates to trust for https (default: the system's)\n"
    "  --connections N          parallel ranged downloads (default 8)\n"
    "  --part-size SIZE         bytes per ranged GET, e.g. 8MiB (default 8MiB)\n"
    "  --cache-size-limit SIZE  evict least-recently-used unused models above this (default: no limit)\n"
    "  --max-attempts N         consecutive failed attempts per part before giving up (default 8)\n"
    "  --retry-base-ms N        first backoff step (default 200)\n"
    "  --stall-timeout S        abandon a transfer that moves no byte for S seconds (default 30)\n"
    "  --no-verify              allow a source without manifest.json (no sha256 checks; cached apart\n"
    "                           from verified pulls, which never reuse it)\n"
    "  --reverify               hash a cached verified model again before reusing it\n"
    "  --quiet                  no progress output\n";

struct PullArgs {
  std::string uri;
  CacheConfig cache;
  PullOptions options;
  bool quiet = false;
};

Result<PullArgs> ParseArgs(int argc, char** argv) {
  PullArgs a;
  bool have_revision = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> Result<std::string> {
      if (i + 1 >= argc) return Fail(Error::InvalidArgument(arg + " needs a value"));
      return std::string(argv[++i]);
    };
    MOE_ASSIGN_OR_RETURN(bool shared_flag, ApplyObjectStoreFlag(arg, value, a.options.source, a.options.retry));
    if (shared_flag) continue;
    if (arg == "--revision") {
      MOE_ASSIGN_OR_RETURN(a.options.revision, value());
      have_revision = true;
    } else if (arg == "--cache") {
      MOE_ASSIGN_OR_RETURN(a.cache.root, value());
    } else if (arg == "--connections") {
      MOE_ASSIGN_OR_RETURN(std::string v, value());
      MOE_ASSIGN_OR_RETURN(long n, ParseInt(arg, v, 1));
      a.options.connections = static_cast<int>(n);
    } else if (arg == "--part-size") {
      MOE_ASSIGN_OR_RETURN(std::string v, value());
      MOE_ASSIGN_OR_RETURN(a.options.part_size, ParseSize(arg, v));
      if (a.options.part_size == 0) return Fail(Error::InvalidArgument("--part-size must be positive"));
    } else if (arg == "--cache-size-limit") {
      MOE_ASSIGN_OR_RETURN(std::string v, value());
      MOE_ASSIGN_OR_RETURN(a.cache.size_limit_bytes, ParseSize(arg, v));
    } else if (arg == "--stall-timeout") {
      MOE_ASSIGN_OR_RETURN(std::string v, value());
      MOE_ASSIGN_OR_RETURN(long n, ParseInt(arg, v, 1));
      a.options.source.stall_timeout = std::chrono::seconds(n);
    } else if (arg == "--no-verify") {
      a.options.verify = false;
    } else if (arg == "--reverify") {
      a.options.reverify_cached = true;
    } else if (arg == "--quiet") {
      a.quiet = true;
    } else if (arg == "-h" || arg == "--help") {
      return Fail(Error::InvalidArgument("help"));
    } else if (!arg.empty() && arg[0] == '-') {
      return Fail(Error::InvalidArgument("unknown flag " + arg));
    } else if (a.uri.empty()) {
      a.uri = arg;
    } else {
      return Fail(Error::InvalidArgument("unexpected argument '" + arg + "'"));
    }
  }
  if (a.uri.empty()) return Fail(Error::InvalidArgument("missing URI"));
  if (!have_revision) return Fail(Error::InvalidArgument("missing --revision"));
  if (a.cache.root.empty()) return Fail(Error::InvalidArgument("missing --cache"));
  return a;
}

void DrawBar(const PullProgress& p) {
  constexpr int kWidth = 30;
  int filled = p.bytes_total ? static_cast<int>(kWidth * p.bytes_done / p.bytes_total) : 0;
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(kWidth, ' ');
  std::string eta = p.eta_s >= 0 ? ", ETA " + std::to_string(static_cast<long>(p.eta_s + 0.5)) + "s" : "";
  std::printf("\r[%s] %s / %s  %s/s%s   ", bar.c_str(), FormatBytes(static_cast<double>(p.bytes_done)).c_str(),
              FormatBytes(static_cast<double>(p.bytes_total)).c_str(), FormatBytes(p.rate_bytes_per_s).c_str(),
              eta.c_str());
  std::fflush(stdout);
}

}  // namespace

int RunPullCommand(int argc, char** argv) {
  auto args = ParseArgs(argc, argv);
  if (!args) {
    if (args.error().message() != "help") std::fprintf(stderr, "moe-daemon pull: %s\n", args.error().message().c_str());
    std::fputs(kUsage, stderr);
    return args.error().message() == "help" ? 0 : 2;
  }
  bool tty = ::isatty(STDOUT_FILENO) != 0;
  if (args->quiet) args->options.log_progress = false;
  if (tty && !args->quiet) {
    args->options.log_progress = false;  // the bar replaces log lines
    args->options.on_progress = DrawBar;
  }
  WeightPuller puller(args->cache);
  auto pulled = puller.Pull(args->uri, args->options);
  if (tty && !args->quiet) std::printf("\n");
  if (!pulled) {
    std::fprintf(stderr, "moe-daemon pull: %s\n", pulled.error().ToString().c_str());
    return 1;
  }
  const PullStats& s = pulled->stats;
  if (!args->quiet) {
    if (s.reused) {
      log::Info("pull " + args->uri + ": already in the cache");
    } else {
      double rate = s.seconds > 0 ? static_cast<double>(s.bytes_fetched) / s.seconds : 0;
      char secs[32];
      std::snprintf(secs, sizeof(secs), "%.2f", s.seconds);
      log::Info("pull " + args->uri + ": " + FormatBytes(static_cast<double>(s.bytes_total)) +
                (args->options.verify ? " verified" : " NOT verified") + "; fetched " +
                FormatBytes(static_cast<double>(s.bytes_fetched)) + " in " + secs + " s (" +
                FormatBytes(rate) + "/s), resumed " + FormatBytes(static_cast<double>(s.bytes_resumed)));
    }
  }
  std::printf("%s\n", pulled->dir.c_str());
  return 0;
}

}  // namespace moeserve::storage
