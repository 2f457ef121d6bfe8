#!/usr/bin/env python3
"""A random DeepSeek-V3.2 checkpoint at the release's per-layer shapes, in the
published layout (config.json keys as released, FP8 e4m3 linear weights with
128x128 weight_scale_inv, BF16 embeddings, norms, router and indexer
weights_proj, an F32 correction bias, one shard per layer with
model.safetensors.index.json), written one tensor at a time so that this
process stays small whatever the checkpoint's size.

Shapes as deepseek-ai/DeepSeek-V3.2's config.json: hidden 7168, 128 heads,
q_lora_rank 1536, kv_lora_rank 512, qk_nope 128, qk_rope 64, v_head 128,
indexer 64 heads of 128, dense intermediate 18432, routed experts 2048 wide,
one shared expert, top-8 routing. Fewer layers, fewer routed experts and a
smaller vocabulary than the release are options (the engine holds the
routed experts in BF16 or MXFP4, so a layer of 256 experts does not fit a
small machine: see bench/deepseek_v32/README.md). --scales pow2 writes
power-of-two block scales, as the release's (UE8M0)."""
import argparse
import json
import math
import os
import struct

import torch

BLOCK = 128


def release_config(layers, dense, experts, vocab):
    # n_group 8 / topk_group 4 in the release (256 experts, 32 a group); with
    # fewer experts the groups shrink so that top-8 still has 8 candidates.
    groups = 8 if experts >= 64 else max(1, experts // 4)
    return {
        "architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32",
        "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1,
        "first_k_dense_replace": dense, "hidden_act": "silu", "hidden_size": 7168, "index_head_dim": 128,
        "index_n_heads": 64, "index_topk": 2048, "initializer_range": 0.02, "intermediate_size": 18432,
        "kv_lora_rank": 512, "max_position_embeddings": 163840, "moe_intermediate_size": 2048, "moe_layer_freq": 1,
        "n_group": groups, "n_routed_experts": experts, "n_shared_experts": 1, "norm_topk_prob": True,
        "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": layers,
        "num_key_value_heads": 128, "num_nextn_predict_layers": 0, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
        "rms_norm_eps": 1e-06,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 4096, "type": "yarn"},
        "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "tie_word_embeddings": False,
        "topk_group": min(4, groups), "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
        "transformers_version": "4.44.2", "use_cache": True, "v_head_dim": 128, "vocab_size": vocab,
    }


