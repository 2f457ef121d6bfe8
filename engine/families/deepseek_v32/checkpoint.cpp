// DeepSeek-V3.2's published checkpoint (Hugging Face names, FP8 e4m3 linear
// weights with 128x128 weight_scale_inv blocks) converted into the engine's
// tensor names and dtypes (model.md 1.1 and 1.2): planned first (every
// tensor checked for presence, dtype and shape), then converted tensor by
// tensor, either into one in-memory image (OpenDir) or as the weight loader
// asks for each (OpenDirStreamed). FP8 matrices the engine only multiplies
// stay FP8 with their scales; kv_b_proj (indexed element-wise) is converted
// exactly; routed experts are dequantised to BF16, optionally requantised to
// MXFP4 (model.md 13).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "conversion.hpp"
#include "moeserve/engine/families/deepseek_v32.hpp"
#include "moeserve/engine/tensor_layout.hpp"
#include "moeserve/kernels/fp8_block.hpp"
#include "moeserve/kernels/mxfp4.hpp"

namespace moeserve::engine::deepseek_v32 {
namespace {

using detail::Conversion;
using detail::Output;
using detail::Recipe;

constexpr int64_t kBlock = 128;

std::string Shape(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

void PutBf16(uint8_t* dst, size_t i, uint16_t v) { std::memcpy(dst + 2 * i, &v, 2); }

// Once a published tensor is converted its mapped pages leave this process's
// resident set: the shards are mapped read-only from their files
// (Checkpoint::Open), so the pages stay in the page cache and a later read
// faults them in again. Only the pages wholly inside the tensor are dropped
// (a neighbour sharing an edge page keeps it). Without this a load's
// resident size grows by the whole published checkpoint as it is read.
void DropPages(const TensorView& t) {
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(t.data) + page - 1) & ~(page - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(t.data) + t.nbytes) & ~(page - 1);
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

// The published pages of a tensor mapped in one call before they are read
// (MADV_POPULATE_READ, Linux 5.14): page by page, each first touch of a
// mapped page is a fault, and under a hypervisor a fault costs far more
// than reading the page. Advice only: an older kernel refuses it and the
// faults happen as before.
void Populate(const TensorView& t) {
#ifndef MADV_POPULATE_READ
  constexpr int MADV_POPULATE_READ = 22;
#endif
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(t.data) & ~(page - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(t.data) + t.nbytes;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_READ);
}

// The shards of a checkpoint whose weights are read in place, mapped on
// 2 MiB pages. Each first touch of a 4 KiB page costs this machine's
// hypervisor a fault (0.4-0.7 GB/s over a warm page cache's small pages),
// and decode streams weights faster from 2 MiB pages (weight_memory.hpp).
// The page cache maps a file range by 2 MiB only where it holds it in
// 2 MiB folios, which it makes when it reads the file for a mapping advised
// MADV_HUGEPAGE; pages it already holds stay as they were. So the shards'
// cached pages not mapped by anyone are dropped first (POSIX_FADV_DONTNEED:
// clean pages only, never pages another process has mapped) and the
// populating reads (Populate) read them again into huge folios. Advice only:
// where the kernel refuses any of it, the shards map on small pages.
void MapShardsOnHugePages(const Checkpoint& ck) {
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  for (const auto& shard : ck.shards()) {
    if (shard->tensors().empty()) continue;
    uintptr_t begin = UINTPTR_MAX, end = 0;
    for (const TensorView& t : shard->tensors()) {
      begin = std::min(begin, reinterpret_cast<uintptr_t>(t.data));
      end = std::max(end, reinterpret_cast<uintptr_t>(t.data) + t.nbytes);
    }
    begin &= ~(page - 1);
    if (end <= begin) continue;
    ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
    const int fd = ::open(shard->path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

// fn(begin, end) over [0, n) in pieces of `piece`, taken in turn by the
// calling thread and one more thread per other core (a load's conversions
// and copies use every core). Threads of its own, started per call, not the
// kernel pool: a process that loads a model and then forks (expert-parallel
// ranks in tests) must not hold pool workers that its children lack.
void ForPieces(size_t n, size_t piece, const std::function<void(size_t, size_t)>& fn) {
  const size_t pieces = (n + piece - 1) / piece;
  if (pieces <= 1) {
    if (n > 0) fn(0, n);
    return;
  }
  std::atomic<size_t> next{0};
  const auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < pieces;) fn(i * piece, std::min(n, (i + 1) * piece));
  };
  const size_t helpers = std::min<size_t>(pieces, std::max(1u, std::thread::hardware_concurrency())) - 1;
  std::vector<std::thread> threads;
  for (size_t t = 0; t < helpers; ++t) threads.emplace_back(work);
  work();
  for (std::thread& t : threads) t.join();
}

// memcpy in 4 MiB pieces over the pool.
void CopyInParallel(uint8_t* dst, const uint8_t* src, size_t n) {
  ForPieces(n, size_t{4} << 20, [&](size_t b, size_t e) { std::memcpy(dst + b, src + b, e - b); });
}

// A published matrix checked when planned: FP8 with its block scales, BF16
// or F32.
struct Planned {
  const TensorView* t = nullptr;
  const TensorView* scale = nullptr;  // FP8 only
  std::string name, scale_name;
  int64_t rows = 0, cols = 0;
};

}  // namespace

namespace detail {

// Reads the published tensors, remembering which were used. Planning checks
// presence, dtypes and shapes (and the block scales of the matrices converted
// exactly, which decide their dtype); converting (Dequant, Exact, KeepFp8,
// VecInto) reads the data.
class Source {
 public:
  explicit Source(const Checkpoint& ck) : ck_(ck) {}

  Result<const TensorView*> Get(const std::string& name, const std::vector<int64_t>& shape) {
    const TensorView* t = ck_.Find(name);
    if (!t) return Fail(Error::NotFound("DeepSeek-V3.2 checkpoint: tensor '" + name + "' is missing"));
    if (t->shape != shape)
      return Fail(Error::Corruption(*t->file, "tensor '" + name + "' has shape " + t->ShapeString() + ", expected " + Shape(shape)));
    used_.insert(name);
    return t;
  }

  Result<const TensorView*> PlanVec(const std::string& name, int64_t n) {
    MOE_ASSIGN_OR_RETURN(const TensorView* t, Get(name, {n}));
    if (t->dtype != DType::kF32 && t->dtype != DType::kBF16)
      return Fail(Error::Corruption(*t->file, "tensor '" + name + "' is " + std::string(DTypeName(t->dtype)) + ", expected BF16 or F32"));
    return t;
  }

  // A vector (norm, bias) as F32.
  static void VecInto(const TensorView& t, uint8_t* dst) {
    const size_t n = static_cast<size_t>(t.numel());
    if (t.dtype == DType::kF32) {
      std::memcpy(dst, t.data, n * 4);
      DropPages(t);
      return;
    }
    for (size_t i = 0; i < n; ++i) {
      uint16_t b;
      std::memcpy(&b, t.data + 2 * i, 2);
      const float f = Bf16ToF32(b);
      std::memcpy(dst + 4 * i, &f, 4);
    }
    DropPages(t);
  }

  Result<Planned> PlanMatrix(const std::string& name, int64_t rows, int64_t cols) {
    Planned p;
    p.name = name;
    p.rows = rows;
    p.cols = cols;
    MOE_ASSIGN_OR_RETURN(p.t, Get(name, {rows, cols}));
    if (p.t->dtype == DType::kBF16 || p.t->dtype == DType::kF32) return p;
    if (p.t->dtype != DType::kF8E4M3)
      return Fail(Error::Corruption(*p.t->file, "tensor '" + name + "' is " + std::string(DTypeName(p.t->dtype)) +
                                                    ", expected F8_E4M3 (with weight_scale_inv) or BF16"));
    p.scale_name = name.substr(0, name.size() - std::string("weight").size()) + "weight_scale_inv";
    MOE_ASSIGN_OR_RETURN(p.scale, Get(p.scale_name, {(rows + kBlock - 1) / kBlock, (cols + kBlock - 1) / kBlock}));
    if (p.scale->dtype != DType::kF32)
      return Fail(Error::Corruption(*p.scale->file, "tensor '" + p.scale_name + "' is " +
                                                        std::string(DTypeName(p.scale->dtype)) + ", expected F32"));
    return p;
  }

  // The matrix as BF16 into dst: FP8 with its block scales dequantised (the
  // fp32 product rounded to nearest even, as DeepSeek's weight_dequant),
  // BF16 as stored, F32 rounded to BF16 (the engine's linear weights are BF16).
  static Status Dequant(const Planned& p, uint8_t* dst) {
    MOE_TRY(ConvertInto(p, DType::kBF16, dst));
    DropPages(*p.t);
    if (p.scale) DropPages(*p.scale);
    return Ok();
  }

  // A matrix the layers index element by element (wkv_b, the embedding)
  // converted exactly, into `to`: F32 (FP8 code * scale rounded once, as
  // upstream's fp32 products use it) or BF16 (only planned where that is
  // exact: see ExactInBf16).
  static Status Exact(const Planned& p, DType to, uint8_t* dst) {
    MOE_TRY(ConvertInto(p, to, dst));
    DropPages(*p.t);
    if (p.scale) DropPages(*p.scale);
    return Ok();
  }

  // Whether an FP8 matrix converts to BF16 exactly: every block scale a
  // power of two far enough from fp32's ends that each code's (at most 4
  // significant bits) product is a normal number; then code * scale needs
  // no more than BF16's 8 bits. Reads the scales (a small tensor).
  static bool ExactInBf16(const Planned& p) {
    const size_t n = static_cast<size_t>(p.scale->numel());
    for (size_t i = 0; i < n; ++i) {
      float v;
      std::memcpy(&v, p.scale->data + 4 * i, 4);
      int e = 0;
      if (!std::isfinite(v) || v <= 0 || std::frexp(v, &e) != 0.5f || e < -116 || e > 119) return false;
    }
    return true;
  }

  // An FP8 matrix kept as published: its codes and block scales copied
  // (dst[0] codes, dst[1] scales), checked on the way (no NaN code, every
  // scale a positive finite number) so that a bad one is named at load.
  static Status KeepFp8(const Planned& p, const std::vector<uint8_t*>& dst) {
    Populate(*p.t);
    MOE_TRY(CheckFp8(p));
    CopyInParallel(dst[0], p.t->data, static_cast<size_t>(p.rows * p.cols));
    std::memcpy(dst[1], p.scale->data, p.scale->nbytes);
    DropPages(*p.t);
    DropPages(*p.scale);
    return Ok();
  }

  // An FP8 matrix read in place (Recipe::in_place): the checks KeepFp8
  // makes, its pages mapped in one call and left mapped (decode reads them).
  static Status CheckFp8InPlace(const Planned& p) {
    Populate(*p.t);
    return CheckFp8(p);
  }

  bool Has(const std::string& name) const { return ck_.Find(name) != nullptr; }
  const std::set<std::string>& used() const { return used_; }

  // What the plan does with the FP8 matrices (for the notes).
  int kept_fp8 = 0, exact_f32 = 0, exact_bf16 = 0, dequantised = 0;

 private:
  static Status CheckFp8(const Planned& p) {
    const size_t ns = static_cast<size_t>(p.scale->numel());
    for (size_t i = 0; i < ns; ++i) {
      float v;
      std::memcpy(&v, p.scale->data + 4 * i, 4);
      if (!std::isfinite(v) || v <= 0)
        return Fail(Error::Corruption(*p.scale->file, "tensor '" + p.scale_name + "': block " + std::to_string(i) +
                                                          " scale " + std::to_string(v) +
                                                          " is not a positive finite number"));
    }
    // The first NaN code: each piece scanned in parallel, the lowest hit kept.
    const size_t n = static_cast<size_t>(p.rows * p.cols), piece = size_t{4} << 20;
    std::vector<long long> hits((n + piece - 1) / piece, -1);
    ForPieces(n, piece, [&](size_t b, size_t e) {
      const long long at = kernels::Fp8FindNan(p.t->data + b, e - b);
      if (at >= 0) hits[b / piece] = static_cast<long long>(b) + at;
    });
    long long bad = -1;
    for (long long h : hits)
      if (h >= 0) {
        bad = h;
        break;
      }
    if (bad >= 0)
      return Fail(Error::Corruption(*p.t->file, "tensor '" + p.name + "': element [" + std::to_string(bad / p.cols) + ", " +
                                                    std::to_string(bad % p.cols) + "] is an FP8 NaN"));
    return Ok();
  }

  // The matrix into dst as `to` (BF16 or F32). FP8: code * scale in fp32
  // (Fp8BlockToF32), or those values rounded to BF16 (Fp8BlockToBf16, the
  // rounding of F32ToBf16), rows spread over the kernel pool.
  static Status ConvertInto(const Planned& p, DType to, uint8_t* dst) {
    const TensorView* t = p.t;
    Populate(*t);
    const size_t n = static_cast<size_t>(p.rows * p.cols), cols = static_cast<size_t>(p.cols);
    if (t->dtype == to) {
      std::memcpy(dst, t->data, n * DTypeSize(to));
      return Ok();
    }
    if (t->dtype == DType::kBF16) {  // to F32
      for (size_t i = 0; i < n; ++i) {
        uint16_t b;
        std::memcpy(&b, t->data + 2 * i, 2);
        const float f = Bf16ToF32(b);
        std::memcpy(dst + 4 * i, &f, 4);
      }
      return Ok();
    }
    if (t->dtype == DType::kF32) {  // to BF16
      for (size_t i = 0; i < n; ++i) {
        float f;
        std::memcpy(&f, t->data + 4 * i, 4);
        PutBf16(dst, i, F32ToBf16(f));
      }
      return Ok();
    }
    MOE_TRY(CheckFp8(p));
    // The scales copied (a mapped F32 tensor need not be 4-byte aligned).
    std::vector<float> scale(static_cast<size_t>(p.scale->numel()));
    std::memcpy(scale.data(), p.scale->data, scale.size() * 4);
    const kernels::Fp8BlockView v{t->data, scale.data(), static_cast<size_t>(p.rows), cols};
    // Pieces of 32 rows over the pool, straight into dst when it is aligned
    // to the element (the converting source's weight memory; a place in
    // OpenDir's packed image may not be), else through a buffer per piece.
    // Fp8BlockToBf16 rounds as F32ToBf16 does (no NaN reaches it: CheckFp8).
    const size_t esize = DTypeSize(to);
    const bool aligned = reinterpret_cast<uintptr_t>(dst) % esize == 0;
    ForPieces(v.rows, 32, [&](size_t r0, size_t r1) {
      std::vector<uint8_t> buffer(aligned ? 0 : (r1 - r0) * cols * esize);
      uint8_t* out = aligned ? dst + r0 * cols * esize : buffer.data();
      if (to == DType::kF32)
        kernels::Fp8BlockToF32(v, r0, r1, reinterpret_cast<float*>(out));
      else
        kernels::Fp8BlockToBf16(v, r0, r1, reinterpret_cast<uint16_t*>(out));
      if (!aligned) std::memcpy(dst + r0 * cols * esize, buffer.data(), buffer.size());
    });
    return Ok();
  }

  const Checkpoint& ck_;
  std::set<std::string> used_;
};

Conversion::~Conversion() = default;

}  // namespace detail

namespace {

using detail::Source;

// The routed experts of one projection: `parts` per expert (gate and up for
// w13, down for w2), each [rows, cols], stacked along the rows.
struct ExpertParts {
  std::vector<std::vector<Planned>> experts;  // [E][parts]
  int64_t rows = 0, cols = 0;                 // of one expert's stacked matrix
};

// One expert's stacked matrix as BF16 into dst.
Status ExpertInto(const std::vector<Planned>& parts, uint8_t* dst) {
  size_t off = 0;
  for (const Planned& p : parts) {
    MOE_TRY(Source::Dequant(p, dst + off));
    off += static_cast<size_t>(p.rows * p.cols) * 2;
  }
  return Ok();
}

Recipe Bf16Experts(const std::string& to, ExpertParts ep) {
  const int64_t E = static_cast<int64_t>(ep.experts.size());
  Recipe r;
  r.outs.push_back({to + ".weight", DType::kBF16, {E, ep.rows, ep.cols}});
  r.fill = [ep = std::move(ep)](const std::vector<uint8_t*>& dst) -> Status {
    const size_t per = static_cast<size_t>(ep.rows * ep.cols) * 2;
    for (size_t e = 0; e < ep.experts.size(); ++e) MOE_TRY(ExpertInto(ep.experts[e], dst[0] + e * per));
    return Ok();
  };
  return r;
}

// MXFP4 requantisation: each expert converted to BF16 as above (one expert's
// values in memory at a time), then encoded block by block (model.md 7).
Recipe Mxfp4Experts(const std::string& to, ExpertParts ep) {
  const int64_t E = static_cast<int64_t>(ep.experts.size());
  Recipe r;
  r.outs.push_back({to + ".blocks", DType::kU8, {E, ep.rows, ep.cols / 32, 16}});
  r.outs.push_back({to + ".scales", DType::kU8, {E, ep.rows, ep.cols / 32}});
  r.fill = [to, ep = std::move(ep)](const std::vector<uint8_t*>& dst) -> Status {
    const size_t n = static_cast<size_t>(ep.rows * ep.cols);
    std::vector<uint8_t> bf16(n * 2);
    std::vector<float> f32(n);
    for (size_t e = 0; e < ep.experts.size(); ++e) {
      MOE_TRY(ExpertInto(ep.experts[e], bf16.data()));
      for (size_t i = 0; i < n; ++i) {
        uint16_t b;
        std::memcpy(&b, bf16.data() + 2 * i, 2);
        f32[i] = Bf16ToF32(b);
      }
      const long long bad = kernels::Mxfp4EncodeMatrix(f32.data(), static_cast<size_t>(ep.rows), static_cast<size_t>(ep.cols),
                                                       dst[0] + e * (n / 2), dst[1] + e * (n / 32));
      if (bad >= 0)
        return Fail(Error::Corruption(to, "expert " + std::to_string(e) + ": element " + std::to_string(bad) +
                                              " is not finite after dequantisation; cannot requantise to MXFP4"));
    }
    return Ok();
  };
  return r;
}

Result<std::vector<Recipe>> Plan(Source& src, const Config& cfg, ExpertFormat experts) {
  const ModelConfig& c = cfg.model;
  const int64_t D = c.hidden_size, V = c.vocab_size, H = c.mla.num_heads, ql = c.mla.q_lora_rank;
  const int64_t kvl = c.mla.kv_lora_rank, nope = c.mla.qk_nope_head_dim, rope = c.mla.qk_rope_head_dim;
  const int64_t vd = c.mla.v_head_dim, IH = c.dsa.index_n_heads, ID = c.dsa.index_head_dim;
  const int64_t E = c.moe.num_experts, I = c.moe.moe_intermediate_size, S = c.moe.num_shared_experts * I;
  if (experts == ExpertFormat::kMxfp4 && (D % 32 || I % 32))
    return Fail(Error::InvalidArgument("experts mxfp4: hidden_size (" + std::to_string(D) + ") and moe_intermediate_size (" +
                                       std::to_string(I) + ") must be multiples of 32 (MXFP4 blocks)"));
  std::vector<Recipe> out;
  const auto vec = [&](const std::string& from, const std::string& to, int64_t n) -> Status {
    MOE_ASSIGN_OR_RETURN(const TensorView* t, src.PlanVec(from, n));
    out.push_back({{{to, DType::kF32, {n}}}, [t](const std::vector<uint8_t*>& dst) -> Status {
                     Source::VecInto(*t, dst[0]);
                     return Ok();
                   }, {}, nullptr});
    return Ok();
  };
  // A matrix the engine only multiplies through Linear(): FP8 kept as
  // published with its block scales (model.md 1.1: "<name>_scale_inv"; the
  // FP8 kernels scale in fp32 as upstream's fp8_gemm does, exact for any
  // float scale), BF16 as stored, F32 rounded to BF16.
  const auto mat = [&](const std::string& from, const std::string& to, int64_t rows, int64_t cols) -> Status {
    MOE_ASSIGN_OR_RETURN(Planned p, src.PlanMatrix(from, rows, cols));
    if (p.scale) {
      ++src.kept_fp8;
      out.push_back({{{to, DType::kF8E4M3, {rows, cols}},
                      {to + "_scale_inv", DType::kF32, {(rows + kBlock - 1) / kBlock, (cols + kBlock - 1) / kBlock}}},
                     [p](const std::vector<uint8_t*>& dst) { return Source::KeepFp8(p, dst); },
                     {p.t, p.scale},
                     [p] { return Source::CheckFp8InPlace(p); }});
      return Ok();
    }
    Recipe r{{{to, DType::kBF16, {rows, cols}}},
             [p](const std::vector<uint8_t*>& dst) { return Source::Dequant(p, dst[0]); },
             {},
             nullptr};
    if (p.t->dtype == DType::kBF16) {  // as stored
      r.in_place = {p.t};
      r.check = [p] {
        Populate(*p.t);  // mapped now, not at the first decode step
        return Ok();
      };
    }
    out.push_back(std::move(r));
    return Ok();
  };
  // A matrix whose elements the layers index (the embedding's rows, wkv_b's
  // per-head blocks in MLA's absorbed form): FP8 converted at load, exactly:
  // to BF16 when every block scale is a power of two (code * scale fits
  // BF16), else to F32 (code * scale rounded once, the weight upstream's
  // fp32 products use). BF16 as stored; F32 rounded to BF16 as before.
  const auto exact = [&](const std::string& from, const std::string& to, int64_t rows, int64_t cols) -> Status {
    MOE_ASSIGN_OR_RETURN(Planned p, src.PlanMatrix(from, rows, cols));
    DType dtype = DType::kBF16;
    if (p.scale) {
      dtype = Source::ExactInBf16(p) ? DType::kBF16 : DType::kF32;
      ++(dtype == DType::kBF16 ? src.exact_bf16 : src.exact_f32);
    }
    out.push_back({{{to, dtype, {rows, cols}}},
                   [p, dtype](const std::vector<uint8_t*>& dst) { return Source::Exact(p, dtype, dst[0]); },
                   {},
                   nullptr});
    return Ok();
  };
  MOE_TRY(exact("model.embed_tokens.weight", "embed.weight", V, D));
  MOE_TRY(mat("lm_head.weight", "head.weight", V, D));
  MOE_TRY(vec("model.norm.weight", "norm.weight", D));
  // One decoder layer: published prefix p ("model.layers.3."), engine prefix q
  // ("layers.3.", "mtp.0."), a dense or an MoE FFN.
  const auto layer = [&](const std::string& p, const std::string& q, bool moe) -> Status {
    const std::string a = p + "self_attn.", m = p + "mlp.";
    MOE_TRY(vec(p + "input_layernorm.weight", q + "attn_norm.weight", D));
    MOE_TRY(vec(p + "post_attention_layernorm.weight", q + "ffn_norm.weight", D));
    MOE_TRY(mat(a + "q_a_proj.weight", q + "attn.wq_a.weight", ql, D));
    MOE_TRY(vec(a + "q_a_layernorm.weight", q + "attn.q_norm.weight", ql));
    MOE_TRY(mat(a + "q_b_proj.weight", q + "attn.wq_b.weight", H * (nope + rope), ql));
    MOE_TRY(mat(a + "kv_a_proj_with_mqa.weight", q + "attn.wkv_a.weight", kvl + rope, D));
    MOE_TRY(vec(a + "kv_a_layernorm.weight", q + "attn.kv_norm.weight", kvl));
    MOE_TRY(exact(a + "kv_b_proj.weight", q + "attn.wkv_b.weight", H * (nope + vd), kvl));
    MOE_TRY(mat(a + "o_proj.weight", q + "attn.wo.weight", D, H * vd));
    MOE_TRY(mat(a + "indexer.wq_b.weight", q + "attn.indexer.wq_b.weight", IH * ID, ql));
    MOE_TRY(mat(a + "indexer.wk.weight", q + "attn.indexer.wk.weight", ID, D));
    MOE_TRY(vec(a + "indexer.k_norm.weight", q + "attn.indexer.k_norm.weight", ID));
    MOE_TRY(vec(a + "indexer.k_norm.bias", q + "attn.indexer.k_norm.bias", ID));
    MOE_TRY(mat(a + "indexer.weights_proj.weight", q + "attn.indexer.weights_proj.weight", IH, D));
    if (!moe) {
      const int64_t F = c.intermediate_size;
      MOE_TRY(mat(m + "gate_proj.weight", q + "ffn.w1.weight", F, D));
      MOE_TRY(mat(m + "up_proj.weight", q + "ffn.w3.weight", F, D));
      MOE_TRY(mat(m + "down_proj.weight", q + "ffn.w2.weight", D, F));
      return Ok();
    }
    MOE_TRY(mat(m + "gate.weight", q + "ffn.gate.weight", E, D));
    MOE_TRY(vec(m + "gate.e_score_correction_bias", q + "ffn.gate.bias", E));
    // Routed experts stacked: w13 [E, 2I, D] (rows of w1 then of w3), w2 [E, D, I].
    ExpertParts w13{{}, 2 * I, D}, w2{{}, D, I};
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = m + "experts." + std::to_string(e) + ".";
      std::vector<Planned> up;
      for (const char* part : {"gate_proj", "up_proj"}) {
        MOE_ASSIGN_OR_RETURN(Planned pl, src.PlanMatrix(x + part + ".weight", I, D));
        src.dequantised += pl.scale != nullptr;
        up.push_back(std::move(pl));
      }
      w13.experts.push_back(std::move(up));
      MOE_ASSIGN_OR_RETURN(Planned down, src.PlanMatrix(x + "down_proj.weight", D, I));
      src.dequantised += down.scale != nullptr;
      w2.experts.push_back({std::move(down)});
    }
    const auto stack = experts == ExpertFormat::kMxfp4 ? Mxfp4Experts : Bf16Experts;
    out.push_back(stack(q + "ffn.experts.w13", std::move(w13)));
    out.push_back(stack(q + "ffn.experts.w2", std::move(w2)));
    if (S > 0) {
      MOE_TRY(mat(m + "shared_experts.gate_proj.weight", q + "ffn.shared.w1.weight", S, D));
      MOE_TRY(mat(m + "shared_experts.up_proj.weight", q + "ffn.shared.w3.weight", S, D));
      MOE_TRY(mat(m + "shared_experts.down_proj.weight", q + "ffn.shared.w2.weight", D, S));
    }
    return Ok();
  };
  for (int i = 0; i < c.num_layers; ++i)
    MOE_TRY(layer("model.layers." + std::to_string(i) + ".", "layers." + std::to_string(i) + ".", c.IsMoeLayer(i)));
  // The first multi-token-prediction layer (model.md 15), stored after the
  // model's own as model.layers.{num_hidden_layers}: its input norms and
  // projection, a full decoder layer (DSA attention, MoE FFN) and
  // shared_head.norm, as the engine's mtp.0.*. Its shared_head.head and
  // embed_tokens are left: the model's own head and embedding serve (the
  // module shares them). Planned only when the checkpoint holds it.
  const std::string mp = "model.layers." + std::to_string(c.num_layers) + ".";
  if (c.num_nextn_predict_layers > 0 && src.Has(mp + "eh_proj.weight")) {
    MOE_TRY(vec(mp + "enorm.weight", "mtp.0.enorm.weight", D));
    MOE_TRY(vec(mp + "hnorm.weight", "mtp.0.hnorm.weight", D));
    MOE_TRY(mat(mp + "eh_proj.weight", "mtp.0.eh_proj.weight", D, 2 * D));
    MOE_TRY(layer(mp, "mtp.0.", c.mtp_moe));
    MOE_TRY(vec(mp + "shared_head.norm.weight", "mtp.0.norm.weight", D));
  }
  return out;
}

// The layer index of "model.layers.{i}....", or -1.
int LayerOf(const std::string& name) {
  static const std::string kPrefix = "model.layers.";
  if (name.rfind(kPrefix, 0) != 0) return -1;
  size_t end = name.find('.', kPrefix.size());
  if (end == std::string::npos || end == kPrefix.size() || end - kPrefix.size() > 6) return -1;
  int i = 0;
  for (size_t k = kPrefix.size(); k < end; ++k) {
    if (name[k] < '0' || name[k] > '9') return -1;
    i = i * 10 + (name[k] - '0');
  }
  return i;
}

}  // namespace

Result<std::unique_ptr<Conversion>> detail::PlanDir(const std::string& dir, std::optional<ExpertFormat> experts) {
  auto cv = std::make_unique<Conversion>();
  MOE_ASSIGN_OR_RETURN(cv->cfg, LoadConfig(dir));
  if (cv->cfg.converted_experts)
    return Fail(Error::InvalidArgument(dir + ": already converted (config.json: moeserve_converted)"));
  MOE_ASSIGN_OR_RETURN(cv->published, Checkpoint::Open(dir));
  cv->src = std::make_unique<Source>(cv->published);
  cv->published_name = dir + " (DeepSeek-V3.2, converted)";
  const ExpertFormat format = experts.value_or(ExpertFormat::kBf16);
  MOE_ASSIGN_OR_RETURN(cv->recipes, Plan(*cv->src, cv->cfg, format));
  cv->cfg.model.expert_format = format;

  // Every published tensor is either converted or belongs to an MTP layer
  // (the first one's shared head and embedding copies, later ones whole).
  const int L = cv->cfg.model.num_layers;
  int mtp = 0, mtp_mapped = 0;
  for (const TensorView* t : cv->published.AllTensors()) {
    const int layer = LayerOf(t->name);
    if (cv->src->used().count(t->name)) {
      mtp_mapped += layer == L;
      continue;
    }
    if (layer >= L && layer < L + cv->cfg.num_nextn_predict_layers) {
      ++mtp;
      continue;
    }
    return Fail(Error::Corruption(*t->file, "tensor '" + t->name + "' is not part of DeepSeek-V3.2 as configured (" +
                                                std::to_string(L) + " layers, " +
                                                std::to_string(cv->cfg.num_nextn_predict_layers) + " MTP)"));
  }
  if (mtp_mapped > 0) {
    std::ostringstream note;
    note << "multi-token-prediction layer " << L << " mapped to mtp.0 (" << mtp_mapped
         << " tensors; loaded for speculative drafts when asked)";
    if (mtp > 0) note << "; " << mtp << " tensors left (its shared head and embedding: the model's own serve"
                      << (cv->cfg.num_nextn_predict_layers > 1 ? "; further MTP layers: one module is chained" : "") << ")";
    cv->notes.push_back(note.str());
  } else if (cv->cfg.num_nextn_predict_layers > 0) {
    std::ostringstream note;
    note << "multi-token-prediction layer " << L;
    if (cv->cfg.num_nextn_predict_layers > 1) note << " to " << L + cv->cfg.num_nextn_predict_layers - 1;
    note << " not in the checkpoint (" << mtp << " tensors found): no speculative drafts from it";
    cv->notes.push_back(note.str());
  }
  const Source& src = *cv->src;
  if (src.kept_fp8 > 0)
    cv->notes.push_back(std::to_string(src.kept_fp8) +
                        " FP8 e4m3 matrices kept FP8 with their 128x128 weight_scale_inv blocks (scaled in fp32 by "
                        "the FP8 kernels)");
  if (src.exact_f32 + src.exact_bf16 > 0)
    cv->notes.push_back(std::to_string(src.exact_f32 + src.exact_bf16) +
                        " FP8 e4m3 matrices indexed element-wise (kv_b_proj) converted exactly: " +
                        std::to_string(src.exact_f32) + " to F32 (block scales not all powers of two), " +
                        std::to_string(src.exact_bf16) + " to BF16 (power-of-two block scales)");
  if (src.dequantised > 0)
    cv->notes.push_back(std::to_string(src.dequantised) +
                        " FP8 e4m3 routed-expert matrices dequantised with their 128x128 weight_scale_inv blocks to BF16");
  if (format == ExpertFormat::kMxfp4)
    cv->notes.push_back("routed experts requantised from BF16 to MXFP4 (model.md section 7)");
  return cv;
}

namespace {

// Converts each tensor when the loader asks for it. Outputs made together
// with the one asked for (an MXFP4 stack's scales) wait until asked for.
// Outputs whose published bytes are already what the kernels read
// (Recipe::in_place) are handed out in place: views into the shards'
// read-only mappings, with the conversion (which owns those mappings) as
// their HeldTensor::mapping, so that the weights keep the shards mapped.
class ConvertingSource final : public TensorSource {
 public:
  explicit ConvertingSource(std::unique_ptr<Conversion> cv) : cv_(std::move(cv)) {
    for (size_t r = 0; r < cv_->recipes.size(); ++r)
      for (size_t o = 0; o < cv_->recipes[r].outs.size(); ++o) where_[cv_->recipes[r].outs[o].name] = {r, o};
  }

