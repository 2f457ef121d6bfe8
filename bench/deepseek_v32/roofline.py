"""Bytes and FLOPs one token of a DeepSeek-V3.2 checkpoint needs, from its
config.json, as the engine holds the weights (--weights fp8, the default:
the published FP8 matrices kept FP8, a byte a weight plus a 4-byte scale per
128 x 128 block, kv_b_proj BF16 with power-of-two block scales or F32 with
others (--kv-b), the router, indexer weights_proj and head BF16; --weights
bf16: every matrix BF16, as the loader held them before FP8 was kept; the
routed experts BF16 or, with --experts mxfp4, 4.25 bits a weight; the
embedding row fp32), and the rooflines they give at a read bandwidth and an
FMA peak.

  python3 roofline.py --model DIR [--experts bf16|mxfp4] [--weights fp8|bf16] [--kv-b bf16|f32]
                      [--read-gbs 30] [--gflops 500]
                      [--prompt 128] [--layers 61 --dense 3 --experts-total 256 --vocab 129280]
                      [--prefill-tps X --decode-tps Y]

With the measured speeds (--prefill-tps, --decode-tps: moe-run's summary)
it prints the fraction of each roofline they reached (bench/deepseek_v32/run.sh
passes the ceilings bench_roofline measured in the same run).

Decode reads every weight a token multiplies by once (the top-k routed
experts of each MoE layer, not all of them); prefill of a P-token prompt
does 2 FLOPs a weight a token, plus its attention over the prompt (DSA:
each query attends over min(t, index_topk) keys in the 512+64-wide latent
space, and the indexer scores every earlier key). The --layers ... options
scale the same per-layer figures to the full release."""
import argparse
import json
import os


