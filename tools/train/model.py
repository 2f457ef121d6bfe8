"""Training form of `moe-dsa-v1` (docs/model-format.md sections 3 to 6).

The same math as tools/reference/model.py, batched over [B, T] and written for
autograd: expanded MLA, chunked (WY) Gated DeltaNet, MoE with group-limited
routing whose bias is balanced without an auxiliary loss (DeepSeek-V3: after
each step the bias of an overloaded expert goes down, an underloaded one up).

DSA: the lightning indexer reads detached inputs, so the language-model loss
never trains it; it learns by KL from the layer's own attention distribution
(summed over heads), first over every earlier token while the layer attends
densely (warm-up), then only over the selected top-k once the layer is sparse
(DeepSeek-V3.2's two stages).

Parameter names and shapes are the checkpoint's (section 1.1) except the
experts, held in fp32 as w13 [E, 2I, D] and w2 [E, D, I] (export quantises).
"""

import importlib.util
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

# The reference's model.py shares this file's name: load it under another one.
REFERENCE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference")
sys.path.insert(0, REFERENCE_DIR)
_spec = importlib.util.spec_from_file_location("reference_model", os.path.join(REFERENCE_DIR, "model.py"))
ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref)

Config = ref.Config


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def swiglu(x, w1, w3, w2):
    return (F.silu(x @ w1.T) * (x @ w3.T)) @ w2.T


def rope_interleaved(x, cos, sin):
    """x [B, T, ..., d]; cos/sin [T, d/2]; pairs (2j, 2j+1)."""
    shape = x.shape
    x = x.reshape(*shape[:-1], -1, 2)
    extra = x.dim() - 4  # dims between T and the pair index
    c = cos.view(cos.shape[0], *([1] * extra), cos.shape[1])
    s = sin.view(c.shape)
    a, b = x[..., 0], x[..., 1]
    return torch.stack([a * c - b * s, a * s + b * c], dim=-1).reshape(shape)


def rope_half_split(x, cos, sin):
    """x [B, T, ..., d]; pairs (j, j + d/2)."""
    half = x.shape[-1] // 2
    extra = x.dim() - 3
    c = cos.view(cos.shape[0], *([1] * extra), cos.shape[1])
    s = sin.view(c.shape)
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * c - b * s, a * s + b * c], dim=-1)


def delta_chunked(q, k, v, beta, g, chunk=64, S=None):
    """Batched fla chunked gated delta rule from state S [B, H, dk, dv] (zero
    when None). q, k [B, T, H, dk] (q scaled), v [B, T, H, dv], beta, g [B, T, H].
    Returns (o [B, T, H, dv], the state after the last position). Padded
    positions have beta = 0 and g = 0: they leave the state as it was."""
    B, T, H, dk = k.shape
    dv = v.shape[-1]
    pad = (-T) % chunk
    q, k, v = (F.pad(a.permute(0, 2, 1, 3), (0, 0, 0, pad)) for a in (q, k, v))  # [B, H, T', d]
    beta, g = (F.pad(a.permute(0, 2, 1), (0, pad)) for a in (beta, g))  # [B, H, T']
    if S is None:
        S = q.new_zeros(B, H, dk, dv)
    eye = torch.eye(chunk, dtype=q.dtype, device=q.device)
    incl = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    outs = []
    for c0 in range(0, T + pad, chunk):
        sl = slice(c0, c0 + chunk)
        qc, kc, vc, bc = q[:, :, sl], k[:, :, sl], v[:, :, sl], beta[:, :, sl]
        G = torch.cumsum(g[:, :, sl], dim=-1)
        diff = (G[..., :, None] - G[..., None, :]).masked_fill(~incl, float("-inf"))
        decay = torch.exp(diff)
        A = (bc[..., None] * decay * (kc @ kc.transpose(-1, -2))).tril(-1)
        rhs = bc[..., None] * (vc - torch.exp(G)[..., None] * (kc @ S))
        U = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)
        outs.append(torch.exp(G)[..., None] * (qc @ S) + (decay * (qc @ kc.transpose(-1, -2))) @ U)
        last = G[..., -1:]
        S = torch.exp(last)[..., None] * S + (kc * torch.exp(last - G)[..., None]).transpose(-1, -2) @ U
    return torch.cat(outs, dim=2)[:, :, :T].permute(0, 2, 1, 3), S


_vision = ref.vision  # the vision tower (model.md 14), as the reference computes it


def mtp_layers(cfg):
    return int(cfg.raw.get("num_nextn_predict_layers", 0))


