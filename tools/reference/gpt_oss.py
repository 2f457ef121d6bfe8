"""gpt-oss in fp32 PyTorch, read straight from a Hugging Face checkpoint
directory (config.json model_type gpt_oss, safetensors shards listed by
model.safetensors.index.json, MXFP4 experts as *_blocks / *_scales).

The math follows OpenAI's torch model of gpt-oss; where the Hugging Face
implementation differs the choice is noted at the place (see also
docs/model-format.md, "gpt-oss").

  python3 gpt_oss.py write --out DIR [--layers N] [--window W] [--seed S]
                           [--vocab V] [--tie] [--drop TENSOR] [--bad-shape TENSOR]
                           [--next A:B,C:D,...]
  python3 gpt_oss.py run --model DIR --tokens 1,2,3 --decode N --out OUTDIR

`run` writes OUTDIR/meta.json (tokens, greedy_tokens, top2_margin) and
OUTDIR/logits.f32 (every position's logits, row-major), as reference.py does.
"""
import argparse
import json
import math
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_io import read_safetensors, write_safetensors  # noqa: E402

# E2M1 code points: the low 3 bits index the magnitude, bit 3 is the sign.
FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def dequant_mxfp4(blocks, scales):
    """blocks [..., G, 16] uint8, scales [..., G] uint8 (E8M0, bias 127) ->
    fp32 [..., G * 32]. Element 2j of a block is the low nibble of byte j,
    element 2j+1 the high nibble (as the Hugging Face and OpenAI loaders)."""
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32)
    lo = lut[(blocks & 0x0F).long()]
    hi = lut[(blocks >> 4).long()]
    vals = torch.stack([lo, hi], dim=-1).reshape(*blocks.shape[:-1], 32)
    vals = torch.ldexp(vals, (scales.long() - 127).unsqueeze(-1).to(torch.int32))
    return vals.reshape(*blocks.shape[:-2], blocks.shape[-2] * 32)


def quant_mxfp4(w, rng):
    """Random MXFP4 blocks/scales whose dequantised values have the scale of w's
    rows (for the tiny test checkpoints only)."""
    *prefix, cols = w.shape
    g = cols // 32
    codes = torch.randint(0, 16, (*prefix, g, 32), generator=rng, dtype=torch.uint8)
    blocks = (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)
    scales = torch.randint(122, 126, (*prefix, g), generator=rng, dtype=torch.uint8)
    return blocks, scales


def load_checkpoint(model_dir):
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors = {}
    for name in files:
        for k, raw in read_safetensors(os.path.join(model_dir, name)).items():
            tensors[k] = raw.to_torch() if hasattr(raw, "to_torch") else raw
    return tensors


