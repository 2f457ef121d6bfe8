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


def delta_chunked(q, k, v, beta, g, chunk=64):
    """Batched fla chunked gated delta rule from a zero state. q, k [B, T, H, dk]
    (q scaled), v [B, T, H, dv], beta, g [B, T, H]. Returns o [B, T, H, dv]."""
    B, T, H, dk = k.shape
    dv = v.shape[-1]
    pad = (-T) % chunk
    q, k, v = (F.pad(a.permute(0, 2, 1, 3), (0, 0, 0, pad)) for a in (q, k, v))  # [B, H, T', d]
    beta, g = (F.pad(a.permute(0, 2, 1), (0, pad)) for a in (beta, g))  # [B, H, T']
    S = q.new_zeros(B, H, dk, dv)
    eye = torch.eye(chunk, dtype=q.dtype)
    incl = torch.ones(chunk, chunk, dtype=torch.bool).tril()
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
    return torch.cat(outs, dim=2)[:, :, :T].permute(0, 2, 1, 3)


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
            if name.endswith("ffn.gate.bias"):
                self.gate_bias[name] = torch.zeros(shape)  # balanced by update_bias, not by gradients
                continue
            self.p[name.replace(".", "__")] = nn.Parameter(self._init(name, shape, gen))
        freqs = ref.rope_frequencies(cfg)
        self.freqs = freqs

    @staticmethod
    def _init(name, shape, gen):
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
        """{checkpoint name (experts unquantised): fp32 tensor}."""
        out = {k.replace("__", "."): v.detach().clone() for k, v in self.p.items()}
        out.update({k: v.clone() for k, v in self.gate_bias.items()})
        return out

    def load_fp32(self, weights):
        with torch.no_grad():
            for k, v in weights.items():
                if k in self.gate_bias:
                    self.gate_bias[k] = v.clone().float()
                else:
                    self.p[k.replace(".", "__")].copy_(v)

    # ---- layers -------------------------------------------------------------

    def mla(self, p, x, cos, sin, dsa_mode, aux):
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
        scores = torch.einsum("bthn,bhsn->bhts", q_nope, k_nope) + torch.einsum("bthr,bsr->bhts", q_pe, k_pe)
        scores = scores * ref.mla_softmax_scale(cfg)
        visible = torch.ones(T, T, dtype=torch.bool).tril()[None, None]
        if dsa_mode is not None:
            I = self.indexer(p, x.detach(), qr.detach(), cos, sin)  # [B, T, S]
            causal = visible[:, 0]
            I = I.masked_fill(~causal, float("-inf"))
            keep = causal
            if dsa_mode == "sparse":
                k = min(cfg.index_topk, T)
                # Stable descending sort: ties go to the lower s, as at inference.
                top = torch.sort(I, dim=-1, descending=True, stable=True)[1][..., :k]
                keep = torch.zeros_like(causal.expand(B, T, T)).scatter_(-1, top, True) & causal
                visible = keep[:, None]
            with torch.no_grad():
                target = torch.softmax(scores.masked_fill(~visible, float("-inf")), -1).sum(1)
                target = target / target.sum(-1, keepdim=True)
            logq = torch.log_softmax(I.masked_fill(~keep, float("-inf")), -1)
            kl = (target * (torch.log(target.clamp_min(1e-12)) - logq.masked_fill(~keep, 0))).sum(-1)  # [B, T]
            aux.setdefault("indexer_kl", []).append(kl)
        probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), -1)
        o = torch.einsum("bhts,bhsv->bthv", probs, v).reshape(B, T, H * vd)
        if cfg.output_gate:
            o = o * torch.sigmoid(x @ W(p + "wg.weight").T)
        return o @ W(p + "wo.weight").T

    def indexer(self, p, x, qr, cos, sin):
        cfg, W = self.cfg, self.W
        B, T, _ = x.shape
        IH, ID, R = cfg.index_n_heads, cfg.index_head_dim, cfg.qk_rope_head_dim
        iq = (qr @ W(p + "indexer.wq_b.weight").T).view(B, T, IH, ID)
        iq = torch.cat([rope_half_split(iq[..., :R], cos, sin), iq[..., R:]], dim=-1)
        ik = F.layer_norm(x @ W(p + "indexer.wk.weight").T, (ID,), W(p + "indexer.k_norm.weight"),
                          W(p + "indexer.k_norm.bias"), 1e-6)
        ik = torch.cat([rope_half_split(ik[..., :R], cos, sin), ik[..., R:]], dim=-1)
        w = (x @ W(p + "indexer.weights_proj.weight").T) * (IH**-0.5) * (ID**-0.5)  # [B, T, IH]
        dots = torch.relu(torch.einsum("btjd,bsd->btjs", iq, ik))
        return torch.einsum("btj,btjs->bts", w, dots)

    def delta(self, p, x):
        cfg, W = self.cfg, self.W
        B, T, _ = x.shape
        Hd, dk, dv, conv = cfg.delta_heads, cfg.head_k_dim, cfg.head_v_dim, cfg.conv_size

        def branch(name):
            u = x @ W(p + f"{name}_proj.weight").T  # [B, T, C]
            w = W(p + f"{name}_conv1d.weight")  # [C, conv]
            padded = F.pad(u, (0, 0, conv - 1, 0))
            out = sum(w[:, j] * padded[:, j : j + T] for j in range(conv))
            return F.silu(out)

        q = ref.l2_normalize(branch("q").view(B, T, Hd, dk)) * dk**-0.5
        k = ref.l2_normalize(branch("k").view(B, T, Hd, dk))
        v = branch("v").view(B, T, Hd, dv)
        beta = torch.sigmoid(x @ W(p + "b_proj.weight").T)
        g = -torch.exp(W(p + "A_log")) * F.softplus(x @ W(p + "a_proj.weight").T + W(p + "dt_bias"))
        o = delta_chunked(q, k, v, beta, g)
        o = rms_norm(o, W(p + "o_norm.weight"), cfg.delta_norm_eps)
        o = o * F.silu(x @ W(p + "g_proj.weight").T).view(B, T, Hd, dv)
        return o.reshape(B, T, Hd * dv) @ W(p + "o_proj.weight").T

    def moe(self, p, x, aux, valid):
        cfg, W = self.cfg, self.W
        B, T, D = x.shape
        xf = x.reshape(B * T, D)
        with torch.no_grad():
            idx, _ = ref.moe_route(cfg, W(p + "gate.weight").detach(), W(p + "gate.bias"), xf)
        s = torch.sigmoid(xf @ W(p + "gate.weight").T)
        w = s.gather(1, idx)
        w = w / w.sum(-1, keepdim=True) * cfg.routed_scaling_factor
        I = cfg.moe_inter
        w13, w2 = W(p + "experts.w13"), W(p + "experts.w2")
        y = torch.zeros_like(xf)
        for e in range(cfg.n_experts):
            tok, slot = (idx == e).nonzero(as_tuple=True)
            if tok.numel() == 0:
                continue
            out = swiglu(xf[tok], w13[e, :I], w13[e, I:], w2[e])
            y = y.index_add(0, tok, w[tok, slot][:, None] * out)
        if cfg.n_shared_experts > 0:
            y = y + swiglu(xf, W(p + "shared.w1.weight"), W(p + "shared.w3.weight"), W(p + "shared.w2.weight"))
        counts = torch.zeros(cfg.n_experts)
        counts.index_add_(0, idx[valid.reshape(-1)].reshape(-1), torch.ones(int(valid.sum()) * idx.shape[1]))
        aux.setdefault("load", {})[p + "gate.bias"] = counts
        return y.view(B, T, D)

    def forward(self, ids, valid=None, dsa_mode="dense"):
        """ids [B, T] -> logits [B, T, V], aux {indexer_kl: [..], load: {bias name: counts}}.
        dsa_mode: "dense" (warm-up: dsa layers attend to everything), "sparse"
        (top-k by the indexer, as at inference)."""
        cfg, W = self.cfg, self.W
        B, T = ids.shape
        if valid is None:
            valid = torch.ones(B, T, dtype=torch.bool)
        cos, sin = ref.rope_angles(self.freqs, torch.arange(T))
        aux = {}
        x = W("embed.weight")[ids]
        for i, kind in enumerate(cfg.layer_types):
            p = f"layers.{i}."
            a = rms_norm(x, W(p + "attn_norm.weight"), cfg.rms_norm_eps)
            if kind == "delta":
                h = x + self.delta(p + "attn.", a)
            else:
                h = x + self.mla(p + "attn.", a, cos, sin, dsa_mode if kind == "dsa" else None, aux)
            f = rms_norm(h, W(p + "ffn_norm.weight"), cfg.rms_norm_eps)
            if i < cfg.first_dense_layers:
                x = h + swiglu(f, W(p + "ffn.w1.weight"), W(p + "ffn.w3.weight"), W(p + "ffn.w2.weight"))
            else:
                x = h + self.moe(p + "ffn.", f, aux, valid)
        return rms_norm(x, W("norm.weight"), cfg.rms_norm_eps) @ W("head.weight").T, aux

    def update_bias(self, load, rate):
        """Aux-loss-free balancing: bias += rate * sign(mean load - load)."""
        for name, counts in load.items():
            self.gate_bias[name] += rate * torch.sign(counts.mean() - counts)
