#!/usr/bin/python3
"""Golden-reference CLI for the C++ conformance tests (see README.md).

  reference.py --model DIR --tokens 1,2,3 [--decode N] --out OUTDIR [--threads 2]
               [--image FILE ...]

Writes OUTDIR/logits.f32 ([P, vocab] little-endian fp32, P = prompt + N) and
OUTDIR/meta.json.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import vision  # noqa: E402
from model import FIRST_PADDING_ID, Model, ModelError  # noqa: E402
from mxfp4 import MXFP4Error  # noqa: E402
from safetensors_io import SafetensorsError  # noqa: E402


def greedy_pick(row):
    """argmax over ids 0..267 (padding masked to -inf), ties to the lowest id."""
    masked = row.clone()
    masked[FIRST_PADDING_ID:] = float("-inf")
    best = masked.max()
    return int((masked == best).nonzero()[0, 0])


def top2_margin(row):
    vals = torch.sort(row[:FIRST_PADDING_ID], descending=True)[0]
    return float(vals[0] - vals[1])


def image_runs(tokens, image_token_id):
    """(offset, length) of each maximal run of placeholder tokens, in order."""
    runs, i = [], 0
    while i < len(tokens):
        if tokens[i] == image_token_id:
            j = i
            while j < len(tokens) and tokens[j] == image_token_id:
                j += 1
            runs.append((i, j - i))
            i = j
        else:
            i += 1
    return runs


def embed_images(model, prompt, files):
    """The tower's rows for each image file, placed on the prompt's k-th run of
    placeholders (model.md 14.5); returns ([(offset, rows)], [info])."""
    vc = model.cfg.vision
    if files and vc is None:
        raise ModelError("--image given but the model has no vision tower")
    runs = image_runs(prompt, vc.image_token_id) if vc is not None else []
    if len(runs) != len(files):
        raise ModelError(f"the prompt has {len(runs)} image placeholder runs but {len(files)} --image files")
    images, info = [], []
    for k, (path, (offset, n)) in enumerate(zip(files, runs)):
        rgb = vision.read_rgb_file(path)
        rows, (gh, gw) = vision.tower(vc, model.W, rgb)
        if rows.shape[0] != n:
            raise ModelError(f"image {k}: {path} becomes {rows.shape[0]} tokens but its span has {n} placeholders")
        images.append((offset, rows))
        info.append({"offset": offset, "tokens": n, "grid": [gh, gw]})
    return images, info


def run(model, prompt, n_decode, mla_absorbed=False, delta_chunked=False, images=None):
    """Prefill the prompt (one full causal forward), then greedy-decode
    n_decode tokens, feeding each chosen token back through the per-layer
    cache. Row t of the result is the logits at position t of the final
    sequence prompt + generated, so greedy_tokens[n] is exactly the argmax of
    row prompt_len-1+n; the generated token is fed even on the last step so
    that its row exists too. DSA information is gathered the same way."""
    cache = model.new_cache()
    logits, dsa = model.forward(list(prompt), cache, mla_absorbed, delta_chunked, images=images)
    rows = [logits]
    generated = []
    for _ in range(n_decode):
        nxt = greedy_pick(rows[-1][-1])
        generated.append(nxt)
        logits, step_dsa = model.forward([nxt], cache, mla_absorbed, delta_chunked)
        rows.append(logits)
        for layer, info in step_dsa.items():
            for key, vals in info.items():
                dsa[layer][key].extend(vals)
    return torch.cat(rows, dim=0), generated, dsa, list(prompt) + generated


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="model directory (config.json + safetensors)")
    ap.add_argument("--tokens", required=True, help="comma-separated prompt token ids")
    ap.add_argument("--decode", type=int, default=0, help="greedy decode steps after the prompt")
    ap.add_argument("--out", required=True, help="output directory (created)")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--image", action="append", default=[],
                    help="an image for the prompt's next run of placeholder tokens: u32 width, u32 height "
                         "(little-endian), then RGB bytes; writes OUTDIR/vision_K.f32 [tokens, D]")
    ap.add_argument("--mla-absorbed", action="store_true", help="use the absorbed MLA form (same math)")
    ap.add_argument("--delta-chunked", action="store_true", help="use the chunked DeltaNet form (same math)")
    args = ap.parse_args(argv)

    torch.set_num_threads(max(1, args.threads))
    try:
        prompt = [int(t) for t in args.tokens.split(",") if t.strip() != ""]
    except ValueError:
        ap.error(f"--tokens must be comma-separated integers, got {args.tokens!r}")
    if not prompt:
        ap.error("--tokens is empty")
    if args.decode < 0:
        ap.error("--decode must be >= 0")

    t0 = time.time()
    try:
        model = Model.load(args.model)
        t1 = time.time()
        with torch.no_grad():
            images, image_info = embed_images(model, prompt, args.image)
            logits, generated, dsa, seq = run(model, prompt, args.decode, args.mla_absorbed, args.delta_chunked,
                                              images)
    except (ModelError, SafetensorsError, MXFP4Error, OSError, vision.VisionError) as e:
        # A bad checkpoint or input is a clear one-line error, not a traceback.
        print(f"reference: error: {e}", file=sys.stderr)
        return 1
    t2 = time.time()

    os.makedirs(args.out, exist_ok=True)
    P, V = logits.shape
    logits.numpy().astype("<f4").tofile(os.path.join(args.out, "logits.f32"))
    for k, (_, rows) in enumerate(images):
        rows.numpy().astype("<f4").tofile(os.path.join(args.out, f"vision_{k}.f32"))
    usable = logits[:, :FIRST_PADDING_ID]
    meta = {
        "prompt_len": len(prompt),
        "positions": P,
        "vocab_size": V,
        "tokens": seq,
        "greedy_tokens": generated,
        "top2_margin": [top2_margin(logits[t]) for t in range(P)],
        "max_abs_logit": float(usable.abs().max()),
        "max_abs_logit_per_position": usable.abs().max(dim=1)[0].tolist(),
        "dsa_selected": {str(i): d["selected"] for i, d in dsa.items()},
        "dsa_margin": {str(i): d["margin"] for i, d in dsa.items()},
        "dsa_max_abs_score": {str(i): d["max_abs_score"] for i, d in dsa.items()},
        "mla_form": "absorbed" if args.mla_absorbed else "expanded",
        "delta_form": "chunked" if args.delta_chunked else "recurrent",
        "images": image_info,
    }
    with open(os.path.join(args.out, "meta.json"), "w") as f:
        json.dump(meta, f)
    print(
        f"reference: {len(prompt)} prompt + {len(generated)} decoded tokens, logits [{P}, {V}]; "
        f"load {t1 - t0:.1f}s, compute {t2 - t1:.1f}s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
