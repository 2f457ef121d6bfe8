"""Bytes and FLOPs one token of a Qwen3-Next checkpoint needs, from its
config.json, as the engine holds the weights (BF16 matrices, the embedding
row fp32), and the decode roofline they give at a read bandwidth.

  python3 roofline.py --model DIR [--read-gbs 30]
"""
import argparse
import json
import os


def per_token(cfg):
    D, V = cfg["hidden_size"], cfg["vocab_size"]
    L = cfg["num_hidden_layers"]
    n = cfg.get("full_attention_interval", 4)
    kinds = cfg.get("layer_types") or ["full_attention" if (i + 1) % n == 0 else "linear_attention" for i in range(L)]
    H, KV, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv, K = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], cfg["linear_conv_kernel_dim"]
    E, k, I, S = cfg["num_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"], \
        cfg["shared_expert_intermediate_size"]
    params = 0  # weights one token multiplies by (each read once in decode)
    for kind in kinds:
        if kind == "linear_attention":
            # As the engine holds them: q and k repeated per value head.
            params += D * (2 * nv * dk + 2 * nv * dv + 2 * nv) + D * nv * dv
        else:
            params += D * (2 * H * hd + 2 * KV * hd) + D * H * hd
        params += E * D + k * 3 * D * I + 3 * D * S + D
    params += V * D  # the head
    bytes_ = 2 * params + 4 * D
    flops = 2 * params
    return bytes_, flops


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--read-gbs", type=float, default=0)
    a = ap.parse_args()
    with open(os.path.join(a.model, "config.json")) as f:
        cfg = json.load(f)
    b, fl = per_token(cfg)
    print(f"weights read per decoded token: {b / 1e6:.1f} MB; {fl / 1e9:.2f} GFLOP per token")
    if a.read_gbs:
        print(f"decode roofline at {a.read_gbs:.1f} GB/s: {a.read_gbs * 1e9 / b:.1f} tokens/s")


if __name__ == "__main__":
    main()
