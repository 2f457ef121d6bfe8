"""Train a vision tower onto the tiny agent (a sketch of the first stage).

  /usr/bin/python3 tools/train/train_vision.py --base models/tiny-agent/bf16 \
      --steps 300 --batch 8 --out build-x/tiny-vision-agent [--unfreeze] [--seed 1]

What it does, LLaVA's recipe scaled down:
- the language model is the tiny agent (--base: an exported moe-dsa-v1
  directory, read with the reference loader, experts dequantised);
- a vision tower of moe-model-gen --vision's shape (docs/model-format.md
  section 14.1: Dv 64, 2 blocks, 8-pixel patches merged 2x2) is added with
  fresh weights; its forward is tools/reference/vision.py's, so what trains
  is exactly what the engine runs;
- tasks come from gen_images.py (train split, drawn on the fly): the user
  message holds the question and the image; the assistant answers, or calls
  `calculator` with the two numbers it read and then answers;
- stage 1 (default) trains only the tower and its projector (the language
  model frozen, as LLaVA's feature-alignment stage); --unfreeze trains
  everything (stage 2);
- every --eval-every steps it reports the teacher-forced accuracy of the
  generated tokens on held-out images and phrasings (eval split);
- it writes OUT/weights.pt, OUT/train_log.json and OUT/model/, a model
  directory with the tower (export.py's tensors and manifest), which
  moe-model-info, the engine and the reference load.

Not done here: the accuracy bar through the daemon and the official client
(greedy decoding of whole answers), the MXFP4 comparison, and the time it
takes to reach them; this is the training loop those runs start from.
"""

import argparse
import json
import math
import os
import random
import shutil
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import chat  # noqa: E402
import export  # noqa: E402
import gen_data  # noqa: E402
import gen_images  # noqa: E402
import model as M  # noqa: E402

from safetensors_io import write_safetensors  # noqa: E402  (the reference's, on the path model.py sets)

# moe-model-gen --vision's tower (engine/vision/vision_config.cpp, TinyVisionConfig).
TINY_VISION = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "intermediate_size": 128, "patch_size": 8,
               "merge_size": 2, "max_patches": 256, "projector_hidden_size": 256}


def conversation(task):
    """The task's full conversation: user (question + image), then the answer,
    with a calculator call first for a sum."""
    messages = list(task["messages"])
    calls = task["expect"]["calls"]
    if calls:
        expr = calls[0]["arguments"]["expression"]
        a, b = expr.split("+")
        messages.append({"role": "assistant", "reasoning_content": f"The picture shows {a} and {b}.", "content": "",
                         "tool_calls": [{"id": "call_" + "0" * 24, "type": "function",
                                         "function": {"name": "calculator", "arguments": json.dumps(calls[0]["arguments"])}}]})
        messages.append({"role": "tool", "tool_call_id": "call_" + "0" * 24, "content": str(int(a) + int(b))})
    messages.append({"role": "assistant", "reasoning_content": "", "content": task["reference_answer"]})
    return messages


def batch(model, tasks_and_images):
    """ids [B, T], target mask [B, T], image rows for forward()."""
    vc = model.cfg.vision
    seqs, rows = [], []
    for b, (task, img) in enumerate(tasks_and_images):
        found = []
        n = gen_images.SIZE
        count = M._vision.image_token_count(vc, n[0], n[1])
        ids, mask = chat.render(conversation(task), gen_data.TOOLS, image_tokens=lambda part: count, images=found)
        seqs.append((ids, mask))
        for offset, _ in found:
            rows.append((b, torch.arange(offset, offset + count), model.embed_image(torch.from_numpy(img))))
    T = max(len(ids) for ids, _ in seqs)
    ids = torch.zeros(len(seqs), T, dtype=torch.long)
    mask = torch.zeros(len(seqs), T, dtype=torch.bool)
    valid = torch.zeros(len(seqs), T, dtype=torch.bool)
    for b, (i, m) in enumerate(seqs):
        ids[b, :len(i)] = torch.tensor(i)
        mask[b, :len(m)] = torch.tensor(m, dtype=torch.bool)
        valid[b, :len(i)] = True
    return ids, mask, valid, rows