def rope_tables(cfg, positions):
    """YaRN inverse frequencies and the attention-scaling ("concentration")
    factor. OpenAI: concentration = 0.1 ln(factor) + 1 multiplies cos and sin;
    Hugging Face calls it attention_factor and does the same. The correction
    range is the same formula in both; Hugging Face clamps it to [0, dim - 1]
    and floors/ceils it unless rope_scaling.truncate is false (OpenAI never
    truncates and asserts 0 < low < high < dim/2 - 1). This follows Hugging
    Face, with truncate read from the config (default true)."""
    d = cfg["head_dim"]
    base = cfg["rope_theta"]
    rs = cfg.get("rope_scaling") or {}
    freq = base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    if rs and rs.get("rope_type", rs.get("type")) == "yarn" and rs["factor"] > 1.0:
        factor = rs["factor"]
        orig = rs.get("original_max_position_embeddings") or cfg["max_position_embeddings"]
        beta_fast = rs.get("beta_fast") or 32.0
        beta_slow = rs.get("beta_slow") or 1.0
        conc = rs.get("attention_factor") or (0.1 * math.log(factor) + 1.0)

        def corr(rot):
            return d * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))

        low, high = corr(beta_fast), corr(beta_slow)
        if rs.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, d - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(d // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        inv = (1.0 / (factor * freq)) * ramp + (1.0 / freq) * (1 - ramp)
    else:
        conc = 1.0
        inv = 1.0 / freq
    ang = positions.double()[:, None] * inv[None, :]
    return (ang.cos() * conc).float(), (ang.sin() * conc).float()


def rotate(x, cos, sin):
    """Half-split (NeoX) rotation, as both implementations: x [T, H, d]."""
    x1, x2 = torch.chunk(x, 2, dim=-1)
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def swiglu(x, alpha=1.702, limit=7.0):
    gate, up = x[..., 0::2], x[..., 1::2]  # interleaved columns
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return gate * torch.sigmoid(alpha * gate) * (up + 1)


def layer_is_sliding(cfg, i):
    lt = cfg.get("layer_types")
    if lt:
        return lt[i] == "sliding_attention"
    return i % 2 == 0  # OpenAI: even layers are banded


def forward(cfg, w, tokens):
    """Logits [T, vocab] for the whole token sequence (causal)."""
    f = lambda n: w[n].float()  # noqa: E731
    T = len(tokens)
    H, KV, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = cfg.get("rms_norm_eps", 1e-5)
    window = cfg["sliding_window"]
    k_top = cfg.get("num_experts_per_tok", cfg.get("experts_per_token"))
    limit = cfg.get("swiglu_limit", 7.0)
    cos, sin = rope_tables(cfg, torch.arange(T))
    x = f("model.embed_tokens.weight")[torch.tensor(tokens)]
    qi = torch.arange(T)[:, None]
    ki = torch.arange(T)[None, :]
    for li in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{li}."
        t = rmsnorm(x, f(p + "input_layernorm.weight"), eps)
        q = (t @ f(p + "self_attn.q_proj.weight").T + f(p + "self_attn.q_proj.bias")).view(T, H, d)
        k = (t @ f(p + "self_attn.k_proj.weight").T + f(p + "self_attn.k_proj.bias")).view(T, KV, d)
        v = (t @ f(p + "self_attn.v_proj.weight").T + f(p + "self_attn.v_proj.bias")).view(T, KV, d)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        allowed = ki <= qi
        if layer_is_sliding(cfg, li):
            allowed = allowed & (ki > qi - window)  # the last `window` positions, self included
        rep = H // KV
        kk = k.repeat_interleave(rep, dim=1)  # head h reads kv head h // rep
        vv = v.repeat_interleave(rep, dim=1)
        s = torch.einsum("qhd,khd->hqk", q, kk) / math.sqrt(d)
        s = s.masked_fill(~allowed[None], float("-inf"))
        sink = f(p + "self_attn.sinks").view(H, 1, 1).expand(H, T, 1)
        pr = torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :-1]
        o = torch.einsum("hqk,khd->qhd", pr, vv).reshape(T, H * d)
        x = x + o @ f(p + "self_attn.o_proj.weight").T + f(p + "self_attn.o_proj.bias")

        t = rmsnorm(x, f(p + "post_attention_layernorm.weight"), eps)
        g = t @ f(p + "mlp.router.weight").T + f(p + "mlp.router.bias")
        top = torch.topk(g, k_top, dim=-1, sorted=True)
        wts = torch.softmax(top.values, dim=-1)
        e = p + "mlp.experts."
        gu_w = dequant_mxfp4(w[e + "gate_up_proj_blocks"], w[e + "gate_up_proj_scales"])  # [E, 2I, hidden]
        dn_w = dequant_mxfp4(w[e + "down_proj_blocks"], w[e + "down_proj_scales"])  # [E, hidden, I]
        gu_b, dn_b = f(e + "gate_up_proj_bias"), f(e + "down_proj_bias")
        out = torch.zeros_like(x)
        for ti in range(T):
            for j in range(k_top):
                ex = int(top.indices[ti, j])
                h = swiglu(gu_w[ex] @ t[ti] + gu_b[ex], limit=limit)
                out[ti] += wts[ti, j] * (dn_w[ex] @ h + dn_b[ex])
        x = x + out
    x = rmsnorm(x, f("model.norm.weight"), eps)
    head = f("model.embed_tokens.weight") if cfg.get("tie_word_embeddings") else f("lm_head.weight")
    return x @ head.T


