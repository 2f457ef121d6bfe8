#!/usr/bin/env python3
"""Small random checkpoints of the Hugging Face families the engine serves,
for bench_batch_curve: gpt-oss, DeepSeek-V3.2 and Qwen3-Next at about the
size of moe-model-gen's small preset (hidden 1024, 4 layers, 32 routed
experts of width 384 with top-4 routing, vocabulary 8192), written in
seconds, in each family's published layout, by the repository's own writers:

  gpt-oss        bench/gpt_oss/make_random_checkpoint.py (MXFP4 experts, BF16 dense)
  deepseek_v32   bench/deepseek_v32/make_checkpoint.py (FP8 linear weights, converted at load)
  qwen3_next     tools/reference/families/qwen3_next.py (BF16)

with smaller shapes than their release ones. No tokenizer files: the bench
runs on token ids (gpt-oss is then loaded as moe-run --prompt-ids loads it).
The values are noise.

  /usr/bin/python3 bench/batch_curve/make_models.py --out DIR [--family gpt-oss,deepseek_v32,qwen3_next]

writes DIR/gpt-oss, DIR/deepseek_v32, DIR/qwen3_next.
"""
import argparse
import importlib.util
import json
import os
import sys
import types

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

HIDDEN, LAYERS, EXPERTS, TOPK, EXPERT_WIDTH, VOCAB = 1024, 4, 32, 4, 384, 8192


def load(rel, name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, rel))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def gpt_oss(out, seed):
    g = load("bench/gpt_oss/make_random_checkpoint.py", "gpt_oss_writer")
    import numpy as np
    # gpt-oss's expert blocks are as wide as the hidden size (2880 both in
    # the release); 16 query and 4 key/value heads of 64, window 128.
    s = dict(hidden=HIDDEN, inter=HIDDEN, heads=16, kv=4, d=64, experts=EXPERTS, topk=TOPK, layers=LAYERS, vocab=VOCAB)
    rng = np.random.default_rng(seed)
    os.makedirs(out, exist_ok=True)
    shards = [[("model.embed_tokens.weight", "BF16", [VOCAB, HIDDEN], "normal", 1.0),
               ("model.norm.weight", "BF16", [HIDDEN], "one", 0.1),
               ("lm_head.weight", "BF16", [VOCAB, HIDDEN], "normal", HIDDEN ** -0.5)]]
    shards += [g.layer_tensors(s, i) for i in range(LAYERS)]
    weight_map = {}
    for si, tensors in enumerate(shards):
        name = f"model-{si:05d}-of-{len(shards):05d}.safetensors"
        g.write_shard(os.path.join(out, name), tensors, rng)
        weight_map.update({t[0]: name for t in tensors})
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=1)
    cfg = g.config(s, LAYERS)
    cfg["eos_token_id"], cfg["pad_token_id"] = VOCAB - 1, VOCAB - 2  # inside the small vocabulary
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)


def deepseek_v32(out, seed):
    d = load("bench/deepseek_v32/make_checkpoint.py", "deepseek_v32_writer")
    import torch
    cfg = d.release_config(LAYERS, 1, EXPERTS, VOCAB)
    # index_head_dim stays 128 (the FP8 groups and the Hadamard size).
    cfg.update({"hidden_size": HIDDEN, "num_attention_heads": 8, "num_key_value_heads": 8, "q_lora_rank": 384,
                "kv_lora_rank": 256, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64,
                "index_n_heads": 4, "index_topk": 2048, "intermediate_size": 2816,
                "moe_intermediate_size": EXPERT_WIDTH, "num_experts_per_tok": TOPK, "n_group": 4, "topk_group": 2})
    rng = torch.Generator().manual_seed(seed)
    os.makedirs(out, exist_ok=True)
    D, V = HIDDEN, VOCAB
    shards = [[("model.embed_tokens.weight", "BF16", [V, D], ("embed", V, D)),
               ("lm_head.weight", "BF16", [V, D], ("bf16", V, D)),
               ("model.norm.weight", "BF16", [D], ("norm",))]]
    shards += [d.layer_tensors(cfg, i) for i in range(LAYERS)]
    weight_map, total = {}, 0
    for k, entries in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        total += d.write_shard(os.path.join(out, fname), entries, rng)
        for name, *_ in entries:
            weight_map[name] = fname
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as fh:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, fh, indent=2)
    with open(os.path.join(out, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=2)


def qwen3_next(out, seed):
    q = load("tools/reference/families/qwen3_next.py", "qwen3_next_writer")
    base = q.real_config(types.SimpleNamespace(layers=LAYERS, experts=EXPERTS))
    base.update({"hidden_size": HIDDEN, "intermediate_size": 2816, "vocab_size": VOCAB, "num_attention_heads": 8,
                 "num_key_value_heads": 2, "head_dim": 128, "linear_num_key_heads": 4, "linear_num_value_heads": 8,
                 "num_experts_per_tok": TOPK, "moe_intermediate_size": EXPERT_WIDTH,
                 "shared_expert_intermediate_size": EXPERT_WIDTH, "bos_token_id": VOCAB - 2,
                 "eos_token_id": VOCAB - 1})
    q.real_config = lambda a: base  # the writer's "80b" path, at these shapes
    q.cmd_write(types.SimpleNamespace(out=out, shape="80b", seed=seed, layers=LAYERS, hidden=HIDDEN, vocab=VOCAB,
                                      experts=EXPERTS))


WRITERS = {"gpt-oss": gpt_oss, "deepseek_v32": deepseek_v32, "qwen3_next": qwen3_next}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--family", default=",".join(WRITERS), help="comma-separated: " + ", ".join(WRITERS))
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    for fam in a.family.split(","):
        if fam not in WRITERS:
            ap.error(f"unknown family {fam!r} (one of {', '.join(WRITERS)})")
        WRITERS[fam](os.path.join(a.out, fam), a.seed)
        print(os.path.join(a.out, fam), flush=True)


if __name__ == "__main__":
    sys.exit(main())