def loss_and_accuracy(model, tasks_and_images):
    ids, mask, valid, rows = batch(model, tasks_and_images)
    # Every conversation starts with the same tools block: computed once per
    # batch as the forward's shared prefix (as train.py does).
    P = chat.shared_prefix_len(gen_data.TOOLS)
    rows = [(b, pos - P, r) for b, pos, r in rows]
    ids, mask, valid = ids[:, P:], mask[:, P:], valid[:, P:]
    logits, _ = model(ids, valid=valid, dsa_mode="sparse", prefix=model_prefix(P), image_rows=rows)
    # Position t predicts token t+1; the targets are the generated tokens.
    pred, tgt, m = logits[:, :-1], ids[:, 1:], mask[:, 1:]
    loss = F.cross_entropy(pred[m], tgt[m])
    acc = (pred[m].argmax(-1) == tgt[m]).float().mean()
    return loss, float(acc)


def model_prefix(P):
    return chat.render([], gen_data.TOOLS)[0][:P]


def draw(gen, n):
    kinds = gen.rng.choices(gen_images.KINDS, gen_images.WEIGHTS, k=n)
    return [gen.task(k) for k in kinds]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the tiny agent's model directory (config.json, safetensors)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--unfreeze", action="store_true", help="train the language model too (stage 2)")
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--eval-count", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)

    with open(os.path.join(a.base, "config.json")) as f:
        raw = json.load(f)
    raw["vision"] = dict(TINY_VISION)
    cfg = M.Config(raw)
    model = M.TrainModel(cfg, seed=a.seed)
    base = M.ref.load_weights(a.base, M.Config({k: v for k, v in raw.items() if k != "vision"}))
    model.load_fp32(base)
    for name, p in model.p.items():
        p.requires_grad = a.unfreeze or name.startswith("vision__")
    params = [p for p in model.p.values() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=a.lr, weight_decay=0.0)
    train, held_out = gen_images.Generator("train", a.seed), gen_images.Generator("eval", a.seed + 1000)
    eval_set = draw(held_out, a.eval_count)
    log = {"steps": [], "eval": [], "trainable_parameters": sum(p.numel() for p in params)}
    t0 = time.time()
    for step in range(1, a.steps + 1):
        lr = a.lr * 0.5 * (1 + math.cos(math.pi * (step - 1) / a.steps))
        for g in opt.param_groups:
            g["lr"] = lr
        loss, acc = loss_and_accuracy(model, draw(train, a.batch))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        log["steps"].append({"step": step, "loss": float(loss), "token_accuracy": acc, "seconds": time.time() - t0})
        if step % a.eval_every == 0 or step == a.steps:
            with torch.no_grad():
                el, ea = loss_and_accuracy(model, eval_set)
            log["eval"].append({"step": step, "loss": float(el), "token_accuracy": ea})
            print(f"step {step}: train loss {float(loss):.3f}, held-out loss {float(el):.3f}, "
                  f"held-out token accuracy {ea:.3f}, {time.time() - t0:.0f}s", flush=True)

    os.makedirs(a.out, exist_ok=True)
    weights = model.state_dict_fp32()
    torch.save(weights, os.path.join(a.out, "weights.pt"))
    with open(os.path.join(a.out, "train_log.json"), "w") as f:
        json.dump(log, f)
    out_model = os.path.join(a.out, "model")
    os.makedirs(out_model, exist_ok=True)
    write_safetensors(os.path.join(out_model, "model.safetensors"), export.checkpoint_tensors(cfg, weights),
                      {"format": "pt", "generator": "tools/train/train_vision.py"})
    with open(os.path.join(out_model, "config.json"), "w") as f:
        json.dump(raw, f, indent=2)
        f.write("\n")
    shutil.copyfile(os.path.join(a.base, "tokenizer.json"), os.path.join(out_model, "tokenizer.json"))
    export.write_manifest(out_model)
    print(f"train_vision: {out_model}")


if __name__ == "__main__":
    main()