def fp8_bytes(rows, cols):
    """An FP8 matrix as held: its codes and its 128 x 128 block scales."""
    return rows * cols + 4 * ((rows + 127) // 128) * ((cols + 127) // 128)


def per_layer(cfg, experts_bits, experts_total=None, weights="fp8", kv_b_bytes=2):
    D = cfg["hidden_size"]
    H, ql, kvl = cfg["num_attention_heads"], cfg["q_lora_rank"], cfg["kv_lora_rank"]
    nope, rope, vd = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    IH, ID = cfg["index_n_heads"], cfg["index_head_dim"]
    E, k, I, S = experts_total or cfg["n_routed_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"], \
        cfg["n_shared_experts"] * cfg["moe_intermediate_size"]
    attn = D * ql + ql * H * (nope + rope) + D * (kvl + rope) + H * (nope + vd) * kvl + H * vd * D
    indexer = ql * IH * ID + D * ID + D * IH
    dense_ffn = 3 * D * cfg["intermediate_size"]
    routed = k * 3 * D * I
    moe_dense = E * D + 3 * D * S
    if weights == "bf16":
        attn_b, indexer_b, dense_ffn_b, moe_dense_b = 2 * attn, 2 * indexer, 2 * dense_ffn, 2 * moe_dense
    else:
        attn_b = (fp8_bytes(ql, D) + fp8_bytes(H * (nope + rope), ql) + fp8_bytes(kvl + rope, D) +
                  fp8_bytes(D, H * vd) + kv_b_bytes * H * (nope + vd) * kvl)
        indexer_b = fp8_bytes(IH * ID, ql) + fp8_bytes(ID, D) + 2 * D * IH
        F = cfg["intermediate_size"]
        dense_ffn_b = 2 * fp8_bytes(F, D) + fp8_bytes(D, F)
        moe_dense_b = 2 * E * D + (2 * fp8_bytes(S, D) + fp8_bytes(D, S) if S else 0)
    # (bytes, flops) of one token through a dense and an MoE layer
    dense = (attn_b + indexer_b + dense_ffn_b, 2 * (attn + indexer + dense_ffn))
    moe = (attn_b + indexer_b + moe_dense_b + routed * experts_bits / 8, 2 * (attn + indexer + moe_dense + routed))
    return dense, moe


def attention_flops(cfg, t):
    """FLOPs of one query at position t (0-based) attending, latent (absorbed) form, plus its indexer scores."""
    H, kvl, rope = cfg["num_attention_heads"], cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    keys = min(t + 1, cfg["index_topk"])
    return 2 * H * keys * (kvl + rope + kvl) + 2 * cfg["index_n_heads"] * (t + 1) * cfg["index_head_dim"]


def totals(cfg, layers, dense_layers, vocab, experts_bits, prompt, experts_total=None, weights="fp8", kv_b_bytes=2):
    dense, moe = per_layer(cfg, experts_bits, experts_total, weights, kv_b_bytes)
    D = cfg["hidden_size"]
    head = (2 * vocab * D, 2 * vocab * D)
    b = dense_layers * dense[0] + (layers - dense_layers) * moe[0] + head[0] + 4 * D
    f = dense_layers * dense[1] + (layers - dense_layers) * moe[1] + head[1]
    attn = layers * sum(attention_flops(cfg, t) for t in range(prompt)) / max(prompt, 1)
    return b, f, f + attn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--experts", choices=["bf16", "mxfp4"], default="bf16")
    ap.add_argument("--weights", choices=["fp8", "bf16"], default="fp8",
                    help="fp8: the FP8 matrices held FP8 (the engine now); bf16: all BF16 (before)")
    ap.add_argument("--kv-b", choices=["bf16", "f32"], default="bf16",
                    help="kv_b_proj as converted: bf16 (power-of-two block scales, the release) or f32")
    ap.add_argument("--read-gbs", type=float, default=0)
    ap.add_argument("--gflops", type=float, default=0)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--layers", type=int, default=61)
    ap.add_argument("--dense", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=129280)
    ap.add_argument("--experts-total", type=int, default=256, help="routed experts of the release (its router rows)")
    ap.add_argument("--prefill-tps", type=float, default=0, help="measured prefill tokens/s of this checkpoint")
    ap.add_argument("--decode-tps", type=float, default=0, help="measured decode tokens/s of this checkpoint")
    a = ap.parse_args()
    with open(os.path.join(a.model, "config.json")) as f:
        cfg = json.load(f)
    bits = 16 if a.experts == "bf16" else 4.25
    rows = [("this checkpoint", cfg["num_hidden_layers"], cfg["first_k_dense_replace"], cfg["vocab_size"], None),
            ("the release", a.layers, a.dense, a.vocab, a.experts_total)]
    for name, L, dl, V, E in rows:
        b, f, fp = totals(cfg, L, dl, V, bits, a.prompt, E, a.weights, 2 if a.kv_b == "bf16" else 4)
        line = (f"{name} ({L} layers, {dl} dense, vocabulary {V}, {a.experts} experts, {a.weights} matrices): "
                f"{b / 1e6:.1f} MB read per decoded token, {f / 1e9:.2f} GFLOP per decoded token, "
                f"{fp / 1e9:.2f} GFLOP per prompt token ({a.prompt}-token prefill)")
        if a.read_gbs:
            line += f"; decode roofline {a.read_gbs * 1e9 / b:.2f} tokens/s at {a.read_gbs:.1f} GB/s"
        if a.gflops:
            line += f"; prefill roofline {a.gflops * 1e9 / fp:.1f} tokens/s at {a.gflops:.0f} GFLOP/s"
        print(line)
        if name != "this checkpoint":
            continue
        if a.read_gbs and a.decode_tps:
            roof = a.read_gbs * 1e9 / b
            print(f"  decode: measured {a.decode_tps:.2f} tokens/s = {100 * a.decode_tps / roof:.1f}% of the "
                  f"bandwidth roofline ({roof:.2f} tokens/s); {a.decode_tps * b / 1e9:.2f} GB/s of weights read")
        if a.gflops and a.prefill_tps:
            roof = a.gflops * 1e9 / fp
            print(f"  prefill: measured {a.prefill_tps:.2f} tokens/s = {100 * a.prefill_tps / roof:.1f}% of the "
                  f"FMA roofline ({roof:.1f} tokens/s); {a.prefill_tps * fp / 1e9:.1f} GFLOP/s")


if __name__ == "__main__":
    main()
