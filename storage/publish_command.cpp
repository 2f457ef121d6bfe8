// `moe-daemon publish DIR URI [options]`: writes manifest.json for a model
// directory and uploads the directory to s3://bucket/prefix/ or file:///dir,
// the manifest last, so that `moe-daemon pull URI` can fetch and verify it.
// Prints the URI and the manifest's sha256 (a revision for the MoEDeployment).
// With --experts a directory that already holds its routed experts in that
// format (FamilyEntry::stored_experts: gpt-oss's MXFP4, a converted
// directory) goes up as it is; one whose family converts its checkpoint
// (FamilyEntry::write_converted: DeepSeek-V3.2, Qwen3-Next, moe-dsa-v1 with
// BF16 experts) is first written converted, its routed experts requantised,
// and that directory is what goes up.
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>

#include "cli_values.hpp"
#include "moeserve/common/log.hpp"
#include "moeserve/engine/family_registry.hpp"
#include "moeserve/engine/model_config.hpp"
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
    "  --quiet                  no progress output\n"
    "  --experts mxfp4|bf16     the routed experts' format nodes load: a directory holding them so goes up\n"
    "                           as it is (gpt-oss: MXFP4); a DeepSeek-V3.2 or Qwen3-Next directory, or a\n"
    "                           moe-dsa-v1 one with BF16 experts, goes up converted, its routed experts\n"
    "                           requantised, so that nodes load it with no conversion (docs/model-format.md)\n"
    "  --converted-dir D        with --experts: where the converted directory is written first (default\n"
    "                           DIR.mxfp4 or DIR.bf16); one already there from an earlier run is published as it is\n";

struct PublishArgs {
  std::string dir;
  std::string uri;
  PublishOptions options;
  std::optional<engine::ExpertFormat> experts;  // --experts: convert first
  std::string converted_dir;
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
    } else if (arg == "--experts") {
      MOE_ASSIGN_OR_RETURN(std::string v, value());
      if (v == "mxfp4") a.experts = engine::ExpertFormat::kMxfp4;
      else if (v == "bf16") a.experts = engine::ExpertFormat::kBf16;
      else return Fail(Error::InvalidArgument("--experts must be mxfp4 or bf16 (got '" + v + "')"));
    } else if (arg == "--converted-dir") {
      MOE_ASSIGN_OR_RETURN(a.converted_dir, value());
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
  if (!a.converted_dir.empty() && !a.experts) return Fail(Error::InvalidArgument("--converted-dir needs --experts"));
  if (a.experts && a.converted_dir.empty()) {
    std::string dir = a.dir;
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    a.converted_dir = dir + "." + std::string(engine::ExpertFormatName(*a.experts));
  }
  return a;
}

// --experts: the directory to publish, converted (or found converted by an
// earlier run: the converter writes it under a temporary name and renames
// it when complete, so one that exists is whole).
// The family registry decides which directories convert and how.
Result<std::string> ConvertedDirectory(const PublishArgs& a) {
  MOE_ASSIGN_OR_RETURN(const engine::FamilyEntry* family, engine::FindFamily(a.dir));
  if (family->stored_experts) {
    MOE_ASSIGN_OR_RETURN(std::optional<engine::ExpertFormat> stored, family->stored_experts(a.dir));
    if (stored == a.experts) {
      if (a.options.log_progress)
        log::Info("publish: " + a.dir + " holds its routed experts as " +
                  std::string(engine::ExpertFormatName(*a.experts)) + " already; publishing it as it is");
      return a.dir;
    }
    if (stored && !family->write_converted)
      return Fail(Error::InvalidArgument("--experts " + std::string(engine::ExpertFormatName(*a.experts)) + ": " +
                                         a.dir + " is a " + family->name + " directory, which holds its routed experts as " +
                                         std::string(engine::ExpertFormatName(*stored)) +
                                         " and has no conversion to another format"));
  }
  if (!family->write_converted || !family->converted_experts) {
    std::string converting;
    for (const engine::FamilyEntry& f : engine::Families())
      if (f.write_converted) converting += (converting.empty() ? "" : ", ") + std::string(f.name);
    return Fail(Error::InvalidArgument("--experts: " + a.dir + " is a " + family->name +
                                       " directory, and that family has no conversion to publish (families that "
                                       "convert: " + converting + "); other models are published as they are"));
  }
  std::error_code ec;
  if (std::filesystem::exists(a.converted_dir, ec)) {
    MOE_ASSIGN_OR_RETURN(std::optional<engine::ExpertFormat> held, family->converted_experts(a.converted_dir));
    if (held != a.experts)
      return Fail(Error::InvalidArgument(a.converted_dir + " exists but does not hold experts converted to " +
                                         std::string(engine::ExpertFormatName(*a.experts)) +
                                         "; remove it or name another --converted-dir"));
    if (a.options.log_progress) log::Info("publish: " + a.converted_dir + " was converted before; publishing it");
    return a.converted_dir;
  }
  if (a.options.log_progress) log::Info("publish: converting " + a.dir + " into " + a.converted_dir);
  MOE_TRY(family->write_converted(a.dir, a.converted_dir, engine::ConversionOptions{.experts = *a.experts}));
  return a.converted_dir;
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
  std::string dir = args->dir;
  if (args->experts) {
    auto converted = ConvertedDirectory(*args);
    if (!converted) {
      std::fprintf(stderr, "moe-daemon publish: %s\n", converted.error().ToString().c_str());
      return 1;
    }
    dir = *converted;
  }
  auto published = PublishModel(dir, args->uri, args->options);
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