def cmd_run(a):
    with open(os.path.join(a.model, "config.json")) as fh:
        cfg = json.load(fh)
    w = load_checkpoint(a.model)
    toks = [int(t) for t in a.tokens.split(",")]
    greedy = []
    for _ in range(a.decode + 1):
        logits = forward(cfg, w, toks + greedy)
        greedy.append(int(torch.argmax(logits[-1])))
    greedy = greedy[: a.decode + 1]
    all_toks = toks + greedy[:-1]
    logits = forward(cfg, w, all_toks)
    top2 = torch.topk(logits, 2, dim=-1).values
    os.makedirs(a.out, exist_ok=True)
    logits.contiguous().numpy().astype("<f4").tofile(os.path.join(a.out, "logits.f32"))
    meta = {"prompt_len": len(toks), "positions": len(all_toks), "vocab_size": logits.shape[1],
            "tokens": all_toks, "greedy_tokens": greedy, "top2_margin": (top2[:, 0] - top2[:, 1]).tolist()}
    with open(os.path.join(a.out, "meta.json"), "w") as fh:
        json.dump(meta, fh)


def cmd_write(a):
    """A tiny random checkpoint in the published layout: two shards and an
    index, bf16 dense tensors, MXFP4 experts, untied lm_head, the real
    o200k_harmony tokenizer files beside it."""
    rng = torch.Generator().manual_seed(a.seed)
    hidden, inter, H, KV, d, E = 64, 64, 4, 2, 16, 4
    vocab = a.vocab
    L = a.layers
    cfg = {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": hidden,
        "intermediate_size": inter, "num_attention_heads": H, "num_key_value_heads": KV, "head_dim": d,
        "num_hidden_layers": L, "num_local_experts": E, "num_experts_per_tok": 2, "experts_per_token": 2,
        "vocab_size": vocab, "rms_norm_eps": 1e-5, "sliding_window": a.window, "rope_theta": 150000.0,
        "max_position_embeddings": 4096 * 32, "swiglu_limit": 7.0, "tie_word_embeddings": False,
        "attention_bias": True, "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(L)],
        "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                         "original_max_position_embeddings": 4096, "truncate": False},
        "eos_token_id": 200002, "pad_token_id": 199999,
        "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
            "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]},
    }

    def rnd(*shape, scale=1.0):
        return torch.randn(*shape, generator=rng) * scale

    t = {"model.embed_tokens.weight": rnd(vocab, hidden), "lm_head.weight": rnd(vocab, hidden, scale=0.1),
         "model.norm.weight": 1 + rnd(hidden, scale=0.1)}
    for i in range(L):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = 1 + rnd(hidden, scale=0.1)
        t[p + "post_attention_layernorm.weight"] = 1 + rnd(hidden, scale=0.1)
        for n, rows in (("q", H * d), ("k", KV * d), ("v", KV * d)):
            t[p + f"self_attn.{n}_proj.weight"] = rnd(rows, hidden, scale=hidden ** -0.5)
            t[p + f"self_attn.{n}_proj.bias"] = rnd(rows, scale=0.1)
        t[p + "self_attn.o_proj.weight"] = rnd(hidden, H * d, scale=(H * d) ** -0.5)
        t[p + "self_attn.o_proj.bias"] = rnd(hidden, scale=0.1)
        t[p + "self_attn.sinks"] = rnd(H)
        t[p + "mlp.router.weight"] = rnd(E, hidden, scale=hidden ** -0.5)
        t[p + "mlp.router.bias"] = rnd(E, scale=0.1)
        e = p + "mlp.experts."
        b, s = quant_mxfp4(torch.empty(E, 2 * inter, hidden), rng)
        t[e + "gate_up_proj_blocks"], t[e + "gate_up_proj_scales"] = b, s
        t[e + "gate_up_proj_bias"] = rnd(E, 2 * inter, scale=0.1)
        b, s = quant_mxfp4(torch.empty(E, hidden, inter), rng)
        t[e + "down_proj_blocks"], t[e + "down_proj_scales"] = b, s
        t[e + "down_proj_bias"] = rnd(E, hidden, scale=0.1)
    if a.next:
        script_next_tokens(t, a.next, L, hidden)
    if a.tie:
        cfg["tie_word_embeddings"] = True
        del t["lm_head.weight"]
    if a.nan_scale:
        t[a.nan_scale].view(-1)[-1] = 255  # E8M0 NaN
    if a.drop:
        del t[a.drop]
    if a.bad_shape:
        t[a.bad_shape] = t[a.bad_shape].reshape(-1)[:-1].clone()
    os.makedirs(a.out, exist_ok=True)
    shards = [{}, {}]
    for n, v in t.items():
        dtype = "U8" if v.dtype == torch.uint8 else "BF16"
        shards[0 if n.startswith(("model.embed", "model.layers.0.")) else 1][n] = (v, dtype)
    weight_map = {}
    for si, sh in enumerate(shards):
        name = f"model-{si:05d}-of-00002.safetensors"
        write_safetensors(os.path.join(a.out, name), sh)
        weight_map.update({n: name for n in sh})
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as fh:
        json.dump({"metadata": {}, "weight_map": weight_map}, fh, indent=1)
    with open(os.path.join(a.out, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=1)
    tok = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "node_modules", "@lenml",
                       "tokenizer-gptoss", "models")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if os.path.exists(os.path.join(tok, name)):
            shutil.copyfile(os.path.join(tok, name), os.path.join(a.out, name))


