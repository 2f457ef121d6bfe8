"""fp32 golden reference of the `moe-dsa-v1` family (model.md, normative).

Reads top to bottom like the spec: config (section 2), checkpoint (1.1),
block (3), YaRN RoPE (4), gated MLA / DSA / Gated DeltaNet (5), MoE (6).
Every position is computed (full causal prefill, O(T^2) attention). A
sequence may also be fed in pieces with a per-layer cache holding exactly the
state model.md allows (MLA: c and k_pe; DSA: also the indexer key; DeltaNet:
conv history and S); feeding a prompt whole or token by token gives the same
numbers, which is how the CLI decodes quickly.

Where model.md is silent the public references decide: DeepSeek-V3.2-Exp
inference/model.py (MLA, indexer, gate, YaRN) and flash-linear-attention
(Gated DeltaNet); the choices made are listed in README.md.

All weights are converted to fp32 once at load (BF16 exactly, MXFP4 experts
dequantised by mxfp4.decode; BF16 experts, model.md 1.2, widened like every
BF16 tensor); all math runs in fp32.
"""

import json
import math
import os

import torch
import torch.nn.functional as F

import mxfp4
import vision
from safetensors_io import read_checkpoint

NUM_BYTE_TOKENS = 256
NUM_SPECIAL_TOKENS = 12
FIRST_PADDING_ID = NUM_BYTE_TOKENS + NUM_SPECIAL_TOKENS  # 268: ids >= this are padding
LAYER_KINDS = ("mla", "dsa", "delta")


class ModelError(ValueError):
    pass


# ----------------------------------------------------------------------------
# Section 2: config.json
# ----------------------------------------------------------------------------