  Result<HeldTensor> Get(const std::string& name) override {
    if (auto p = pending_.find(name); p != pending_.end()) {
      HeldTensor h = std::move(p->second);
      pending_.erase(p);
      return h;
    }
    auto w = where_.find(name);
    if (w == where_.end()) return Fail(Error::NotFound("DeepSeek-V3.2 conversion: no tensor '" + name + "'"));
    const Recipe& recipe = cv_->recipes[w->second.first];
    if (!recipe.in_place.empty()) return InPlace(recipe, w->second.second);
    std::vector<HeldTensor> made(recipe.outs.size());
    std::vector<uint8_t*> dst;
    for (size_t o = 0; o < recipe.outs.size(); ++o) {
      const Output& out = recipe.outs[o];
      // Weight memory, not zeroed: every recipe writes its outputs whole.
      made[o].storage = kernels::WeightBuffer(out.nbytes());
      made[o].view = TensorView{out.name, out.dtype, out.shape, made[o].storage.data(), out.nbytes(), &cv_->published_name};
      dst.push_back(made[o].storage.data());
    }
    MOE_TRY(recipe.fill(dst));
    for (size_t o = 0; o < made.size(); ++o)
      if (o != w->second.second) pending_[recipe.outs[o].name] = std::move(made[o]);
    return std::move(made[w->second.second]);
  }

