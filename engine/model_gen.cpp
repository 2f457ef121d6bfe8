#include "moeserve/engine/model_gen.hpp"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "moeserve/common/durable_file.hpp"
#include "moeserve/engine/manifest.hpp"
#include "moeserve/engine/safetensors.hpp"
#include "moeserve/engine/tensor_layout.hpp"
#include "moeserve/engine/tokenizer.hpp"
#include "moeserve/kernels/mxfp4.hpp"

namespace moeserve::engine {

namespace fs = std::filesystem;

namespace {

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// A deterministic stream of uniform and normal draws for one tensor.
class TensorRng {
 public:
  TensorRng(uint64_t seed, const std::string& name) : state_(seed * 0x9e3779b97f4a7c15ull ^ Fnv1a(name)) {}
  double Uniform() { return (SplitMix64(state_) >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
  double Normal() {
    double u1 = Uniform(), u2 = Uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  }

 private:
  uint64_t state_;
};

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Values that keep a random model numerically tame: unit-ish norms, matrices
// scaled by 1/sqrt(fan_in), DeltaNet decay parameters in fla's init ranges.
std::vector<float> InitialValues(const TensorSpec& spec, int64_t numel, TensorRng& rng) {
  std::vector<float> v(static_cast<size_t>(numel));
  const std::string& n = spec.name;
  if (EndsWith(n, "A_log")) {
    for (auto& x : v) x = static_cast<float>(std::log(1.0 + 15.0 * rng.Uniform()));  // A in [1, 16]
  } else if (EndsWith(n, "dt_bias")) {
    for (auto& x : v) {
      double dt = std::exp(std::log(1e-3) + rng.Uniform() * (std::log(0.1) - std::log(1e-3)));
      x = static_cast<float>(dt + std::log(-std::expm1(-dt)));  // inverse softplus
    }
  } else if (EndsWith(n, "k_norm.bias") || EndsWith(n, "gate.bias") ||
             (n.rfind("vision.", 0) == 0 && EndsWith(n, ".bias"))) {
    for (auto& x : v) x = static_cast<float>(0.05 * rng.Normal());
  } else if (spec.cls == TensorClass::kFloat32) {  // norm weights
    for (auto& x : v) x = static_cast<float>(1.0 + 0.1 * rng.Normal());
  } else if (EndsWith(n, "embed.weight")) {
    for (auto& x : v) x = static_cast<float>(rng.Normal());
  } else {
    double scale = 1.0 / std::sqrt(static_cast<double>(spec.fan_in > 0 ? spec.fan_in : 1));
    for (auto& x : v) x = static_cast<float>(scale * rng.Normal());
  }
  return v;
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

uint64_t SpecBytes(const TensorSpec& s) {
  uint64_t n = static_cast<uint64_t>(Numel(s.shape));
  if (s.cls == TensorClass::kFloat32) return 4 * n;
  return s.cls == TensorClass::kBf16 || s.cls == TensorClass::kBf16Experts ? 2 * n : n;
}

struct GeneratedTensor {
  DType dtype;
  std::vector<uint8_t> bytes;
};

// A routed-expert weight's fp32 values [experts * rows, cols], drawn from a
// stream keyed by the weight's name without its suffix ("...w13"), so that
// the MXFP4 and the BF16 checkpoint of one seed hold the same draw.
std::vector<float> ExpertValues(const TensorSpec& spec, const std::string& base, size_t numel, uint64_t seed) {
  TensorRng rng(seed, base);
  TensorSpec fp = spec;
  fp.cls = TensorClass::kBf16;  // initialise like a dense matrix of the same fan-in
  return InitialValues(fp, static_cast<int64_t>(numel), rng);
}

// MXFP4 weights come in pairs (.blocks, .scales) encoded from the fp32
// matrix; both are produced when the .blocks tensor is seen.
Result<std::pair<std::vector<uint8_t>, std::vector<uint8_t>>> GenerateExperts(const TensorSpec& blocks_spec, uint64_t seed) {
  const auto& s = blocks_spec.shape;  // [E, rows, cols/32, 16]
  const size_t rows = static_cast<size_t>(s[0] * s[1]);
  const size_t cols = static_cast<size_t>(s[2] * 32);
  std::string base = blocks_spec.name.substr(0, blocks_spec.name.size() - std::string(".blocks").size());
  auto values = ExpertValues(blocks_spec, base, rows * cols, seed);
  std::vector<uint8_t> blocks(rows * cols / 2), scales(rows * cols / 32);
  long long bad = kernels::Mxfp4EncodeMatrix(values.data(), rows, cols, blocks.data(), scales.data());
  if (bad >= 0) return Fail(Error::Internal(base + ": non-finite generated value at " + std::to_string(bad)));
  return std::make_pair(std::move(blocks), std::move(scales));
}

Status WriteText(const fs::path& path, const std::string& text) {
  return WriteFileDurably(path.string(), text);
}

}  // namespace

Status GenerateModel(const ModelGenOptions& options, const std::string& out_dir) {
  const ModelConfig& config = options.config;
  MOE_TRY(ValidateModelConfig(config, "generator config"));
  std::error_code ec;
  if (fs::exists(out_dir, ec)) return Fail(Error::InvalidArgument(out_dir + ": already exists; remove it or pick another --out"));
  fs::path partial = out_dir + ".partial";
  fs::remove_all(partial, ec);
  fs::create_directories(partial, ec);
  if (ec) return Fail(Error::Io(partial.string() + ": cannot create: " + ec.message()));

  // 1. Plan shards by size so that file names can carry the shard count.
  std::vector<TensorSpec> specs = ExpectedTensors(config);
  std::vector<int> shard_of(specs.size());
  int shards = 1;
  uint64_t in_shard = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    uint64_t b = SpecBytes(specs[i]);
    // Keep an MXFP4 pair together so each weight lives in one file.
    bool pair_tail = specs[i].cls == TensorClass::kMxfp4Scales;
    if (in_shard > 0 && in_shard + b > options.max_shard_bytes && !pair_tail) {
      ++shards;
      in_shard = 0;
    }
    shard_of[i] = shards - 1;
    in_shard += b;
  }
  auto shard_name = [&](int k) {
    if (shards == 1) return std::string("model.safetensors");
    char buf[64];
    std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", k + 1, shards);
    return std::string(buf);
  };

  // 2. Generate and write each shard.
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  std::vector<uint8_t> pending_scales;
  for (int k = 0; k < shards; ++k) {
    SafetensorsWriter writer;
    writer.SetMetadata("format", "pt");
    writer.SetMetadata("generator", "moe-model-gen seed=" + std::to_string(options.seed));
    for (size_t i = 0; i < specs.size(); ++i) {
      if (shard_of[i] != k) continue;
      const TensorSpec& spec = specs[i];
      std::vector<uint8_t> bytes;
      DType dtype = DType::kU8;
      if (spec.cls == TensorClass::kMxfp4Blocks) {
        MOE_ASSIGN_OR_RETURN(auto pair, GenerateExperts(spec, options.seed));
        bytes = std::move(pair.first);
        pending_scales = std::move(pair.second);
      } else if (spec.cls == TensorClass::kMxfp4Scales) {
        bytes = std::move(pending_scales);
      } else {
        std::vector<float> values;
        if (spec.cls == TensorClass::kBf16Experts) {
          // BF16 experts (model.md 1.2): the draw MXFP4 would encode, rounded to BF16.
          const std::string base = spec.name.substr(0, spec.name.size() - std::string(".weight").size());
          values = ExpertValues(spec, base, static_cast<size_t>(Numel(spec.shape)), options.seed);
        } else {
          TensorRng rng(options.seed, spec.name);
          values = InitialValues(spec, Numel(spec.shape), rng);
        }
        if (spec.cls == TensorClass::kFloat32) {
          dtype = DType::kF32;
          bytes.resize(values.size() * 4);
          std::memcpy(bytes.data(), values.data(), bytes.size());
        } else {
          dtype = DType::kBF16;
          bytes.resize(values.size() * 2);
          for (size_t j = 0; j < values.size(); ++j) {
            uint16_t b = F32ToBf16(values[j]);
            std::memcpy(bytes.data() + 2 * j, &b, 2);
          }
        }
      }
      MOE_TRY(writer.Add(spec.name, dtype, spec.shape, std::move(bytes)));
      weight_map[spec.name] = shard_name(k);
    }
    MOE_TRY(writer.WriteFile((partial / shard_name(k)).string()));
  }

  // 3. Index, config, tokenizer, then the manifest over all of them.
  if (shards > 1) {
    nlohmann::ordered_json index;
    uint64_t total = 0;
    for (const auto& s : specs) total += SpecBytes(s);
    index["metadata"] = {{"total_size", total}};
    index["weight_map"] = weight_map;
    MOE_TRY(WriteText(partial / "model.safetensors.index.json", index.dump(2) + "\n"));
  }
  MOE_TRY(WriteText(partial / "config.json", config.ToJson()));
  MOE_TRY(WriteText(partial / "tokenizer.json", Tokenizer::Builtin(config.vocab_size).ToJson()));
  MOE_ASSIGN_OR_RETURN(Manifest manifest, BuildManifest(partial.string()));
  MOE_TRY(WriteText(partial / "manifest.json", manifest.ToJson()));

  fs::rename(partial, out_dir, ec);
  if (ec) return Fail(Error::Io(out_dir + ": cannot rename the finished model into place: " + ec.message()));
  return Ok();
}

}  // namespace moeserve::engine
