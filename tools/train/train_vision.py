"""Train a vision tower onto the tiny agent: models/tiny-vision-agent.

  /usr/bin/python3 tools/train/train_vision.py --base models/tiny-agent/bf16 --stage tower \
      --steps 600 --batch 64 --out RUN/tower
  /usr/bin/python3 tools/train/train_vision.py --base models/tiny-agent/bf16 --stage full \
      --init RUN/tower/weights.pt --steps 300 --batch 8 --text-batch 2 --out RUN/full

(tools/train/train_tiny_vision_agent.sh runs the shipped recipe.)

The language model is the tiny agent (--base: an exported moe-dsa-v1
directory, read with the reference loader, experts dequantised); a vision
tower (docs/model-format.md section 14; VISION below) is added with fresh
weights. Its forward is tools/reference/vision.py's (TrainModel.embed_images
batches the same math), so what trains is what the engine runs. Tasks come
from gen_images.py (train split, drawn on the fly).

Stages:
- tower: the tower and its projector alone, without the language model.
  Each image's caption grid (gen_images.py: one character per image token,
  the digit or shape code whose centre lies in that token's 16x16 cell, else
  a space) is the target: every output row is pulled (mean squared error)
  onto the language model's own embedding of its caption character. The
  tower so learns to write what it sees as tokens the language model
  already reads and copies. A few hundred images a second on one core.
- align: LLaVA's first stage: the chat tasks through the frozen language
  model, only the tower and projector train.
- full: everything trains on the chat tasks (the image question, its answer
  or calculator call in the tiny agent's formats), except the DSA indexers,
  which learn only from their KL to the attention and stay as the tiny agent
  trained them. --text-batch text-only tool conversations (gen_data.py's
  train split, a quarter with cut reasoning as train.py does) ride along in
  each step, so the model keeps its tool skills.

Every --eval-every steps it reports, on held-out images and phrasings (eval
split), the share of conversations whose generated tokens are all the argmax
(teacher-forced whole-answer accuracy: greedy decoding writes exactly those
answers), per kind; in the full stage also on held-out text tool tasks.
It writes OUT/weights.pt, OUT/train_log.json and OUT/model/, a model directory
with the tower (export.py's tensors, BF16 experts) that moe-model-info, the
engine and the reference load; tools/train/train_tiny_vision_agent.sh
exports the shipped ones with export.py (BF16 and MXFP4 experts).
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
import train  # noqa: E402

from safetensors_io import write_safetensors  # noqa: E402  (the reference's, on the path model.py sets)

# The tower of models/tiny-vision-agent: model.md 14.1's keys. 16-pixel
# patches, unmerged: one image token per 16x16 cell (gen_images' character
# pitch), 24 tokens for a 96x64 image.
VISION = {"hidden_size": 96, "num_layers": 3, "num_heads": 4, "intermediate_size": 192, "patch_size": 16,
          "merge_size": 1, "max_patches": 256, "projector_hidden_size": 256}
# moe-model-gen --vision's tower (engine/vision/vision_config.cpp, TinyVisionConfig).
TINY_VISION = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "intermediate_size": 128, "patch_size": 8,
               "merge_size": 2, "max_patches": 256, "projector_hidden_size": 256}


def image_token_count(model):
    return M._vision.image_token_count(model.cfg.vision, *gen_images.SIZE)


# Train on the first assistant turn only (the answer, or the calculator call
# with the values read from the image): what follows a call (the tool's result,
# then `Result C.` and `The answer is C.`) is the tiny agent's calc task,
# which it already writes, and a conversation cut there is half as long.
FIRST_TURN = False


def first_turn(ids, mask):
    """ids, mask up to the <|end|> that closes the first assistant turn."""
    start = ids.index(chat.ASSISTANT)
    end = next(j for j in range(start, len(ids)) if ids[j] == chat.END and mask[j])
    return ids[:end + 1], mask[:end + 1]


def render_vision(model, task):
    """(ids, mask, the offset of each image's first image token in ids)."""
    found = []
    count = image_token_count(model)
    ids, mask = chat.render(gen_images.conversation(task), gen_data.TOOLS, image_tokens=lambda part: count,
                            images=found)
    if FIRST_TURN:
        ids, mask = first_turn(ids, mask)
    return ids, mask, [off for off, _ in found]


def render_text(seqs):
    return [first_turn(ids, mask) for ids, mask in seqs] if FIRST_TURN else seqs


def pad(seqs):
    T = max(len(ids) for ids, _ in seqs)
    ids = torch.zeros(len(seqs), T, dtype=torch.long)
    mask = torch.zeros(len(seqs), T, dtype=torch.bool)
    valid = torch.zeros(len(seqs), T, dtype=torch.bool)
    for b, (i, m) in enumerate(seqs):
        ids[b, :len(i)] = torch.tensor(i)
        mask[b, :len(m)] = torch.tensor(m, dtype=torch.bool)
        valid[b, :len(i)] = True
    return ids, mask, valid


def forward_loss(model, seqs, rows=None):
    """seqs: [(ids, mask)] sharing the tools block; rows: [(b, positions, tower
    rows)]. Returns (loss, per-sequence all-argmax flags, token accuracy)."""
    ids, mask, valid = pad(seqs)
    # Every conversation starts with the same tools block: computed once per
    # batch as the forward's shared prefix (as train.py does).
    P = chat.shared_prefix_len(gen_data.TOOLS)
    rows = [(b, pos - P, r) for b, pos, r in rows or []]
    ids, mask, valid = ids[:, P:], mask[:, P:], valid[:, P:]
    logits, _ = model(ids, valid=valid, dsa_mode="sparse", prefix=model_prefix(P), image_rows=rows)
    # Position t predicts token t+1; the targets are the generated tokens.
    pred, tgt, m = logits[:, :-1], ids[:, 1:], mask[:, 1:]
    loss = F.cross_entropy(pred[m], tgt[m])
    right = (pred.argmax(-1) == tgt) | ~m
    return loss, right.all(-1).tolist(), float(right[m].float().mean())


def vision_loss(model, tasks_and_images):
    rendered = [render_vision(model, t) for t, _ in tasks_and_images]
    emb = model.embed_images(torch.from_numpy(np.stack([img for _, img in tasks_and_images])))
    n = emb.shape[1]
    rows = [(b, torch.arange(off, off + n), emb[b]) for b, (_, _, offs) in enumerate(rendered) for off in offs]
    return forward_loss(model, [(ids, mask) for ids, mask, _ in rendered], rows)


def loss_and_accuracy(model, tasks_and_images):
    loss, _, acc = vision_loss(model, tasks_and_images)
    return loss, acc


def model_prefix(P):
    return chat.render([], gen_data.TOOLS)[0][:P]


def draw(gen, n):
    kinds = gen.rng.choices(gen_images.KINDS, gen_images.WEIGHTS, k=n)
    return [gen.task(k) for k in kinds]


def caption_targets(tasks):
    """Byte ids [B, cells] of the caption grids, row by row (the tower's token order)."""
    return torch.tensor([[ord(ch) for ch in "".join(t["cells"])] for t, _ in tasks])


CAPTION_CHARS = sorted({ord(c) for c in " 0123456789" + "".join(gen_images.SHAPE_CODES.values())})


def tower_loss(model, tasks_and_images):
    """Each output row against the language model's embedding of its caption
    character: the mean squared distance, plus a cross-entropy over the
    caption characters with the negative squared distances as logits (it
    pushes a row away from the other characters' embeddings, which the
    distance alone barely does). Accuracy: the nearest caption character is
    the right one, per cell and per whole image."""
    emb = model.embed_images(torch.from_numpy(np.stack([img for _, img in tasks_and_images])))
    table = model.W("embed.weight").detach()
    tgt = caption_targets(tasks_and_images)
    chars = torch.tensor(CAPTION_CHARS)
    flat = emb.reshape(-1, emb.shape[-1])
    E = table[chars]
    dist = (flat.pow(2).sum(-1, keepdim=True) - 2 * flat @ E.T + E.pow(2).sum(-1)) / flat.shape[-1]  # [B*cells, chars]
    cls = torch.searchsorted(chars, tgt.reshape(-1))
    loss = (emb - table[tgt]).pow(2).mean() + F.cross_entropy(-dist, cls)
    with torch.no_grad():
        ok = (dist.argmin(-1) == cls).view_as(tgt)
    return loss, ok.all(-1).tolist(), float(ok.float().mean())


def text_eval_set(count):
    tasks = gen_data.generate("eval", 2, count)
    return render_text([chat.render(t["messages"], t["tools"]) for t in tasks]), [t["kind"] for t in tasks]


def evaluate(model, stage, eval_vision, eval_text, batch):
    """Held-out whole-answer accuracy per kind (teacher-forced all-argmax)."""
    out = {}
    with torch.no_grad():
        flags = []
        losses = []
        for i in range(0, len(eval_vision), batch):
            chunk = eval_vision[i:i + batch]
            loss, ok, _ = (tower_loss if stage == "tower" else vision_loss)(model, chunk)
            flags += ok
            losses.append(float(loss))
        out["loss"] = sum(losses) / len(losses)
        kinds = [t["kind"] for t, _ in eval_vision]
        for k in gen_images.KINDS:
            sel = [f for f, kk in zip(flags, kinds) if kk == k]
            out[k] = sum(sel) / max(1, len(sel))
        out["all"] = sum(flags) / len(flags)
        if stage == "full" and eval_text:
            seqs, tkinds = eval_text
            tflags = []
            for i in range(0, len(seqs), batch):
                tflags += forward_loss(model, seqs[i:i + batch])[1]
            out["text_all"] = sum(tflags) / len(tflags)
            for k in gen_data.KINDS:
                sel = [f for f, kk in zip(tflags, tkinds) if kk == k]
                out["text_" + k] = sum(sel) / max(1, len(sel))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the tiny agent's model directory (config.json, safetensors)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--stage", choices=["tower", "align", "full"], default="align")
    ap.add_argument("--unfreeze", action="store_true", help="the same as --stage full")
    ap.add_argument("--init", help="weights.pt of an earlier stage (with the tower)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--text-batch", type=int, default=0, help="text-only tool conversations per step (full stage)")
    ap.add_argument("--lr", type=float, default=1e-3, help="peak rate of the tower and projector")
    ap.add_argument("--lm-lr", type=float, default=3e-4, help="peak rate of the language model (full stage)")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--eval-count", type=int, default=60)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1 on a busy machine: waiting threads cost more than they give)")
    ap.add_argument("--first-turn", action="store_true", help="train on the first assistant turn only (FIRST_TURN)")
    a = ap.parse_args()
    global FIRST_TURN
    FIRST_TURN = a.first_turn
    if a.unfreeze:
        a.stage = "full"
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)

    with open(os.path.join(a.base, "config.json")) as f:
        raw = json.load(f)
    raw["vision"] = dict(VISION)
    cfg = M.Config(raw)
    model = M.TrainModel(cfg, seed=a.seed)
    base = M.ref.load_weights(a.base, M.Config({k: v for k, v in raw.items() if k != "vision"}))
    model.load_fp32(base)
    if a.init:
        model.load_fp32(torch.load(a.init))
    model.indexer_kl = False  # the indexers stay as the tiny agent trained them

    def trains(name):
        if name.startswith("vision__"):
            return True
        return a.stage == "full" and "__indexer__" not in name

    for name, p in model.p.items():
        p.requires_grad = trains(name)
    tower = [p for n, p in model.p.items() if p.requires_grad and n.startswith("vision__")]
    lm = [p for n, p in model.p.items() if p.requires_grad and not n.startswith("vision__")]
    groups = [{"params": tower, "peak": a.lr}] + ([{"params": lm, "peak": a.lm_lr}] if lm else [])
    opt = torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)
    params = tower + lm
    train_gen, held_out = gen_images.Generator("train", a.seed), gen_images.Generator("eval", a.seed + 1000)
    eval_vision = draw(held_out, a.eval_count)
    eval_text = text_eval_set(min(a.eval_count, 40)) if a.stage == "full" and a.text_batch else None
    log = {"stage": a.stage, "args": vars(a), "steps": [], "eval": [],
           "trainable_parameters": sum(p.numel() for p in params)}
    t0 = time.time()
    for step in range(1, a.steps + 1):
        # Linear warm-up, then cosine decay to 10% of the peak.
        frac = min(1.0, step / max(1, a.warmup)) if step <= a.warmup else \
            0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - a.warmup) / max(1, a.steps - a.warmup)))
        for g in opt.param_groups:
            g["lr"] = g["peak"] * frac
        tasks = draw(train_gen, a.batch)
        if a.stage == "tower":
            loss, _, acc = tower_loss(model, tasks)
        else:
            loss, _, acc = vision_loss(model, tasks)
        if a.stage == "full" and a.text_batch:
            text = render_text(train.window_examples(a.seed, step, a.text_batch, 0.25))
            tloss, _, _ = forward_loss(model, text)
            loss = loss + tloss * (a.text_batch / a.batch)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        log["steps"].append({"step": step, "loss": float(loss), "token_accuracy": acc, "seconds": time.time() - t0})
        if step % 10 == 0:
            print(f"step {step}: loss {float(loss):.4f} acc {acc:.3f} {time.time() - t0:.0f}s", flush=True)
        if step % a.eval_every == 0 or step == a.steps:
            ev = evaluate(model, a.stage, eval_vision, eval_text, 16 if a.stage != "tower" else 64)
            ev["step"] = step
            ev["seconds"] = time.time() - t0
            log["eval"].append(ev)
            print("eval " + json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in ev.items()}),
                  flush=True)
            # The weights so far (replaced at the end), to look at a run while it goes on.
            os.makedirs(a.out, exist_ok=True)
            torch.save(model.state_dict_fp32(), os.path.join(a.out, f"weights.step{step}.pt"))

    os.makedirs(a.out, exist_ok=True)
    weights = model.state_dict_fp32()
    torch.save(weights, os.path.join(a.out, "weights.pt"))
    log["seconds"] = time.time() - t0
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