 private:
  Result<HeldTensor> InPlace(const Recipe& recipe, size_t asked) {
    MOE_TRY(recipe.check());
    std::vector<HeldTensor> made(recipe.outs.size());
    for (size_t o = 0; o < recipe.outs.size(); ++o) {
      const Output& out = recipe.outs[o];
      const TensorView* t = recipe.in_place[o];
      if (t->nbytes != out.nbytes())  // the plan's own invariant
        return Fail(Error::Internal("DeepSeek-V3.2 conversion: '" + out.name + "' planned in place from '" + t->name +
                                    "' of another size"));
      made[o].view = TensorView{out.name, out.dtype, out.shape, t->data, t->nbytes, &cv_->published_name};
      made[o].mapping = cv_;
    }
    for (size_t o = 0; o < made.size(); ++o)
      if (o != asked) pending_[recipe.outs[o].name] = std::move(made[o]);
    return std::move(made[asked]);
  }

  std::shared_ptr<Conversion> cv_;
  std::map<std::string, std::pair<size_t, size_t>> where_;  // output name -> (recipe, output)
  std::map<std::string, HeldTensor> pending_;
};

// A directory WriteConverted made: its checkpoint is the engine's already.
Result<ModelDir> OpenConverted(const std::string& dir, Config cfg, std::optional<ExpertFormat> experts) {
  const ExpertFormat held = *cfg.converted_experts;
  if (experts && *experts != held)
    return Fail(Error::InvalidArgument("experts: " + std::string(ExpertFormatName(*experts)) + " requested, but " + dir +
                                       " holds its routed experts converted to " + std::string(ExpertFormatName(held)) +
                                       " (config.json: moeserve_converted)"));
  cfg.model.expert_format = held;
  MOE_ASSIGN_OR_RETURN(Checkpoint checkpoint, Checkpoint::Open(dir));
  std::vector<std::string> notes = {"checkpoint converted before (routed experts " + std::string(ExpertFormatName(held)) +
                                    "): mapped as it is"};
  MOE_TRY(ValidateCheckpoint(checkpoint, cfg.model, &notes));
  ModelDir out{.path = dir,
               .config = cfg.model,
               .checkpoint = std::move(checkpoint),
               .tokenizer = Tokenizer::Builtin(cfg.model.vocab_size),
               .warnings = std::move(notes),
               .family = kModelType,
               .source = nullptr};
  return out;
}

}  // namespace

Result<ModelDir> OpenDir(const std::string& dir, std::optional<ExpertFormat> experts) {
  MOE_ASSIGN_OR_RETURN(Config cfg, LoadConfig(dir));
  if (cfg.converted_experts) return OpenConverted(dir, std::move(cfg), experts);
  MOE_ASSIGN_OR_RETURN(std::unique_ptr<Conversion> cv, detail::PlanDir(dir, experts));
  // One safetensors image of the exact size, each tensor converted straight
  // into its place (no second copy).
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  uint64_t data = 0;
  for (const Recipe& r : cv->recipes)
    for (const Output& o : r.outs) {
      header[o.name] = {{"dtype", DTypeName(o.dtype)}, {"shape", o.shape}, {"data_offsets", {data, data + o.nbytes()}}};
      data += o.nbytes();
    }
  std::string text = header.dump();
  while ((8 + text.size()) % 8) text.push_back(' ');
  std::vector<uint8_t> image(8 + text.size() + data);
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) image[static_cast<size_t>(i)] = static_cast<uint8_t>(n >> (8 * i));
  std::memcpy(image.data() + 8, text.data(), text.size());
  size_t at = 8 + text.size();
  for (const Recipe& r : cv->recipes) {
    std::vector<uint8_t*> dst;
    for (const Output& o : r.outs) {
      dst.push_back(image.data() + at);
      at += o.nbytes();
    }
    MOE_TRY(r.fill(dst));
  }
  MOE_ASSIGN_OR_RETURN(Checkpoint converted, Checkpoint::FromImage(dir + " (DeepSeek-V3.2, converted)", std::move(image)));
  MOE_TRY(ValidateCheckpoint(converted, cv->cfg.model, &cv->notes));
  ModelDir out{.path = dir,
               .config = cv->cfg.model,
               .checkpoint = std::move(converted),
               .tokenizer = Tokenizer::Builtin(cv->cfg.model.vocab_size),
               .warnings = std::move(cv->notes),
               .family = kModelType,
               .source = nullptr};
  return out;
}

Result<ModelDir> OpenDirStreamed(const std::string& dir, std::optional<ExpertFormat> experts) {
  MOE_ASSIGN_OR_RETURN(Config cfg, LoadConfig(dir));
  if (cfg.converted_experts) return OpenConverted(dir, std::move(cfg), experts);
  MOE_ASSIGN_OR_RETURN(std::unique_ptr<Conversion> cv, detail::PlanDir(dir, experts));
  MapShardsOnHugePages(cv->published);
  ModelDir out{.path = dir,
               .config = cv->cfg.model,
               .checkpoint = Checkpoint(),
               .tokenizer = Tokenizer::Builtin(cv->cfg.model.vocab_size),
               .warnings = cv->notes,
               .family = kModelType,
               .source = nullptr};
  out.source = std::make_shared<ConvertingSource>(std::move(cv));
  return out;
}

}  // namespace moeserve::engine::deepseek_v32