def layer_tensors(cfg, i):
    """(name, dtype, shape, maker) of layer i, makers called one at a time."""
    D, H, ql, kvl = cfg["hidden_size"], cfg["num_attention_heads"], cfg["q_lora_rank"], cfg["kv_lora_rank"]
    nope, rope, vd = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    IH, ID, E, I = cfg["index_n_heads"], cfg["index_head_dim"], cfg["n_routed_experts"], cfg["moe_intermediate_size"]
    out = []
    p, s, m = f"model.layers.{i}.", f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."

    def fp8(name, rows, cols):
        out.append((name + ".weight", "F8_E4M3", [rows, cols], ("fp8", rows, cols)))
        out.append((name + ".weight_scale_inv", "F32",
                    [(rows + BLOCK - 1) // BLOCK, (cols + BLOCK - 1) // BLOCK], ("scale", rows, cols)))

    def norm(name, n):
        out.append((name, "BF16", [n], ("norm",)))

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
    out.append((s + "indexer.k_norm.bias", "BF16", [ID], ("small", ID)))
    out.append((s + "indexer.weights_proj.weight", "BF16", [IH, D], ("bf16", IH, D)))
    if i < cfg["first_k_dense_replace"]:
        F = cfg["intermediate_size"]
        fp8(m + "gate_proj", F, D)
        fp8(m + "up_proj", F, D)
        fp8(m + "down_proj", D, F)
        return out
    out.append((m + "gate.weight", "BF16", [E, D], ("bf16", E, D)))
    out.append((m + "gate.e_score_correction_bias", "F32", [E], ("bias", E)))
    for e in [f"experts.{j}." for j in range(E)] + ["shared_experts."]:
        fp8(m + e + "gate_proj", I, D)
        fp8(m + e + "up_proj", I, D)
        fp8(m + e + "down_proj", D, I)
    return out


SCALES = "float"  # --scales: "float" (any value) or "pow2"


def make(kind, rng):
    k = kind[0]
    if k == "fp8":  # codes below 0x60 (|v| < 2^5), random signs; never NaN
        rows, cols = kind[1], kind[2]
        codes = torch.randint(0, 0x60, (rows, cols), generator=rng, dtype=torch.uint8)
        return (codes | (torch.randint(0, 2, (rows, cols), generator=rng, dtype=torch.uint8) << 7)).numpy().tobytes()
    if k == "scale":  # about 1/(32 sqrt(cols)): unit-ish outputs
        rows, cols = kind[1], kind[2]
        sr, sc = (rows + BLOCK - 1) // BLOCK, (cols + BLOCK - 1) // BLOCK
        scale = (0.5 + torch.rand(sr, sc, generator=rng)) / (16.0 * math.sqrt(cols))
        if SCALES == "pow2":  # the release's UE8M0 block scales: powers of two
            scale = torch.pow(2.0, torch.round(torch.log2(scale)))
        return scale.numpy().tobytes()
    if k == "bias":
        return (torch.randn(kind[1], generator=rng) * 0.05).numpy().tobytes()

    def bf16(t):
        return t.to(torch.bfloat16).view(torch.int16).numpy().tobytes()

    if k == "norm":
        raise AssertionError("norm needs its size")
    if k == "small":
        return bf16(torch.randn(kind[1], generator=rng) * 0.1)
    if k == "bf16":
        return bf16(torch.randn(kind[1], kind[2], generator=rng) * kind[2] ** -0.5)
    if k == "embed":
        return bf16(torch.randn(kind[1], kind[2], generator=rng))
    raise AssertionError(k)


def write_shard(path, entries, rng):
    header, off = {"__metadata__": {"format": "pt"}}, 0
    sizes = {"F8_E4M3": 1, "BF16": 2, "F32": 4}
    for name, dtype, shape, _ in entries:
        n = sizes[dtype] * math.prod(shape)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    with open(path + ".partial", "wb") as fh:
        fh.write(struct.pack("<Q", len(text)))
        fh.write(text)
        for name, dtype, shape, kind in entries:
            if kind[0] == "norm":
                data = (1.0 + torch.randn(shape[0], generator=rng) * 0.1).to(torch.bfloat16).view(torch.int16)
                data = data.numpy().tobytes()
            else:
                data = make(kind, rng)
            assert len(data) == header[name]["data_offsets"][1] - header[name]["data_offsets"][0], name
            fh.write(data)
    os.replace(path + ".partial", path)
    return 8 + len(text) + off


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=2, help="decoder layers (the first --dense are dense)")
    ap.add_argument("--dense", type=int, default=1, help="first_k_dense_replace (the release: 3)")
    ap.add_argument("--experts", type=int, default=8, help="routed experts (the release: 256)")
    ap.add_argument("--vocab", type=int, default=16384, help="vocabulary (the release: 129280)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--scales", choices=("float", "pow2"), default="float",
                    help="FP8 block scales: any float, or powers of two as the release's (UE8M0)")
    a = ap.parse_args()
    global SCALES
    SCALES = a.scales
    cfg = release_config(a.layers, a.dense, a.experts, a.vocab)
    rng = torch.Generator().manual_seed(a.seed)
    os.makedirs(a.out, exist_ok=True)
    D, V = cfg["hidden_size"], cfg["vocab_size"]
    shards = [[("model.embed_tokens.weight", "BF16", [V, D], ("embed", V, D)),
               ("lm_head.weight", "BF16", [V, D], ("bf16", V, D)),
               ("model.norm.weight", "BF16", [D], ("norm",))]]
    shards += [layer_tensors(cfg, i) for i in range(a.layers)]
    weight_map, total = {}, 0
    for k, entries in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        total += write_shard(os.path.join(a.out, fname), entries, rng)
        for name, *_ in entries:
            weight_map[name] = fname
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as fh:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, fh, indent=2)
    with open(os.path.join(a.out, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=2)
    print(f"{a.out}: {a.layers} layers ({a.dense} dense), {a.experts} routed experts, vocabulary {V}, "
          f"{total / 1e9:.2f} GB in {len(shards)} shards")


if __name__ == "__main__":
    main()