def mtp_tensors(cfg):
    """{name: shape} of the multi-token-prediction layers (DeepSeek-V3's MTP;
    config num_nextn_predict_layers). Layer k, prefix mtp.k.: enorm, hnorm
    (RMSNorm of the next token's embedding and of the trunk's hidden state),
    eh_proj [D, 2D] (embedding half first), one pre-norm `mla` decoder block
    with a dense SwiGLU FFN (the tensor names and shapes of an mla layer's
    attention and of layer 0's dense FFN) and the final norm; the embedding
    and head.weight are the model's own."""
    n = mtp_layers(cfg)
    if n == 0:
        return {}
    if not any(k in ("mla", "dsa") for k in cfg.layer_types):
        raise ref.ModelError("config.json: num_nextn_predict_layers needs the mla section (the MTP block is an mla layer)")
    D = cfg.hidden_size
    H, qk = cfg.n_heads, cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    block = {
        "attn_norm.weight": (D,),
        "attn.wq_a.weight": (cfg.q_lora_rank, D),
        "attn.q_norm.weight": (cfg.q_lora_rank,),
        "attn.wq_b.weight": (H * qk, cfg.q_lora_rank),
        "attn.wkv_a.weight": (cfg.kv_lora_rank + cfg.qk_rope_head_dim, D),
        "attn.kv_norm.weight": (cfg.kv_lora_rank,),
        "attn.wkv_b.weight": (H * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank),
        "attn.wo.weight": (D, H * cfg.v_head_dim),
        "ffn_norm.weight": (D,),
        "ffn.w1.weight": (cfg.intermediate_size, D),
        "ffn.w3.weight": (cfg.intermediate_size, D),
        "ffn.w2.weight": (D, cfg.intermediate_size),
    }
    if cfg.output_gate:
        block["attn.wg.weight"] = (H * cfg.v_head_dim, D)
    out = {}
    for k in range(n):
        p = f"mtp.{k}."
        out[p + "enorm.weight"] = (D,)
        out[p + "hnorm.weight"] = (D,)
        out[p + "eh_proj.weight"] = (D, 2 * D)
        out.update({p + name: shape for name, shape in block.items()})
        out[p + "norm.weight"] = (D,)
    return out


def load_model_dir(model_dir, mtp_layers=None):
    """A TrainModel with a model directory's weights (tools/reference's loader:
    MXFP4 experts dequantised exactly, BF16 widened) and its MTP layers'
    tensors where the checkpoint has them. mtp_layers overrides the config's
    num_nextn_predict_layers (e.g. 1 to train a layer for a trunk shipped
    without one). Returns (model, names of the MTP tensors found)."""
    cfg = Config.load(model_dir)
    if mtp_layers is not None:
        cfg = Config(dict(cfg.raw, num_nextn_predict_layers=mtp_layers))
    model = TrainModel(cfg, 0)
    weights = ref.load_weights(model_dir, cfg)
    raw = ref.read_checkpoint(model_dir)
    found = []
    for name, shape in mtp_tensors(cfg).items():
        if name in raw:
            if raw[name].shape != tuple(shape):
                raise ref.ModelError(f"{raw[name].source}: tensor {name} has shape {list(raw[name].shape)}, "
                                     f"expected {list(shape)}")
            weights[name] = raw[name].to_torch()
            found.append(name)
    if found and len(found) != len(mtp_tensors(cfg)):
        missing = sorted(set(mtp_tensors(cfg)) - set(found))
        raise ref.ModelError(f"{model_dir}: MTP tensors missing: {missing[:3]}...")
    model.load_fp32(weights)
    return model, found


class _WeightView:
    """W[name] over a TrainModel's parameters, as tools/reference/vision.py reads weights."""

    def __init__(self, model):
        self.model = model

    def __getitem__(self, name):
        return self.model.W(name)