def script_next_tokens(t, pairs, layers, hidden):
    """--next A:B,...: a checkpoint whose greedy next token after id A is B,
    whatever came before, so that a test can have a server produce known
    output (harmony messages) from a tiny model. Every layer adds nothing to
    the residual stream (attention and expert outputs are zero), so the
    logits at a position are lm_head . norm(embed[token]); each A's embedding
    is its own unit vector e_i, and B's lm_head row is 2 e_i (a logit of
    about 16 against the random rows' few units)."""
    succ = {}
    for pair in pairs.split(","):
        a, b = (int(x) for x in pair.split(":"))
        if a in succ and succ[a] != b:
            raise SystemExit(f"--next: {a} is given two successors")
        succ[a] = b
    if len(succ) > hidden:
        raise SystemExit(f"--next: at most {hidden} tokens")
    for i in range(layers):
        p = f"model.layers.{i}."
        t[p + "self_attn.o_proj.weight"].zero_()
        t[p + "self_attn.o_proj.bias"].zero_()
        t[p + "mlp.experts.down_proj_blocks"].zero_()  # E2M1 code 0 is 0.0 at any scale
        t[p + "mlp.experts.down_proj_bias"].zero_()
    t["model.norm.weight"].fill_(1.0)
    rows = {}
    for i, (a, b) in enumerate(succ.items()):
        t["model.embed_tokens.weight"][a] = 0.0
        t["model.embed_tokens.weight"][a, i] = 1.0
        rows.setdefault(b, []).append(i)
    for b, dims in rows.items():
        t["lm_head.weight"][b] = 0.0
        for i in dims:
            t["lm_head.weight"][b, i] = 2.0


def main(argv=None):
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("--out", required=True)
    w.add_argument("--layers", type=int, default=4)
    w.add_argument("--window", type=int, default=8)
    w.add_argument("--vocab", type=int, default=201088)
    w.add_argument("--seed", type=int, default=1)
    w.add_argument("--tie", action="store_true", help="tie lm_head to the embedding (no lm_head.weight)")
    w.add_argument("--drop")
    w.add_argument("--nan-scale", help="an MXFP4 *_scales tensor whose last scale becomes 255 (NaN)")
    w.add_argument("--bad-shape")
    w.add_argument("--next", help="A:B,C:D,...: the greedy next token after id A is B (layers add nothing)")
    r = sub.add_parser("run")
    r.add_argument("--model", required=True)
    r.add_argument("--tokens", required=True)
    r.add_argument("--decode", type=int, default=8)
    r.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    (cmd_write if a.cmd == "write" else cmd_run)(a)


if __name__ == "__main__":
    main()