class Config:
    """config.json, validated as model.md section 2 (errors name the field)."""

    def __init__(self, raw):
        self.raw = raw

        def get(path, section=None):
            d = raw if section is None else raw.get(section)
            field = path if section is None else f"{section}.{path}"
            if not isinstance(d, dict) or path not in d:
                raise ModelError(f"config.json: missing field {field}")
            return d[path]

        self.vocab_size = int(get("vocab_size"))
        self.hidden_size = int(get("hidden_size"))
        self.num_layers = int(get("num_layers"))
        self.layer_types = list(get("layer_types"))
        self.first_dense_layers = int(get("first_dense_layers"))
        self.intermediate_size = int(get("intermediate_size"))
        self.rms_norm_eps = float(get("rms_norm_eps"))
        self.max_position_embeddings = int(get("max_position_embeddings"))

        # Section 14: the optional vision tower.
        self.vision = vision.VisionConfig(raw["vision"], self.vocab_size) if "vision" in raw else None

        if raw.get("architecture", "moe-dsa-v1") != "moe-dsa-v1":
            raise ModelError(f"config.json: architecture {raw.get('architecture')!r} is not moe-dsa-v1")
        if len(self.layer_types) != self.num_layers:
            raise ModelError(
                f"config.json: layer_types has {len(self.layer_types)} entries, num_layers is {self.num_layers}"
            )
        for i, kind in enumerate(self.layer_types):
            if kind not in LAYER_KINDS:
                raise ModelError(f"config.json: layer_types[{i}] = {kind!r} is not one of {LAYER_KINDS}")
        if self.vocab_size < FIRST_PADDING_ID:
            raise ModelError(f"config.json: vocab_size {self.vocab_size} < {FIRST_PADDING_ID}")
        if self.hidden_size % 32 != 0:
            raise ModelError(f"config.json: hidden_size {self.hidden_size} is not a multiple of 32")

        uses_mla = any(k in ("mla", "dsa") for k in self.layer_types)
        if uses_mla:
            self.n_heads = int(get("num_heads", "mla"))
            self.q_lora_rank = int(get("q_lora_rank", "mla"))
            self.kv_lora_rank = int(get("kv_lora_rank", "mla"))
            self.qk_nope_head_dim = int(get("qk_nope_head_dim", "mla"))
            self.qk_rope_head_dim = int(get("qk_rope_head_dim", "mla"))
            self.v_head_dim = int(get("v_head_dim", "mla"))
            self.output_gate = bool(raw["mla"].get("output_gate", False))
            if self.qk_rope_head_dim % 2 != 0:
                raise ModelError(f"config.json: mla.qk_rope_head_dim {self.qk_rope_head_dim} is not even")
        if "dsa" in self.layer_types:
            self.index_n_heads = int(get("index_n_heads", "dsa"))
            self.index_head_dim = int(get("index_head_dim", "dsa"))
            self.index_topk = int(get("index_topk", "dsa"))
            if self.index_head_dim % 2 != 0:
                raise ModelError(f"config.json: dsa.index_head_dim {self.index_head_dim} is not even")
            if self.index_head_dim < self.qk_rope_head_dim:
                raise ModelError(
                    f"config.json: dsa.index_head_dim {self.index_head_dim} < mla.qk_rope_head_dim "
                    f"{self.qk_rope_head_dim}"
                )
            if self.index_topk < 1:
                raise ModelError(f"config.json: dsa.index_topk {self.index_topk} < 1")
        if "delta" in self.layer_types:
            self.delta_heads = int(get("num_heads", "delta"))
            self.head_k_dim = int(get("head_k_dim", "delta"))
            self.head_v_dim = int(get("head_v_dim", "delta"))
            self.conv_size = int(get("conv_size", "delta"))
            self.delta_norm_eps = float(get("norm_eps", "delta"))
            if self.conv_size < 1:
                raise ModelError(f"config.json: delta.conv_size {self.conv_size} < 1")
        if self.num_layers > self.first_dense_layers:
            self.n_experts = int(get("num_experts", "moe"))
            self.experts_per_token = int(get("experts_per_token", "moe"))
            self.n_shared_experts = int(get("num_shared_experts", "moe"))
            self.moe_inter = int(get("moe_intermediate_size", "moe"))
            self.n_group = int(get("n_group", "moe"))
            self.topk_group = int(get("topk_group", "moe"))
            self.routed_scaling_factor = float(get("routed_scaling_factor", "moe"))
            self.score_func = str(get("score_func", "moe"))
            if self.score_func not in ("sigmoid", "softmax"):
                raise ModelError(f"config.json: moe.score_func {self.score_func!r} is not sigmoid or softmax")
            if self.moe_inter % 32 != 0:
                raise ModelError(f"config.json: moe.moe_intermediate_size {self.moe_inter} is not a multiple of 32")
            if self.n_group < 1 or self.n_experts % self.n_group != 0:
                raise ModelError(f"config.json: moe.num_experts {self.n_experts} % moe.n_group {self.n_group} != 0")
            if self.n_experts // self.n_group < 2:
                raise ModelError(f"config.json: moe.num_experts / moe.n_group < 2")
            if self.topk_group > self.n_group:
                raise ModelError(f"config.json: moe.topk_group {self.topk_group} > moe.n_group {self.n_group}")
            if self.topk_group * self.n_experts // self.n_group < self.experts_per_token:
                raise ModelError(f"config.json: moe.topk_group * num_experts / n_group < experts_per_token")

        # Section 1.2: how the routed experts are stored.
        q = raw.get("quantization", {"format": "mxfp4"})
        if not isinstance(q, dict):
            raise ModelError("config.json: quantization must be an object")
        self.expert_format = q.get("format")
        if self.expert_format == "mxfp4":
            if q.get("block_size", 32) != 32:
                raise ModelError(f"config.json: quantization.block_size {q.get('block_size')!r} must be 32")
        elif self.expert_format == "bf16":
            if "block_size" in q:
                raise ModelError("config.json: quantization.block_size has no meaning for format \"bf16\"")
        else:
            raise ModelError(f"config.json: quantization.format {self.expert_format!r} is not supported "
                             f"(expected \"mxfp4\" or \"bf16\")")
        if q.get("applies_to", ["experts"]) != ["experts"]:
            raise ModelError(f"config.json: quantization.applies_to {q.get('applies_to')!r} must be [\"experts\"]")

        rope = raw.get("rope", {})
        self.rope_theta = float(rope.get("theta", 10000.0))
        self.rope_scaling = rope.get("scaling")
        if self.rope_scaling not in (None, "none", "yarn"):
            raise ModelError(f"config.json: rope.scaling {self.rope_scaling!r} is not yarn or none")
        self.yarn = self.rope_scaling == "yarn"
        if self.yarn:
            self.rope_factor = float(get("factor", "rope"))
            self.original_max_position = int(get("original_max_position", "rope"))
            self.beta_fast = float(rope.get("beta_fast", 32))
            self.beta_slow = float(rope.get("beta_slow", 1))
            self.mscale = float(rope.get("mscale", 1.0))
            if self.max_position_embeddings > self.rope_factor * self.original_max_position:
                raise ModelError(
                    f"config.json: max_position_embeddings {self.max_position_embeddings} > rope.factor * "
                    f"rope.original_max_position"
                )

    @property
    def yarn_active(self):
        # DeepSeek applies both the frequency correction and the mscale^2
        # softmax factor only when max_seq_len > original_seq_len; we read
        # "YaRN is on" the same way.
        return self.yarn and self.max_position_embeddings > self.original_max_position

    @staticmethod
    def load(model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            return Config(json.load(f))


# ----------------------------------------------------------------------------
# Section 1.1: tensor names, shapes, dtypes
# ----------------------------------------------------------------------------


def expected_tensors(cfg):
    """{name: shape} of every tensor the config needs (model.md section 1.1)."""
    D, V = cfg.hidden_size, cfg.vocab_size
    t = {"embed.weight": (V, D), "norm.weight": (D,), "head.weight": (V, D)}
    for i, kind in enumerate(cfg.layer_types):
        p = f"layers.{i}."
        t[p + "attn_norm.weight"] = (D,)
        t[p + "ffn_norm.weight"] = (D,)
        if kind in ("mla", "dsa"):
            H, qk = cfg.n_heads, cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
            t[p + "attn.wq_a.weight"] = (cfg.q_lora_rank, D)
            t[p + "attn.q_norm.weight"] = (cfg.q_lora_rank,)
            t[p + "attn.wq_b.weight"] = (H * qk, cfg.q_lora_rank)
            t[p + "attn.wkv_a.weight"] = (cfg.kv_lora_rank + cfg.qk_rope_head_dim, D)
            t[p + "attn.kv_norm.weight"] = (cfg.kv_lora_rank,)
            t[p + "attn.wkv_b.weight"] = (H * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank)
            t[p + "attn.wo.weight"] = (D, H * cfg.v_head_dim)
            if cfg.output_gate:
                t[p + "attn.wg.weight"] = (H * cfg.v_head_dim, D)
        if kind == "dsa":
            IH, ID = cfg.index_n_heads, cfg.index_head_dim
            t[p + "attn.indexer.wq_b.weight"] = (IH * ID, cfg.q_lora_rank)
            t[p + "attn.indexer.wk.weight"] = (ID, D)
            t[p + "attn.indexer.k_norm.weight"] = (ID,)
            t[p + "attn.indexer.k_norm.bias"] = (ID,)
            t[p + "attn.indexer.weights_proj.weight"] = (IH, D)
        if kind == "delta":
            Hd, dk, dv, conv = cfg.delta_heads, cfg.head_k_dim, cfg.head_v_dim, cfg.conv_size
            t[p + "attn.q_proj.weight"] = (Hd * dk, D)
            t[p + "attn.k_proj.weight"] = (Hd * dk, D)
            t[p + "attn.v_proj.weight"] = (Hd * dv, D)
            t[p + "attn.a_proj.weight"] = (Hd, D)
            t[p + "attn.b_proj.weight"] = (Hd, D)
            t[p + "attn.g_proj.weight"] = (Hd * dv, D)
            t[p + "attn.o_proj.weight"] = (D, Hd * dv)
            t[p + "attn.q_conv1d.weight"] = (Hd * dk, conv)
            t[p + "attn.k_conv1d.weight"] = (Hd * dk, conv)
            t[p + "attn.v_conv1d.weight"] = (Hd * dv, conv)
            t[p + "attn.A_log"] = (Hd,)
            t[p + "attn.dt_bias"] = (Hd,)
            t[p + "attn.o_norm.weight"] = (dv,)
        if i < cfg.first_dense_layers:
            t[p + "ffn.w1.weight"] = (cfg.intermediate_size, D)
            t[p + "ffn.w3.weight"] = (cfg.intermediate_size, D)
            t[p + "ffn.w2.weight"] = (D, cfg.intermediate_size)
        else:
            E, I, S = cfg.n_experts, cfg.moe_inter, cfg.n_shared_experts * cfg.moe_inter
            t[p + "ffn.gate.weight"] = (E, D)
            t[p + "ffn.gate.bias"] = (E,)
            if cfg.expert_format == "bf16":  # section 1.2
                t[p + "ffn.experts.w13.weight"] = (E, 2 * I, D)
                t[p + "ffn.experts.w2.weight"] = (E, D, I)
            else:
                t[p + "ffn.experts.w13.blocks"] = (E, 2 * I, D // 32, 16)
                t[p + "ffn.experts.w13.scales"] = (E, 2 * I, D // 32)
                t[p + "ffn.experts.w2.blocks"] = (E, D, I // 32, 16)
                t[p + "ffn.experts.w2.scales"] = (E, D, I // 32)
            if S > 0:
                t[p + "ffn.shared.w1.weight"] = (S, D)
                t[p + "ffn.shared.w3.weight"] = (S, D)
                t[p + "ffn.shared.w2.weight"] = (D, S)
    if cfg.vision is not None:
        t.update(vision.expected_tensors(cfg.vision, D))
    return t


def allowed_dtypes(name):
    """model.md 1.1: norms, k_norm.bias, A_log, dt_bias, ffn.gate.bias are F32;
    MXFP4 experts (.blocks, .scales) U8, BF16 experts (.weight) BF16 only;
    everything else BF16 (F32 also accepted). The vision tower: section 14.3."""
    if name.startswith("vision."):
        return vision.allowed_dtypes(name)
    if name.endswith(("norm.weight", "k_norm.bias", ".A_log", ".dt_bias", "ffn.gate.bias")):
        return ("F32",)
    if ".ffn.experts." in name:
        return ("BF16",) if name.endswith(".weight") else ("U8",)
    return ("BF16", "F32")


def _expert_base(name):
    """layers.3.ffn.experts.w13 for ...w13.blocks, .scales or .weight; None
    for any other tensor."""
    if ".ffn.experts." not in name:
        return None
    for suffix in (".blocks", ".scales", ".weight"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return None


def load_weights(model_dir, cfg):
    """{name: fp32 tensor}; routed experts are one fp32 tensor under the
    name without the .blocks/.scales (MXFP4, dequantised) or .weight (BF16)
    suffix (e.g. layers.3.ffn.experts.w13 [E, 2I, D])."""
    raw = read_checkpoint(model_dir)
    expected = expected_tensors(cfg)
    # An expert tensor of the other format means config and weights disagree.
    expert_bases = {_expert_base(n) for n in expected} - {None}
    for name in raw:
        if name not in expected and _expert_base(name) in expert_bases:
            raise ModelError(f"{raw[name].source}: tensor {name} holds routed experts in another format than "
                             f"config.json's quantization.format {cfg.expert_format!r}")
    weights = {}
    for name, shape in expected.items():
        if name not in raw:
            raise ModelError(f"{model_dir}: tensor {name} is missing")
        r = raw[name]
        if r.shape != tuple(shape):
            raise ModelError(f"{r.source}: tensor {name} has shape {list(r.shape)}, expected {list(shape)}")
        if r.dtype not in allowed_dtypes(name):
            raise ModelError(f"{r.source}: tensor {name} has dtype {r.dtype}, allowed: {allowed_dtypes(name)}")
        weights[name] = r.to_torch()
    for name in list(weights):
        if name.endswith(".blocks"):
            base = name[: -len(".blocks")]
            weights[base] = mxfp4.decode(weights.pop(name), weights.pop(base + ".scales"), name=base)
        elif _expert_base(name) is not None and name.endswith(".weight"):
            weights[_expert_base(name)] = weights.pop(name)
    return weights


# ----------------------------------------------------------------------------
# Section 3: norms and the dense FFN
# ----------------------------------------------------------------------------


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def layer_norm(x, w, b, eps):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


def swiglu(x, w1, w3, w2):
    return (F.silu(x @ w1.T) * (x @ w3.T)) @ w2.T


# ----------------------------------------------------------------------------
# Section 4: RoPE with YaRN
# ----------------------------------------------------------------------------


def rope_frequencies(cfg):
    """freqs_j, j < d/2, for d = qk_rope_head_dim (DeepSeek precompute_freqs_cis)."""
    d = cfg.qk_rope_head_dim
    base = cfg.rope_theta
    freqs = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    if cfg.yarn_active:

        def correction_dim(r):
            return d * math.log(cfg.original_max_position / (r * 2 * math.pi)) / (2 * math.log(base))

        low = max(math.floor(correction_dim(cfg.beta_fast)), 0)
        high = min(math.ceil(correction_dim(cfg.beta_slow)), d - 1)
        if low == high:
            high += 0.001  # DeepSeek's linear_ramp_factor guard against 0/0
        ramp = ((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
        smooth = 1 - ramp
        freqs = freqs / cfg.rope_factor * (1 - smooth) + freqs * smooth
    return freqs


def rope_angles(freqs, positions):
    """cos, sin [T, d/2] of angle p * freqs_j (outer product in fp32 like torch.outer in DeepSeek)."""
    ang = torch.outer(positions.to(torch.float32), freqs)
    return torch.cos(ang), torch.sin(ang)


def rope_interleaved(x, cos, sin):
    """MLA: dims (2j, 2j+1) rotate together. x [T, ..., d], cos/sin [T, d/2]."""
    shape = x.shape
    x = x.reshape(*shape[:-1], -1, 2)
    c = cos.reshape(cos.shape[0], *([1] * (x.dim() - 3)), cos.shape[1])
    s = sin.reshape(c.shape)
    a, b = x[..., 0], x[..., 1]
    return torch.stack([a * c - b * s, a * s + b * c], dim=-1).reshape(shape)


def rope_half_split(x, cos, sin):
    """Indexer: dims (j, j + d/2) rotate together (DeepSeek's Nov 2025 fix)."""
    half = x.shape[-1] // 2
    c = cos.reshape(cos.shape[0], *([1] * (x.dim() - 2)), cos.shape[1])
    s = sin.reshape(c.shape)
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * c - b * s, a * s + b * c], dim=-1)


def mla_softmax_scale(cfg):
    scale = (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) ** -0.5
    if cfg.yarn_active:
        m = 0.1 * cfg.mscale * math.log(cfg.rope_factor) + 1.0
        scale = scale * m * m
    return scale


# ----------------------------------------------------------------------------
# Section 5.1 / 5.2: gated MLA and the DSA lightning indexer
# ----------------------------------------------------------------------------


def indexer_scores(W, p, cfg, x, qr, cos, sin, positions, cache):
    """I(t, s) = sum_j w_j ReLU(iq_j . ik_s) for the new queries t (rows)
    against every cached key s (columns), fp32; -inf where s > t.
    The indexer key ik of the new tokens is appended to cache["ik"]."""
    n = x.shape[0]
    IH, ID, R = cfg.index_n_heads, cfg.index_head_dim, cfg.qk_rope_head_dim
    iq = (qr @ W[p + "indexer.wq_b.weight"].T).view(n, IH, ID)
    iq = torch.cat([rope_half_split(iq[..., :R], cos, sin), iq[..., R:]], dim=-1)
    ik = layer_norm(x @ W[p + "indexer.wk.weight"].T, W[p + "indexer.k_norm.weight"], W[p + "indexer.k_norm.bias"], 1e-6)
    ik = torch.cat([rope_half_split(ik[..., :R], cos, sin), ik[..., R:]], dim=-1)
    ik = _append(cache, "ik", ik)  # [S, ID], one key head shared by all index heads
    w = (x @ W[p + "indexer.weights_proj.weight"].T) * (IH**-0.5) * (ID**-0.5)  # [n, IH]
    dots = torch.relu(torch.einsum("tjd,sd->tjs", iq, ik))  # [n, IH, S]
    I = torch.einsum("tj,tjs->ts", w, dots)
    return I.masked_fill(~_causal(positions, ik.shape[0]), float("-inf"))


def dsa_select(I, topk, positions=None):
    """For each query t (row, at absolute position positions[r]): the
    k = min(topk, t+1) positions s <= t with the largest I(t, s), ties to the
    lower s. Returns (keep mask like I, selected lists, margins (I of the k-th
    minus the (k+1)-th, None when every s <= t is kept), max |I(t, s)| over s <= t)."""
    n = I.shape[0]
    if positions is None:
        positions = torch.arange(n)
    # Stable descending sort keeps equal scores in index order: lower s first.
    # Masked (s > t) entries are -inf and sort last.
    order_vals, order = torch.sort(I, dim=-1, descending=True, stable=True)
    keep = torch.zeros(I.shape, dtype=torch.bool)
    selected, margins, max_abs = [], [], []
    for r in range(n):
        t = int(positions[r])
        k = min(topk, t + 1)
        chosen = order[r, :k]
        keep[r, chosen] = True
        selected.append(sorted(chosen.tolist()))
        margins.append(float(order_vals[r, k - 1] - order_vals[r, k]) if k < t + 1 else None)
        max_abs.append(float(I[r, : t + 1].abs().max()))
    return keep, selected, margins, max_abs


def _append(cache, key, new):
    """Concatenate new rows to cache[key] (created on first use) and return all rows."""
    cache[key] = new if key not in cache else torch.cat([cache[key], new], dim=0)
    return cache[key]


def _causal(positions, n_keys):
    """[n_queries, n_keys] bool: key s visible from the query at position t iff s <= t."""
    return torch.arange(n_keys)[None, :] <= positions[:, None]


def mla_attention(W, p, cfg, x, positions, cache, dsa=False, absorbed=False):
    """Gated MLA for the new tokens x [n, D] (attn_norm'ed input) at absolute
    `positions`, attending to every earlier token. `cache` holds, per token,
    only what model.md 5.1 allows: the latent c and k_pe (plus the indexer key
    for DSA); the new tokens are appended to it.
    absorbed=False expands keys/values per head (the prefill "MHA" path);
    absorbed=True scores against the latent cache directly (the decode path).
    Returns (out [n, D], dsa info dict or None)."""
    n = x.shape[0]
    H, nope, R, vd = cfg.n_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
    eps = cfg.rms_norm_eps
    cos, sin = rope_angles(rope_frequencies(cfg), positions)

    qr = rms_norm(x @ W[p + "wq_a.weight"].T, W[p + "q_norm.weight"], eps)
    q = (qr @ W[p + "wq_b.weight"].T).view(n, H, nope + R)
    q_nope, q_pe = q[..., :nope], rope_interleaved(q[..., nope:], cos, sin)

    kv = x @ W[p + "wkv_a.weight"].T
    c = _append(cache, "c", rms_norm(kv[:, : cfg.kv_lora_rank], W[p + "kv_norm.weight"], eps))  # [S, kv_lora]
    k_pe = _append(cache, "k_pe", rope_interleaved(kv[:, cfg.kv_lora_rank :], cos, sin))  # [S, R], shared by heads
    wkv_b = W[p + "wkv_b.weight"].view(H, nope + vd, cfg.kv_lora_rank)
    w_uk, w_uv = wkv_b[:, :nope], wkv_b[:, nope:]  # [H, nope, kv_lora], [H, v, kv_lora]

    scale = mla_softmax_scale(cfg)
    if absorbed:
        q_lat = torch.einsum("thn,hnc->thc", q_nope, w_uk)  # W_uk^T q_nope
        scores = torch.einsum("thc,sc->hts", q_lat, c) + torch.einsum("thr,sr->hts", q_pe, k_pe)
    else:
        k_nope = torch.einsum("sc,hnc->shn", c, w_uk)
        scores = torch.einsum("thn,shn->hts", q_nope, k_nope) + torch.einsum("thr,sr->hts", q_pe, k_pe)
    scores = scores * scale

    visible = _causal(positions, c.shape[0])
    info = None
    if dsa:
        I = indexer_scores(W, p, cfg, x, qr, cos, sin, positions, cache)
        keep, selected, margins, max_abs = dsa_select(I, cfg.index_topk, positions)
        visible = visible & keep
        info = {"selected": selected, "margin": margins, "max_abs_score": max_abs}
    probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)  # [H, n, S]

    if absorbed:
        o_lat = torch.einsum("hts,sc->thc", probs, c)
        o = torch.einsum("thc,hvc->thv", o_lat, w_uv)
    else:
        v = torch.einsum("sc,hvc->shv", c, w_uv)
        o = torch.einsum("hts,shv->thv", probs, v)
    o = o.reshape(n, H * vd)
    if cfg.output_gate:
        o = o * torch.sigmoid(x @ W[p + "wg.weight"].T)
    return o @ W[p + "wo.weight"].T, info


def causal_depthwise_conv(u, w, history=None):
    """out_t[c] = sum_j w[c, j] u_{t-conv+1+j}[c], no bias. `history` holds
    the conv-1 inputs before u (zeros at the start of the sequence)."""
    T, conv = u.shape[0], w.shape[1]
    if history is None:
        history = u.new_zeros(conv - 1, u.shape[1])
    padded = torch.cat([history, u], dim=0)
    return sum(w[:, j] * padded[j : j + T] for j in range(conv))


def l2_normalize(x):
    return x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) + 1e-6)


def delta_rule_recurrent(q, k, v, beta, g, S=None):
    """fla naive_recurrent_gated_delta_rule. q, k [T, H, dk] (q already
    scaled by dk^-0.5), v [T, H, dv], beta, g [T, H], S the state
    [H, dk, dv] before the first step (zeros when None). Returns o [T, H, dv]
    and the final state."""
    T, H, dk = k.shape
    if S is None:
        S = q.new_zeros(H, dk, v.shape[-1])
    outs = []
    for t in range(T):
        S = torch.exp(g[t])[:, None, None] * S
        u = beta[t][:, None] * (v[t] - torch.einsum("hkv,hk->hv", S, k[t]))
        S = S + k[t][:, :, None] * u[:, None, :]
        outs.append(torch.einsum("hkv,hk->hv", S, q[t]))
    return torch.stack(outs), S


def delta_rule_chunked(q, k, v, beta, g, S=None, chunk=64):
    """The same recurrence in chunked (WY / UT-transform) form: a second
    oracle for engines that prefill chunk by chunk. Within a chunk with
    G_i = cumsum(g)_i and state S0 at its start,
      u_i = beta_i (v_i - e^{G_i} S0^T k_i - sum_{j<i} e^{G_i-G_j} (k_i.k_j) u_j)
    i.e. (I + A) U = beta * (V - e^G K S0), A strictly lower triangular,
      o_i = e^{G_i} S0^T q_i + sum_{j<=i} e^{G_i-G_j} (q_i.k_j) u_j
      S_end = e^{G_last} S0 + sum_j e^{G_last-G_j} k_j u_j^T."""
    T, H, dk = k.shape
    dv = v.shape[-1]
    pad = (-T) % chunk
    # Padded steps have k = 0, beta = 0, g = 0: they leave the state unchanged.
    q, k, v = (F.pad(a.permute(1, 0, 2), (0, 0, 0, pad)) for a in (q, k, v))  # [H, T', d]
    beta, g = (F.pad(a.T, (0, pad)) for a in (beta, g))  # [H, T']
    if S is None:
        S = q.new_zeros(H, dk, dv)
    eye = torch.eye(chunk, dtype=q.dtype)
    incl = torch.ones(chunk, chunk, dtype=torch.bool).tril()
    outs = []
    for c0 in range(0, T + pad, chunk):
        sl = slice(c0, c0 + chunk)
        qc, kc, vc, bc = q[:, sl], k[:, sl], v[:, sl], beta[:, sl]
        G = torch.cumsum(g[:, sl], dim=-1)  # [H, C]
        # e^{G_i - G_j} for j <= i, 0 above the diagonal (masked before exp).
        decay = torch.exp((G[:, :, None] - G[:, None, :]).masked_fill(~incl, float("-inf")))
        A = (bc[:, :, None] * decay * (kc @ kc.transpose(1, 2))).tril(-1)
        rhs = bc[:, :, None] * (vc - torch.exp(G)[:, :, None] * (kc @ S))
        U = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)
        outs.append(torch.exp(G)[:, :, None] * (qc @ S) + (decay * (qc @ kc.transpose(1, 2))) @ U)
        last = G[:, -1:]
        S = torch.exp(last)[:, :, None] * S + (kc * torch.exp(last - G)[:, :, None]).transpose(1, 2) @ U
    o = torch.cat(outs, dim=1)[:, :T].permute(1, 0, 2)
    return o, S


def gated_deltanet(W, p, cfg, x, cache, chunked=False):
    """Gated DeltaNet for the new tokens x [n, D] (normed input). `cache`
    holds the per-sequence state model.md 5.3 allows: the last conv-1 inputs
    of each conv and S; both are updated."""
    n = x.shape[0]
    Hd, dk, dv, keep = cfg.delta_heads, cfg.head_k_dim, cfg.head_v_dim, cfg.conv_size - 1

    def conv(name):
        u = x @ W[p + f"{name}_proj.weight"].T
        out = causal_depthwise_conv(u, W[p + f"{name}_conv1d.weight"], cache.get("conv_" + name))
        hist = torch.cat([cache.get("conv_" + name, u.new_zeros(keep, u.shape[1])), u], dim=0)
        cache["conv_" + name] = hist[hist.shape[0] - keep :]
        return F.silu(out)

    q = l2_normalize(conv("q").view(n, Hd, dk)) * dk**-0.5
    k = l2_normalize(conv("k").view(n, Hd, dk))
    v = conv("v").view(n, Hd, dv)
    beta = torch.sigmoid(x @ W[p + "b_proj.weight"].T)  # [n, Hd]
    g = -torch.exp(W[p + "A_log"]) * F.softplus(x @ W[p + "a_proj.weight"].T + W[p + "dt_bias"])
    o, cache["S"] = (delta_rule_chunked if chunked else delta_rule_recurrent)(q, k, v, beta, g, cache.get("S"))
    o = rms_norm(o, W[p + "o_norm.weight"], cfg.delta_norm_eps)  # per head over dv
    o = o * F.silu(x @ W[p + "g_proj.weight"].T).view(n, Hd, dv)
    return o.reshape(n, Hd * dv) @ W[p + "o_proj.weight"].T


# ----------------------------------------------------------------------------
# Section 6: MoE
# ----------------------------------------------------------------------------


def _top_indices(x, k):
    """Indices of the k largest entries along the last dim, ties to the lower
    index (stable descending sort)."""
    return torch.sort(x, dim=-1, descending=True, stable=True)[1][..., :k]


def moe_route(cfg, gate_w, gate_b, x):
    """DeepSeek Gate with group-limited selection. Returns (idx [T, K], w [T, K]).
    The bias only steers selection; weights use the unbiased scores."""
    logits = x @ gate_w.T
    s = torch.sigmoid(logits) if cfg.score_func == "sigmoid" else torch.softmax(logits, dim=-1)
    sb = s + gate_b
    T, E, G = x.shape[0], cfg.n_experts, cfg.n_group
    if G > 1:
        grouped = sb.view(T, G, E // G)
        group_score = torch.sort(grouped, dim=-1, descending=True)[0][..., :2].sum(-1)  # [T, G]
        keep_groups = _top_indices(group_score, cfg.topk_group)
        dropped = torch.ones(T, G, dtype=torch.bool, device=x.device).scatter_(1, keep_groups, False)
        sb = grouped.masked_fill(dropped[:, :, None], float("-inf")).view(T, E)
    idx = _top_indices(sb, cfg.experts_per_token)
    w = s.gather(1, idx)
    if cfg.score_func == "sigmoid":
        w = w / w.sum(-1, keepdim=True)
    return idx, w * cfg.routed_scaling_factor


def moe_ffn(W, p, cfg, x):
    I = cfg.moe_inter
    idx, w = moe_route(cfg, W[p + "gate.weight"], W[p + "gate.bias"], x)
    w13, w2 = W[p + "experts.w13"], W[p + "experts.w2"]  # [E, 2I, D], [E, D, I]
    y = torch.zeros_like(x)
    for e in range(cfg.n_experts):
        tok, slot = (idx == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        out = swiglu(x[tok], w13[e, :I], w13[e, I:], w2[e])
        y.index_add_(0, tok, w[tok, slot][:, None] * out)
    if cfg.n_shared_experts > 0:
        y = y + swiglu(x, W[p + "shared.w1.weight"], W[p + "shared.w3.weight"], W[p + "shared.w2.weight"])
    return y


# ----------------------------------------------------------------------------
# Section 3: the whole model
# ----------------------------------------------------------------------------


class Model:
    def __init__(self, cfg, weights):
        self.cfg = cfg
        self.W = weights

    @staticmethod
    def load(model_dir):
        cfg = Config.load(model_dir)
        return Model(cfg, load_weights(model_dir, cfg))

    def new_cache(self):
        """Per-layer state of one sequence (empty = nothing seen yet)."""
        return {"length": 0, "layers": [{} for _ in range(self.cfg.num_layers)]}

    def forward(self, tokens, cache=None, mla_absorbed=False, delta_chunked=False, images=None):
        """Run `tokens` (list of ids) after whatever `cache` has seen (a fresh
        sequence when None) and return (logits [len(tokens), V] fp32,
        {layer: dsa info for these tokens}). With an empty cache this is the
        plain full causal forward; feeding one token at a time with the same
        cache is greedy decoding, and gives the same numbers."""
        cfg, W = self.cfg, self.W
        if cache is None:
            cache = self.new_cache()
        image_ids = cfg.vision.token_ids if cfg.vision is not None else ()
        for i, tok in enumerate(tokens):
            if not ((0 <= tok < FIRST_PADDING_ID or tok in image_ids) and tok < cfg.vocab_size):
                raise ModelError(f"token {i} = {tok} is not a byte or special id (0..{FIRST_PADDING_ID - 1})")
        ids = torch.tensor(tokens, dtype=torch.long)
        positions = torch.arange(cache["length"], cache["length"] + len(tokens))
        cache["length"] += len(tokens)
        x = W["embed.weight"][ids]
        # Section 14.5: an image's tower rows replace its placeholders' embeddings.
        for offset, rows in images or ():
            n = rows.shape[0]
            if any(t != cfg.vision.image_token_id for t in tokens[offset:offset + n]) or offset + n > len(tokens):
                raise ModelError(f"image at {offset}: its {n} rows do not cover placeholder tokens")
            x[offset:offset + n] = rows
        dsa_info = {}
        for i, kind in enumerate(cfg.layer_types):
            p = f"layers.{i}."
            lc = cache["layers"][i]
            a = rms_norm(x, W[p + "attn_norm.weight"], cfg.rms_norm_eps)
            if kind == "delta":
                attn = gated_deltanet(W, p + "attn.", cfg, a, lc, chunked=delta_chunked)
            else:
                attn, info = mla_attention(
                    W, p + "attn.", cfg, a, positions, lc, dsa=(kind == "dsa"), absorbed=mla_absorbed
                )
                if info is not None:
                    dsa_info[i] = info
            h = x + attn
            f = rms_norm(h, W[p + "ffn_norm.weight"], cfg.rms_norm_eps)
            if i < cfg.first_dense_layers:
                ffn = swiglu(f, W[p + "ffn.w1.weight"], W[p + "ffn.w3.weight"], W[p + "ffn.w2.weight"])
            else:
                ffn = moe_ffn(W, p + "ffn.", cfg, f)
            x = h + ffn
        logits = rms_norm(x, W["norm.weight"], cfg.rms_norm_eps) @ W["head.weight"].T
        return logits, dsa_info