class TrainModel(nn.Module):
    def __init__(self, cfg, seed=0):
        super().__init__()
        self.cfg = cfg
        gen = torch.Generator().manual_seed(seed)
        self.p = nn.ParameterDict()
        self.gate_bias = {}
        for name, shape in ref.expected_tensors(cfg).items():
            if name.endswith(".scales"):
                continue
            if name.endswith(".blocks"):
                name, shape = name[: -len(".blocks")], (shape[0], shape[1], shape[2] * 32)
            elif ".experts." in name and name.endswith(".weight"):  # BF16 experts (model.md 1.2)
                name = name[: -len(".weight")]
            if name.endswith("ffn.gate.bias"):
                self.gate_bias[name] = torch.zeros(shape)  # balanced by update_bias, not by gradients
                continue
            self.p[name.replace(".", "__")] = nn.Parameter(self._init(name, shape, gen))
        # The multi-token-prediction layer (config num_nextn_predict_layers),
        # drawn from its own generator so that the trunk's draw is the same
        # with or without it.
        mtp_gen = torch.Generator().manual_seed(seed + 7919)
        for name, shape in mtp_tensors(cfg).items():
            self.p[name.replace(".", "__")] = nn.Parameter(self._init(name, shape, mtp_gen))
        freqs = ref.rope_frequencies(cfg)
        self.freqs = freqs

    @staticmethod
    def _init(name, shape, gen):
        if name.startswith("vision."):  # the vision tower (model.md 14.3): unit norms, zero biases
            if name.endswith(".bias"):
                return torch.zeros(shape)
            if name.endswith(("norm.weight", "norm1.weight", "norm2.weight")):
                return torch.ones(shape)
            return torch.randn(shape, generator=gen) / math.sqrt(shape[-1])
        if name.endswith("A_log"):
            return torch.log(1 + 15 * torch.rand(shape, generator=gen))
        if name.endswith("dt_bias"):
            dt = torch.exp(math.log(1e-3) + torch.rand(shape, generator=gen) * (math.log(0.1) - math.log(1e-3)))
            return dt + torch.log(-torch.expm1(-dt))
        if name.endswith("k_norm.bias"):
            return torch.zeros(shape)
        if name.endswith("norm.weight"):
            return torch.ones(shape)
        if name.endswith("conv1d.weight"):
            return torch.randn(shape, generator=gen) / math.sqrt(shape[-1])
        if name == "embed.weight":
            return torch.randn(shape, generator=gen)
        fan_in = shape[-1]
        std = 1 / math.sqrt(fan_in)
        if name.endswith(("wo.weight", "o_proj.weight", "w2.weight", "experts.w2")):
            std *= 0.5  # residual branches start small
        return torch.randn(shape, generator=gen) * std

    def W(self, name):
        if name in self.gate_bias:
            return self.gate_bias[name]
        return self.p[name.replace(".", "__")]

    def state_dict_fp32(self):
        """{checkpoint name (experts unquantised): fp32 tensor}, on the CPU
        whatever device the model trains on."""
        out = {k.replace("__", "."): v.detach().cpu().clone() for k, v in self.p.items()}
        out.update({k: v.cpu().clone() for k, v in self.gate_bias.items()})
        return out

    def to_device(self, device):
        """Moves the parameters, the balancing biases and the RoPE frequencies
        (plain tensors that nn.Module.to does not see)."""
        self.to(device)
        self.gate_bias = {k: v.to(device) for k, v in self.gate_bias.items()}
        self.freqs = self.freqs.to(device)
        return self

    def load_fp32(self, weights):
        with torch.no_grad():
            for k, v in weights.items():
                if k in self.gate_bias:
                    self.gate_bias[k] = v.clone().float()
                else:
                    self.p[k.replace(".", "__")].copy_(v)

    # ---- layers -------------------------------------------------------------
    # Every layer runs on new tokens x [B, T, D] at positions offset..offset+T-1.
    # `past` holds what an earlier call on positions 0..offset-1 (batch 1: the
    # shared prefix, in training the tools block every sequence starts with)
    # left for later tokens; `keep` collects what this call leaves. With
    # offset 0 and no past this is the plain forward over whole sequences.

    def mla(self, p, x, cos, sin, dsa_mode, aux, past=None, keep=None, offset=0):
        cfg, W = self.cfg, self.W
        B, T, _ = x.shape
        H, nope, R, vd, eps = cfg.n_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.rms_norm_eps
        qr = rms_norm(x @ W(p + "wq_a.weight").T, W(p + "q_norm.weight"), eps)
        q = (qr @ W(p + "wq_b.weight").T).view(B, T, H, nope + R)
        q_nope, q_pe = q[..., :nope], rope_interleaved(q[..., nope:], cos, sin)
        kv = x @ W(p + "wkv_a.weight").T
        c = rms_norm(kv[..., : cfg.kv_lora_rank], W(p + "kv_norm.weight"), eps)
        k_pe = rope_interleaved(kv[..., cfg.kv_lora_rank :], cos, sin)
        wkv_b = W(p + "wkv_b.weight").view(H, nope + vd, cfg.kv_lora_rank)
        k_nope = torch.einsum("bsc,hnc->bhsn", c, wkv_b[:, :nope])
        v = torch.einsum("bsc,hvc->bhsv", c, wkv_b[:, nope:])
        if keep is not None:
            keep.update(k_nope=k_nope, v=v, k_pe=k_pe)
        if past is not None:
            k_nope = torch.cat([past["k_nope"].expand(B, -1, -1, -1), k_nope], dim=2)
            v = torch.cat([past["v"].expand(B, -1, -1, -1), v], dim=2)
            k_pe = torch.cat([past["k_pe"].expand(B, -1, -1), k_pe], dim=1)
        S = k_pe.shape[1]
        scores = torch.einsum("bthn,bhsn->bhts", q_nope, k_nope) + torch.einsum("bthr,bsr->bhts", q_pe, k_pe)
        scores = scores * ref.mla_softmax_scale(cfg)
        dev = x.device
        causal = torch.arange(S, device=dev)[None, :] <= (offset + torch.arange(T, device=dev))[:, None]  # [T, S]
        visible = causal[None, None]
        if dsa_mode is not None:
            I = self.indexer(p, x.detach(), qr.detach(), cos, sin, past, keep)  # [B, T, S]
            I = I.masked_fill(~causal, float("-inf"))
            sel = causal[None]
            if dsa_mode == "sparse" and S > cfg.index_topk:
                top = self.select(I, cfg.index_topk)
                sel = torch.zeros(B, T, S, dtype=torch.bool, device=dev).scatter_(-1, top, True) & causal
                visible = sel[:, None]
            if self.indexer_kl:
                with torch.no_grad():
                    target = torch.softmax(scores.masked_fill(~visible, float("-inf")), -1).sum(1)
                    target = target / target.sum(-1, keepdim=True)
                logq = torch.log_softmax(I.masked_fill(~sel, float("-inf")), -1)
                kl = (target * (torch.log(target.clamp_min(1e-12)) - logq.masked_fill(~sel, 0))).sum(-1)  # [B, T]
                aux.setdefault("indexer_kl", []).append(kl)
        probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), -1)
        o = torch.einsum("bhts,bhsv->bthv", probs, v).reshape(B, T, H * vd)
        if cfg.output_gate:
            o = o * torch.sigmoid(x @ W(p + "wg.weight").T)
        return o @ W(p + "wo.weight").T

    # False: the indexers are not training (their KL to the attention is the
    # only thing that trains them), so the KL is not computed at all.
    indexer_kl = True

    # "exact": the inference's tie rule (stable sort, ties to the lower
    # position), used by the tests; training uses topk, several times faster,
    # whose order among exactly equal scores is unspecified.
    exact_ties = False

    def select(self, I, k):
        if self.exact_ties:
            return torch.sort(I, dim=-1, descending=True, stable=True)[1][..., :k]
        return torch.topk(I, k, dim=-1, sorted=False)[1]

    def indexer(self, p, x, qr, cos, sin, past=None, keep=None):
        cfg, W = self.cfg, self.W
        B, T, _ = x.shape
        IH, ID, R = cfg.index_n_heads, cfg.index_head_dim, cfg.qk_rope_head_dim
        iq = (qr @ W(p + "indexer.wq_b.weight").T).view(B, T, IH, ID)
        iq = torch.cat([rope_half_split(iq[..., :R], cos, sin), iq[..., R:]], dim=-1)
        ik = F.layer_norm(x @ W(p + "indexer.wk.weight").T, (ID,), W(p + "indexer.k_norm.weight"),
                          W(p + "indexer.k_norm.bias"), 1e-6)
        ik = torch.cat([rope_half_split(ik[..., :R], cos, sin), ik[..., R:]], dim=-1)
        if keep is not None:
            keep["ik"] = ik
        if past is not None:
            ik = torch.cat([past["ik"].expand(B, -1, -1), ik], dim=1)
        w = (x @ W(p + "indexer.weights_proj.weight").T) * (IH**-0.5) * (ID**-0.5)  # [B, T, IH]
        dots = torch.relu(torch.einsum("btjd,bsd->btjs", iq, ik))
        return torch.einsum("btj,btjs->bts", w, dots)

    def delta(self, p, x, past=None, keep=None):
        cfg, W = self.cfg, self.W
        B, T, _ = x.shape
        Hd, dk, dv, conv = cfg.delta_heads, cfg.head_k_dim, cfg.head_v_dim, cfg.conv_size

        def branch(name):
            u = x @ W(p + f"{name}_proj.weight").T  # [B, T, C]
            w = W(p + f"{name}_conv1d.weight")  # [C, conv]
            if keep is not None:
                keep[name + "_tail"] = u[:, -(conv - 1) :]
            if past is not None:
                padded = torch.cat([past[name + "_tail"].expand(B, -1, -1), u], dim=1)
            else:
                padded = F.pad(u, (0, 0, conv - 1, 0))
            out = sum(w[:, j] * padded[:, j : j + T] for j in range(conv))
            return F.silu(out)

        q = ref.l2_normalize(branch("q").view(B, T, Hd, dk)) * dk**-0.5
        k = ref.l2_normalize(branch("k").view(B, T, Hd, dk))
        v = branch("v").view(B, T, Hd, dv)
        beta = torch.sigmoid(x @ W(p + "b_proj.weight").T)
        g = -torch.exp(W(p + "A_log")) * F.softplus(x @ W(p + "a_proj.weight").T + W(p + "dt_bias"))
        S0 = past["S"].expand(B, -1, -1, -1) if past is not None else None
        o, S = delta_chunked(q, k, v, beta, g, S=S0)
        if keep is not None:
            keep["S"] = S
        o = rms_norm(o, W(p + "o_norm.weight"), cfg.delta_norm_eps)
        o = o * F.silu(x @ W(p + "g_proj.weight").T).view(B, T, Hd, dv)
        return o.reshape(B, T, Hd * dv) @ W(p + "o_proj.weight").T

    def moe(self, p, xf, aux, valid):
        """xf [N, D] tokens (any number of streams flattened), valid [N]."""
        cfg, W = self.cfg, self.W
        with torch.no_grad():
            idx, _ = ref.moe_route(cfg, W(p + "gate.weight").detach(), W(p + "gate.bias"), xf)
        s = torch.sigmoid(xf @ W(p + "gate.weight").T)
        w = s.gather(1, idx)
        w = w / w.sum(-1, keepdim=True) * cfg.routed_scaling_factor
        I = cfg.moe_inter
        # unbind: one backward that stacks the experts' gradients (indexing the
        # stacked tensor per expert would add a full-size zero gradient each).
        w13, w2 = W(p + "experts.w13").unbind(0), W(p + "experts.w2").unbind(0)
        # Tokens sorted by expert: one gather, contiguous slices per expert, one index_add.
        flat = idx.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=cfg.n_experts)
        tok = order // idx.shape[1]
        xs = xf[tok]
        outs = []
        start = 0
        for e, n in enumerate(counts.tolist()):
            if n:
                outs.append(swiglu(xs[start : start + n], w13[e][:I], w13[e][I:], w2[e]))
            start += n
        out = torch.cat(outs, dim=0) * w.reshape(-1)[order][:, None]
        y = torch.zeros_like(xf).index_add(0, tok, out)
        if cfg.n_shared_experts > 0:
            y = y + swiglu(xf, W(p + "shared.w1.weight"), W(p + "shared.w3.weight"), W(p + "shared.w2.weight"))
        load = torch.bincount(idx[valid].reshape(-1), minlength=cfg.n_experts).float()
        aux.setdefault("load", {})[p + "gate.bias"] = load
        return y

    def embed_image(self, rgb):
        """The vision tower's rows for one image (uint8 [H, W, 3]), [tokens, D],
        differentiable in the tower's parameters (tools/reference/vision.py)."""
        return _vision.tower(self.cfg.vision, _WeightView(self), rgb)[0]

    def embed_images(self, rgbs):
        """The tower's rows for a batch of images of one size, uint8 [B, H, W, 3]
        -> [B, tokens, D]: tools/reference/vision.py's math, batched. Only for
        images whose size is already the patch grid's (the resize of model.md
        14.2 is then the identity: every tent weight is 1 or 0); other sizes go
        through embed_image one by one."""
        vc = self.cfg.vision
        B, H, Wd, _ = rgbs.shape
        gh, gw = _vision.image_grid(vc, Wd, H)
        p, m = vc.patch_size, vc.merge_size
        if (gh * p, gw * p) != (H, Wd):
            return torch.stack([self.embed_image(r) for r in rgbs])
        W = self.W
        mean = torch.tensor(vc.image_mean, dtype=torch.float32, device=rgbs.device)
        std = torch.tensor(vc.image_std, dtype=torch.float32, device=rgbs.device)
        x = (rgbs.to(torch.float32) / 255.0 - mean) / std
        # [B, bh, dy, ky, bw, dx, kx, ch] -> merge squares in order, each patch (ch, ky, kx)
        x = x.view(B, gh // m, m, p, gw // m, m, p, 3).permute(0, 1, 4, 2, 5, 7, 3, 6).reshape(B, gh * gw, 3 * p * p)
        idx = torch.arange(gh * gw, device=rgbs.device).view(gh // m, gw // m, m, m)
        rows = (torch.arange(gh // m, device=rgbs.device)[:, None, None, None] * m +
                torch.arange(m, device=rgbs.device)[None, None, :, None]).expand_as(idx).reshape(-1)
        cols = (torch.arange(gw // m, device=rgbs.device)[None, :, None, None] * m +
                torch.arange(m, device=rgbs.device)[None, None, None, :]).expand_as(idx).reshape(-1)
        h = x @ W("vision.patch_embed.weight").T + W("vision.patch_embed.bias")
        N, Dv, heads, hd = gh * gw, vc.hidden_size, vc.num_heads, vc.head_dim
        cos, sin = _vision.rope2d_angles(vc, rows.cpu(), cols.cpu())
        cos, sin = cos.to(rgbs.device)[None, :, None, :], sin.to(rgbs.device)[None, :, None, :]

        def rope(t):
            half = hd // 2
            a, b = t[..., :half], t[..., half:]
            return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)

        for i in range(vc.num_layers):
            b = f"vision.blocks.{i}."
            a = rms_norm(h, W(b + "norm1.weight"), vc.norm_eps)
            qkv = a @ W(b + "attn.qkv.weight").T + W(b + "attn.qkv.bias")
            q = rope(qkv[..., :Dv].reshape(B, N, heads, hd))
            k = rope(qkv[..., Dv:2 * Dv].reshape(B, N, heads, hd))
            v = qkv[..., 2 * Dv:].reshape(B, N, heads, hd)
            scores = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(hd)
            o = torch.einsum("bhts,bshd->bthd", torch.softmax(scores, dim=-1), v).reshape(B, N, Dv)
            h = h + o @ W(b + "attn.proj.weight").T + W(b + "attn.proj.bias")
            f = rms_norm(h, W(b + "norm2.weight"), vc.norm_eps)
            h = h + swiglu(f, W(b + "mlp.w1.weight"), W(b + "mlp.w3.weight"), W(b + "mlp.w2.weight"))
        z = rms_norm(h, W("vision.norm.weight"), vc.norm_eps)
        merged = z.reshape(B, N // (m * m), m * m * Dv)
        u = merged @ W("vision.projector.w1.weight").T + W("vision.projector.w1.bias")
        return F.gelu(u) @ W("vision.projector.w2.weight").T + W("vision.projector.w2.bias")

    def forward(self, ids, valid=None, dsa_mode="dense", prefix=None, image_rows=None):
        """ids [B, T] -> logits [B, T, V], aux {indexer_kl: [[B, T] or [1, Tp] ..],
        load: {bias name: counts}}. dsa_mode: "dense" (warm-up: dsa layers
        attend to everything), "sparse" (top-k by the indexer, as at inference).
        prefix: ids [Tp] that precede every row of ids (computed once, shared
        by the batch); logits are then those of ids only, at positions Tp..."""
        cfg, W = self.cfg, self.W
        B, T = ids.shape
        if valid is None:
            valid = torch.ones(B, T, dtype=torch.bool, device=ids.device)
        aux = {}
        Tp = 0 if prefix is None else len(prefix)
        dev = ids.device
        cos, sin = ref.rope_angles(self.freqs, torch.arange(Tp, Tp + T, device=dev))
        x = W("embed.weight")[ids]
        if image_rows:
            # (batch row, positions [n], rows [n, D]): the tower's rows in
            # place of the placeholders' embeddings (model.md 14.5).
            x = x.clone()
            for b, pos, rows in image_rows:
                x[b, pos] = rows
        if prefix is not None:
            pcos, psin = ref.rope_angles(self.freqs, torch.arange(Tp, device=dev))
            xp = W("embed.weight")[torch.as_tensor(prefix, device=dev)][None]
            paux = {}
        for i, kind in enumerate(cfg.layer_types):
            p = f"layers.{i}."
            past = None
            if prefix is not None:
                past = {}
                ap = rms_norm(xp, W(p + "attn_norm.weight"), cfg.rms_norm_eps)
                if kind == "delta":
                    hp = xp + self.delta(p + "attn.", ap, keep=past)
                else:
                    hp = xp + self.mla(p + "attn.", ap, pcos, psin, dsa_mode if kind == "dsa" else None, paux,
                                       keep=past)
            a = rms_norm(x, W(p + "attn_norm.weight"), cfg.rms_norm_eps)
            if kind == "delta":
                h = x + self.delta(p + "attn.", a, past)
            else:
                h = x + self.mla(p + "attn.", a, cos, sin, dsa_mode if kind == "dsa" else None, aux, past, offset=Tp)
            f = rms_norm(h, W(p + "ffn_norm.weight"), cfg.rms_norm_eps)
            fp = rms_norm(hp, W(p + "ffn_norm.weight"), cfg.rms_norm_eps) if prefix is not None else None
            if i < cfg.first_dense_layers:
                ffn = lambda z: swiglu(z, W(p + "ffn.w1.weight"), W(p + "ffn.w3.weight"), W(p + "ffn.w2.weight"))  # noqa: E731
                x = h + ffn(f)
                if prefix is not None:
                    xp = hp + ffn(fp)
            elif prefix is None:
                x = h + self.moe(p + "ffn.", f.reshape(B * T, -1), aux, valid.reshape(-1)).view(B, T, -1)
            else:
                both = torch.cat([fp.reshape(Tp, -1), f.reshape(B * T, -1)])
                ok = torch.cat([torch.ones(Tp, dtype=torch.bool, device=dev), valid.reshape(-1)])
                y = self.moe(p + "ffn.", both, aux, ok)
                xp = hp + y[:Tp][None]
                x = h + y[Tp:].view(B, T, -1)
        if prefix is not None:
            aux["prefix_indexer_kl"] = paux.get("indexer_kl", [])
            aux["prefix_hidden"] = xp  # [1, Tp, D], before the final norm
        aux["hidden"] = x  # [B, T, D] after the last layer, before the final norm (what the MTP layer reads)
        return rms_norm(x, W("norm.weight"), cfg.rms_norm_eps) @ W("head.weight").T, aux

    # ---- multi-token prediction (DeepSeek-V3 MTP) ----------------------------

    def mtp_input(self, h, nxt, layer=0):
        """h'_i = eh_proj(concat(RMSNorm(embed[t_{i+1}]; enorm), RMSNorm(h_i; hnorm))):
        h [B, T, D] hidden states before the final norm, nxt [B, T] the next tokens."""
        W, eps, p = self.W, self.cfg.rms_norm_eps, f"mtp.{layer}."
        e = rms_norm(W("embed.weight")[nxt], W(p + "enorm.weight"), eps)
        hn = rms_norm(h, W(p + "hnorm.weight"), eps)
        return torch.cat([e, hn], dim=-1) @ W(p + "eh_proj.weight").T

    def mtp_ffn_and_head(self, x, layer=0):
        """The block's FFN half on the attention's residual x, then (logits, hidden
        before mtp.k.norm: what a chained step reads as its h)."""
        W, eps, p = self.W, self.cfg.rms_norm_eps, f"mtp.{layer}."
        f = rms_norm(x, W(p + "ffn_norm.weight"), eps)
        x = x + swiglu(f, W(p + "ffn.w1.weight"), W(p + "ffn.w3.weight"), W(p + "ffn.w2.weight"))
        return rms_norm(x, W(p + "norm.weight"), eps) @ W("head.weight").T, x

    def mtp_step(self, h, nxt, layer=0, keep=None, past=None, offset=0):
        """One MTP pass: position i reads h_i and t_{i+1} (RoPE at i, causal
        attention over the block's own keys at positions <= i) and predicts
        t_{i+2}. h [B, T, D], nxt [B, T] at positions offset..offset+T-1;
        past: the keep of a batch-1 pass over positions 0..offset-1 (the
        shared prefix, as in forward). Returns (logits [B, T, V], block output
        [B, T, D] before the final norm); keep receives this pass's keys."""
        W, eps, p = self.W, self.cfg.rms_norm_eps, f"mtp.{layer}."
        x = self.mtp_input(h, nxt, layer)
        cos, sin = ref.rope_angles(self.freqs, torch.arange(offset, offset + x.shape[1], device=x.device))
        a = rms_norm(x, W(p + "attn_norm.weight"), eps)
        x = x + self.mla(p + "attn.", a, cos, sin, None, {}, past, keep, offset)
        return self.mtp_ffn_and_head(x, layer)

    def mtp_chained_step(self, h, nxt, keys, layer=0, offset=0):
        """The second draft, teacher-forced: row j (position offset + j + 1)
        reads the first step's block output at position offset + j as h and
        the true token after the first draft's; it attends to the first step's
        keys at positions <= offset + j (those the block computed from the
        trunk) and to its own key, as a chained draft at inference does.
        h, nxt [B, T]; keys: {k_nope [B, H, S, n], v, k_pe [B, S, r]} of the
        first step at positions 0..S-1, S >= offset + T. Returns (logits
        [B, T, V], block output)."""
        cfg, W, eps, p = self.cfg, self.W, self.cfg.rms_norm_eps, f"mtp.{layer}."
        B, T, _ = h.shape
        x = self.mtp_input(h, nxt, layer)
        cos, sin = ref.rope_angles(self.freqs, torch.arange(offset + 1, offset + T + 1, device=x.device))
        a = rms_norm(x, W(p + "attn_norm.weight"), eps)
        q = p + "attn."
        H, nope, vd = cfg.n_heads, cfg.qk_nope_head_dim, cfg.v_head_dim
        qr = rms_norm(a @ W(q + "wq_a.weight").T, W(q + "q_norm.weight"), eps)
        qq = (qr @ W(q + "wq_b.weight").T).view(B, T, H, -1)
        q_nope, q_pe = qq[..., :nope], rope_interleaved(qq[..., nope:], cos, sin)
        kv = a @ W(q + "wkv_a.weight").T
        c = rms_norm(kv[..., : cfg.kv_lora_rank], W(q + "kv_norm.weight"), eps)
        k_pe = rope_interleaved(kv[..., cfg.kv_lora_rank :], cos, sin)
        wkv_b = W(q + "wkv_b.weight").view(H, nope + vd, cfg.kv_lora_rank)
        k_nope = torch.einsum("bsc,hnc->bhsn", c, wkv_b[:, :nope])
        v = torch.einsum("bsc,hvc->bhsv", c, wkv_b[:, nope:])
        S = offset + T
        k1n, v1, k1pe = keys["k_nope"][:, :, :S], keys["v"][:, :, :S], keys["k_pe"][:, :S]
        scale = ref.mla_softmax_scale(cfg)
        past = torch.einsum("bthn,bhsn->bhts", q_nope, k1n) + torch.einsum("bthr,bsr->bhts", q_pe, k1pe)
        own = torch.einsum("bthn,bhtn->bht", q_nope, k_nope) + torch.einsum("bthr,btr->bht", q_pe, k_pe)
        dev = x.device
        earlier = torch.arange(S, device=dev)[None, :] <= (offset + torch.arange(T, device=dev))[:, None]
        scores = torch.cat([past.masked_fill(~earlier, float("-inf")), own[..., None]], dim=-1) * scale
        probs = torch.softmax(scores, -1)
        o = torch.einsum("bhts,bhsv->bthv", probs[..., :S], v1) + probs[..., S:].permute(0, 2, 1, 3) * v.permute(0, 2, 1, 3)
        o = o.reshape(B, T, H * vd)
        if cfg.output_gate:
            o = o * torch.sigmoid(a @ W(q + "wg.weight").T)
        return self.mtp_ffn_and_head(x + o @ W(q + "wo.weight").T, layer)

    def mtp_sequence(self, hidden, ids, chain=False, layer=0):
        """MTP logits for whole sequences: hidden [B, L, D] the trunk's states
        for ids [B, L]. Returns logits [B, L-2, V] for ids[:, 2:] (the first
        draft) and, with chain, the chained second draft's [B, L-3, V] for
        ids[:, 3:] (else None)."""
        L = ids.shape[1]
        keys = {} if chain else None
        logits, out = self.mtp_step(hidden[:, : L - 2], ids[:, 1 : L - 1], layer, keep=keys)
        if not chain:
            return logits, None
        logits2, _ = self.mtp_chained_step(out[:, : L - 3], ids[:, 2 : L - 1], keys, layer)
        return logits, logits2

    def mtp_with_prefix(self, prefix_hidden, prefix, hidden, ids, chain=False, layer=0):
        """mtp_sequence for rows that share a prefix (forward's prefix): the
        prefix's keys are computed once. prefix_hidden [1, Tp, D] and prefix
        ids [Tp]; hidden [B, T, D] the trunk's states at positions Tp..Tp+T-1
        and ids [B, T + 1] the tokens at Tp..Tp+T. Returns logits [B, T, V]
        for ids[:, 1:] and, with chain, the chained draft's [B, T-1, V] for
        ids[:, 2:] (else None)."""
        B, T, _ = hidden.shape
        Tp = prefix_hidden.shape[1]
        prefix = torch.as_tensor(prefix, device=hidden.device)
        pk = {}
        self.mtp_step(prefix_hidden[:, : Tp - 1], prefix[None, 1:], layer, keep=pk)
        h = torch.cat([prefix_hidden[:, Tp - 1 :].expand(B, -1, -1), hidden[:, : T - 1]], dim=1)
        sk = {} if chain else None
        logits, out = self.mtp_step(h, ids[:, :T], layer, keep=sk, past=pk, offset=Tp - 1)
        if not chain:
            return logits, None
        keys = {"k_nope": torch.cat([pk["k_nope"].expand(B, -1, -1, -1), sk["k_nope"]], dim=2),
                "v": torch.cat([pk["v"].expand(B, -1, -1, -1), sk["v"]], dim=2),
                "k_pe": torch.cat([pk["k_pe"].expand(B, -1, -1), sk["k_pe"]], dim=1)}
        logits2, _ = self.mtp_chained_step(out[:, : T - 1], ids[:, 1:T], keys, layer, offset=Tp - 1)
        return logits, logits2

    def update_bias(self, load, rate):
        """Aux-loss-free balancing: bias += rate * sign(mean load - load)."""
        for name, counts in load.items():
            self.gate_bias[name] += rate * torch.sign(counts.mean() - counts)
