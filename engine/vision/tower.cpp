#include "vision/tower.hpp"

#include <algorithm>
#include <cmath>

#include "layers.hpp"

namespace moeserve::engine {
namespace {

// One axis of the tent filter: for each output sample, the first input
// sample it reads and its normalised weights.
struct AxisFilter {
  std::vector<int> first, count;
  std::vector<float> weights;  // count[i] weights for output i, concatenated
  std::vector<size_t> offset;  // where output i's weights start
};

AxisFilter TentFilter(int n, int o) {
  AxisFilter f;
  const double r = static_cast<double>(n) / o, support = std::max(r, 1.0);
  for (int i = 0; i < o; ++i) {
    const double c = (i + 0.5) * r;
    const int lo = std::max(0, static_cast<int>(std::floor(c - support - 0.5)));
    const int hi = std::min(n, static_cast<int>(std::ceil(c + support + 0.5)));
    std::vector<double> w;
    double total = 0;
    for (int j = lo; j < hi; ++j) {
      const double v = std::max(0.0, 1.0 - std::fabs(j + 0.5 - c) / support);
      w.push_back(v);
      total += v;
    }
    f.first.push_back(lo);
    f.count.push_back(hi - lo);
    f.offset.push_back(f.weights.size());
    for (double v : w) f.weights.push_back(static_cast<float>(v / total));
  }
  return f;
}

// y = x + b per row.
void AddBias(float* y, const std::vector<float>& b, int rows) {
  const size_t d = b.size();
  for (int r = 0; r < rows; ++r)
    for (size_t i = 0; i < d; ++i) y[static_cast<size_t>(r) * d + i] += b[i];
}

}  // namespace

std::vector<float> ResizeImage(const ImageInput& image, int out_w, int out_h) {
  const int W = static_cast<int>(image.width), H = static_cast<int>(image.height);
  const uint8_t* src = image.rgb->data();
  const AxisFilter fx = TentFilter(W, out_w), fy = TentFilter(H, out_h);
  // Horizontal pass: [H, out_w, 3].
  std::vector<float> tmp(static_cast<size_t>(H) * out_w * 3);
  for (int y = 0; y < H; ++y)
    for (int i = 0; i < out_w; ++i) {
      float acc[3] = {0, 0, 0};
      const float* w = &fx.weights[fx.offset[static_cast<size_t>(i)]];
      for (int k = 0; k < fx.count[static_cast<size_t>(i)]; ++k) {
        const uint8_t* px = src + (static_cast<size_t>(y) * W + fx.first[static_cast<size_t>(i)] + k) * 3;
        for (int c = 0; c < 3; ++c) acc[c] += w[k] * static_cast<float>(px[c]);
      }
      for (int c = 0; c < 3; ++c) tmp[(static_cast<size_t>(y) * out_w + i) * 3 + c] = acc[c];
    }
  // Vertical pass: [out_h, out_w, 3].
  std::vector<float> out(static_cast<size_t>(out_h) * out_w * 3, 0.0f);
  for (int o = 0; o < out_h; ++o) {
    const float* w = &fy.weights[fy.offset[static_cast<size_t>(o)]];
    float* row = &out[static_cast<size_t>(o) * out_w * 3];
    for (int k = 0; k < fy.count[static_cast<size_t>(o)]; ++k) {
      const float* in = &tmp[static_cast<size_t>(fy.first[static_cast<size_t>(o)] + k) * out_w * 3];
      for (int i = 0; i < out_w * 3; ++i) row[i] += w[k] * in[i];
    }
  }
  return out;
}

Result<std::vector<float>> RunVisionTower(const VisionConfig& v, const VisionWeights& vw, int model_hidden,
                                          const kernels::KernelSet& ks, const ImageInput& image) {
  if (!image.rgb || image.rgb->size() != static_cast<size_t>(image.width) * image.height * 3)
    return Fail(Error::InvalidArgument("image: pixel buffer does not match its size"));
  MOE_ASSIGN_OR_RETURN(ImageGrid grid, ImageGridFor(v, image.width, image.height));
  const int p = v.patch_size, m = v.merge_size, gh = grid.grid_h, gw = grid.grid_w;
  const int N = grid.patches(), Dv = v.hidden_size, heads = v.num_heads, hd = v.head_dim(), pd = v.patch_dim();
  const float eps = static_cast<float>(v.norm_eps);

  // 14.2: resize, normalise, cut into patches in merge order.
  const std::vector<float> img = ResizeImage(image, gw * p, gh * p);
  std::vector<float> patches(static_cast<size_t>(N) * pd);
  std::vector<int> prow(static_cast<size_t>(N)), pcol(static_cast<size_t>(N));
  float mean[3], std_dev[3];
  for (int c = 0; c < 3; ++c) {
    mean[c] = static_cast<float>(v.image_mean[c]);
    std_dev[c] = static_cast<float>(v.image_std[c]);
  }
  int n = 0;
  for (int bh = 0; bh < gh / m; ++bh)
    for (int bw = 0; bw < gw / m; ++bw)
      for (int dy = 0; dy < m; ++dy)
        for (int dx = 0; dx < m; ++dx, ++n) {
          const int r = bh * m + dy, col = bw * m + dx;
          prow[static_cast<size_t>(n)] = r;
          pcol[static_cast<size_t>(n)] = col;
          float* out = &patches[static_cast<size_t>(n) * pd];
          for (int ch = 0; ch < 3; ++ch)
            for (int ky = 0; ky < p; ++ky)
              for (int kx = 0; kx < p; ++kx) {
                const float px = img[((static_cast<size_t>(r) * p + ky) * (static_cast<size_t>(gw) * p) +
                                      static_cast<size_t>(col) * p + kx) * 3 + ch];
                out[(ch * p + ky) * p + kx] = (px / 255.0f - mean[ch]) / std_dev[ch];
              }
        }

  // 14.4: patch embedding.
  std::vector<float> h(static_cast<size_t>(N) * Dv);
  Linear(vw.patch_embed, patches.data(), N, h.data(), ks);
  AddBias(h.data(), vw.patch_bias, N);

  // 2D RoPE angles: [N, hd/2], rows in the first hd/4, columns in the rest.
  const int quarter = hd / 4, half = hd / 2;
  std::vector<float> freqs(static_cast<size_t>(quarter));
  for (int i = 0; i < quarter; ++i)
    freqs[static_cast<size_t>(i)] = static_cast<float>(1.0 / std::pow(v.rope_theta, 4.0 * i / hd));
  std::vector<float> cos_t(static_cast<size_t>(N) * half), sin_t(cos_t.size());
  for (int t = 0; t < N; ++t)
    for (int j = 0; j < half; ++j) {
      const float pos = static_cast<float>(j < quarter ? prow[static_cast<size_t>(t)] : pcol[static_cast<size_t>(t)]);
      const float ang = pos * freqs[static_cast<size_t>(j % quarter)];
      cos_t[static_cast<size_t>(t) * half + j] = std::cos(ang);
      sin_t[static_cast<size_t>(t) * half + j] = std::sin(ang);
    }
  auto rope = [&](float* x, int t) {  // one head's hd floats of token t
    const float* c = &cos_t[static_cast<size_t>(t) * half];
    const float* s = &sin_t[static_cast<size_t>(t) * half];
    for (int j = 0; j < half; ++j) {
      const float a = x[j], b = x[j + half];
      x[j] = a * c[j] - b * s[j];
      x[j + half] = b * c[j] + a * s[j];
    }
  };

  std::vector<float> a(h.size()), qkv(static_cast<size_t>(N) * 3 * Dv), o(h.size()), branch(h.size());
  std::vector<float> qh(static_cast<size_t>(N) * hd), kh(qh.size()), vt(qh.size()), oh(qh.size());
  std::vector<float> scores(static_cast<size_t>(N) * N);
  std::vector<float> g1(static_cast<size_t>(N) * v.intermediate_size), g3(g1.size());
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (const VisionBlockWeights& b : vw.blocks) {
    for (int t = 0; t < N; ++t) ks.rms_norm(&h[static_cast<size_t>(t) * Dv], b.norm1.data(), eps, Dv, &a[static_cast<size_t>(t) * Dv]);
    Linear(b.qkv, a.data(), N, qkv.data(), ks);
    AddBias(qkv.data(), b.qkv_bias, N);
    for (int head = 0; head < heads; ++head) {
      // Gather the head: Q, K [N, hd] (rotated), V^T [hd, N].
      for (int t = 0; t < N; ++t) {
        const float* row = &qkv[static_cast<size_t>(t) * 3 * Dv + static_cast<size_t>(head) * hd];
        std::copy_n(row, hd, &qh[static_cast<size_t>(t) * hd]);
        std::copy_n(row + Dv, hd, &kh[static_cast<size_t>(t) * hd]);
        for (int d = 0; d < hd; ++d) vt[static_cast<size_t>(d) * N + t] = row[2 * Dv + d];
        rope(&qh[static_cast<size_t>(t) * hd], t);
        rope(&kh[static_cast<size_t>(t) * hd], t);
      }
      // scores[t, s] = q_t . k_s: a GEMM with K as the weight matrix.
      ks.matmul_f32(kh.data(), static_cast<size_t>(N), static_cast<size_t>(hd), qh.data(), static_cast<size_t>(N), scores.data());
      for (int t = 0; t < N; ++t) {
        float* srow = &scores[static_cast<size_t>(t) * N];
        float mx = -INFINITY;
        for (int s = 0; s < N; ++s) mx = std::max(mx, srow[s] * scale);
        float sum = 0;
        for (int s = 0; s < N; ++s) {
          srow[s] = std::exp(srow[s] * scale - mx);
          sum += srow[s];
        }
        const float inv = 1.0f / sum;
        for (int s = 0; s < N; ++s) srow[s] *= inv;
      }
      // o_t = sum_s P[t, s] v_s: a GEMM with V^T as the weight matrix.
      ks.matmul_f32(vt.data(), static_cast<size_t>(hd), static_cast<size_t>(N), scores.data(), static_cast<size_t>(N), oh.data());
      for (int t = 0; t < N; ++t)
        std::copy_n(&oh[static_cast<size_t>(t) * hd], hd, &o[static_cast<size_t>(t) * Dv + static_cast<size_t>(head) * hd]);
    }
    Linear(b.proj, o.data(), N, branch.data(), ks);
    AddBias(branch.data(), b.proj_bias, N);
    for (size_t i = 0; i < h.size(); ++i) h[i] += branch[i];
    for (int t = 0; t < N; ++t) ks.rms_norm(&h[static_cast<size_t>(t) * Dv], b.norm2.data(), eps, Dv, &a[static_cast<size_t>(t) * Dv]);
    Linear(b.w1, a.data(), N, g1.data(), ks);
    Linear(b.w3, a.data(), N, g3.data(), ks);
    ks.silu_mul(g1.data(), g3.data(), g1.data(), g1.size());
    Linear(b.w2, g1.data(), N, branch.data(), ks);
    for (size_t i = 0; i < h.size(); ++i) h[i] += branch[i];
  }
  for (int t = 0; t < N; ++t) ks.rms_norm(&h[static_cast<size_t>(t) * Dv], vw.norm.data(), eps, Dv, &h[static_cast<size_t>(t) * Dv]);

  // Merge: consecutive m*m rows are one token (the rows are already in merge
  // order, so [N, Dv] is [N / m^2, m^2 Dv] as it lies). Then the projector.
  const int T = N / (m * m);
  std::vector<float> u(static_cast<size_t>(T) * v.projector_hidden_size);
  Linear(vw.proj1, h.data(), T, u.data(), ks);
  AddBias(u.data(), vw.proj1_bias, T);
  for (float& x : u) x = 0.5f * x * (1.0f + std::erf(x * static_cast<float>(M_SQRT1_2)));
  std::vector<float> e(static_cast<size_t>(T) * model_hidden);
  Linear(vw.proj2, u.data(), T, e.data(), ks);
  AddBias(e.data(), vw.proj2_bias, T);
  return e;
}

}  // namespace moeserve::engine
