// `moe-daemon publish DIR URI [options]`: writes manifest.json for a model
// directory and uploads the directory to s3://bucket/prefix/ or file:///dir,
// the manifest last, so that `moe-daemon pull URI` can fetch and verify it.
// Prints the URI and the manifest's sha256 (a revision for the MoEDeployment).
#include <cstdio>
#include <string>

#include "cli_values.hpp"
#include "moeserve/common/log.hpp"
#include "moeserve/storage/commands.hpp"
#include "moeserve/storage/model_publisher.hpp"
#include "moeserve/storage/pull_status.hpp"

namespace moeserve::storage {
namespace {


constexpr const char* kUsage =
    "usage: moe-daemon publish DIR URI [options]\n"
    "  DIR                      the model directory (e.g. a downloaded Hugging Face model)\n"
    "  URI                      s3://bucket/prefix/ or file:///dir\n"
    "  --endpoint URL           S3-compatible endpoint (default: AWS)\n"
    "  --region R               S3 region (default: AWS_REGION, AWS_DEFAULT_REGION, us-east-1)\n"
    "  --path-style | --virtual-host   S3 addressing (default: path style with --endpoint, else virtual host)\n"
    "  --credentials-file F     shared-credentials INI file (default: AWS_* variables, ~/.aws/credentials)\n"
    "  --ca-bundle F            PEM certificates to trust for https (default: the system's)\n"
    "  --multipart-threshold SIZE  files larger than this go up in parts (default 5GiB, S3's single-PUT limit)\n"
    "  --part-size SIZE         bytes per part (default 64MiB; at least 5MiB, raised to stay within 10,000 parts)\n"
    "  --state-dir DIR          where interrupted uploads are remembered (default ~/.local/state/moeserve/publish)\n"
    "  --follow-symlinks        publish what symlinks leaving DIR point at (a Hugging Face cache snapshot)\n"
    "  --no-local-manifest      do not leave manifest.json in DIR\n"
    "  --max-attempts N         consecutive failed attempts per request before giving up (default 8)\n"
    "  --retry-base-ms N        first backoff step (default 200)\n"
    "  --quiet                  no progress output\n";

struct PublishArgs {
  std::string dir;
  std::string uri;
  PublishOptions options;
};

Result<PublishArgs> ParseArgs(int argc, char** argv) {
  PublishArgs a;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> Result<std::string> {
      if (i + 1 >= argc) return Fail(Error::InvalidArgument(arg + " needs a value"));
      return std::string(argv[++i]);
    };
    MOE_ASSIGN_OR_RETURN(bool shared_flag, ApplyObjectStoreFlag(arg, value, a.options.target, a.options.retry));
    if (shared_flag) continue;
    if (arg == "--multipart-threshold") {
      MOE_ASSIGN_OR_RETURN(std::string v, value());
      MOE_ASSIGN_OR_RETURN(a.options.multipart_threshold, ParseSize(arg, v));
      if (a.options.multipart_threshold > kS3MaxSinglePut)
        return Fail(Error::InvalidArgument("--multipart-threshold above 5GiB: S3 refuses single PUTs that large"));
    } else if (arg == "--part-size") {
      MOE_ASSIGN_OR_RETURN(std::string v, value());
      MOE_ASSIGN_OR_RETURN(a.options.part_size, ParseSize(arg, v));
      if (a.options.part_size == 0) return Fail(Error::InvalidArgument("--part-size must be positive"));
      if (a.options.part_size > kS3MaxSinglePut)
        return Fail(Error::InvalidArgument("--part-size above 5GiB: S3 refuses parts that large"));
    } else if (arg == "--state-dir") {
      MOE_ASSIGN_OR_RETURN(a.options.state_dir, value());
    } else if (arg == "--follow-symlinks") {
      a.options.follow_symlinks = true;
    } else if (arg == "--no-local-manifest") {
      a.options.write_local_manifest = false;
    } else if (arg == "--quiet") {
      a.options.log_progress = false;
    } else if (arg == "-h" || arg == "--help") {
      return Fail(Error::InvalidArgument("help"));
    } else if (!arg.empty() && arg[0] == '-') {
      return Fail(Error::InvalidArgument("unknown flag " + arg));
    } else if (a.dir.empty()) {
      a.dir = arg;
    } else if (a.uri.empty()) {
      a.uri = arg;
    } else {
      return Fail(Error::InvalidArgument("unexpected argument '" + arg + "'"));
    }
  }
  if (a.dir.empty()) return Fail(Error::InvalidArgument("missing DIR"));
  if (a.uri.empty()) return Fail(Error::InvalidArgument("missing URI"));
  return a;
}

}  // namespace

int RunPublishCommand(int argc, char** argv) {
  auto args = ParseArgs(argc, argv);
  if (!args) {
    bool help = args.error().message() == "help";
    if (!help) std::fprintf(stderr, "moe-daemon publish: %s\n", args.error().message().c_str());
    std::fputs(kUsage, stderr);
    return help ? 0 : 2;
  }
  auto published = PublishModel(args->dir, args->uri, args->options);
  if (!published) {
    std::fprintf(stderr, "moe-daemon publish: %s\n", published.error().ToString().c_str());
    return 1;
  }
  const PublishStats& s = published->stats;
  if (args->options.log_progress)
    log::Info("publish " + args->uri + ": " + std::to_string(s.files) + " files, " + std::to_string(s.files_sent) +
              " sent, " + std::to_string(s.files_skipped) + " already there; " + std::to_string(s.parts_sent) +
              " parts sent, " + std::to_string(s.parts_resumed) + " resumed; " +
              FormatBytes(static_cast<double>(s.bytes_sent)) + " uploaded");
  // What a MoEDeployment needs: the URI and a revision naming exactly this content.
  std::printf("uri: %s\nrevision: %s\n", args->uri.c_str(), published->manifest_sha256.c_str());
  return 0;
}

}  // namespace moeserve::storage
