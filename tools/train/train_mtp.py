"""Train the multi-token-prediction (MTP) layer of a shipped model, its trunk
frozen, and measure the layer's teacher-forced draft acceptance.

  /usr/bin/python3 tools/train/train_mtp.py --model models/tiny-agent/bf16 --seed 11 --steps 80 \
      --batch 16 --lr 3e-3 --warmup 8 --chain-weight 0.5 --threads 2 --out RUN/mtp   # train, then evaluate
  /usr/bin/python3 tools/train/train_mtp.py --model DIR_WITH_MTP --eval-only [--limit 60]
  /usr/bin/python3 tools/train/train_mtp.py --data vision --model models/tiny-vision-agent/bf16 --seed 11 \
      --steps 20 --batch 8 --lr 3e-3 --warmup 3 --chain-weight 0.5 --threads 2 --limit 150 --out RUN/vision-mtp

The layer (DeepSeek-V3's MTP, model.py's mtp_*) reads the trunk's last hidden
state h_i (before the final norm) and the token t_{i+1}, and predicts t_{i+2}
through one mla block and the model's own head. Its block starts as a copy of
the trunk's layer 0 (mla attention, dense SwiGLU), mtp.0.norm as the final
norm, eh_proj as [I I] (the normalised embedding plus the normalised hidden
state: what layer 0 sees at position i + 1, plus the context). Only the MTP
tensors train; the trunk runs under no_grad in the inference mode (DSA
top-k).

Data: train.py's windows (gen_data's train split, a quarter of the
reasoning spans cut, no call-id copying), the tools block computed once per
batch by the trunk. The loss is cross-entropy on t_{i+2} where t_{i+2} is a
token the model generates; with --chain-weight also the chained second draft
(row i + 1 fed the block's own output at i and the true t_{i+2}, attending to
the first pass's keys, as a chained draft at inference), weighted.

Evaluation: gen_data's held-out split (--eval-seed 2, 300 tasks), rendered
whole, teacher-forced. At each position whose t_{i+1} and t_{i+2} are both
generated (a draft follows a decoded token): how often the draft (argmax MTP)
equals t_{i+2}, and how often it equals the trunk's own greedy prediction for
i + 2 given the true prefix: the first draft's acceptance under greedy
decoding. For the chained draft, its acceptance where the first was accepted.
Writes OUT/mtp_weights.pt (the MTP tensors, fp32) and OUT/mtp_log.json.

--data vision (a model with a vision tower, models/tiny-vision-agent): the
image tasks of gen_images.py instead, batched as train_vision.py batches
them: each picture through the frozen tower, its rows in place of the image
placeholders' embeddings, the tools block the batch's shared prefix. Whole
conversations (the calculator's second turn too: it is decoded as well).
Training draws the train split from --seed; evaluation renders gen_images'
held-out split (--eval-seed 2, 300 tasks: tools/eval/run.sh's vision set).
Image ids are never generated, so never a target and never a draft; the MTP
input at an image position is the placeholder's own embedding, as the
engine's MTP step reads it (it sees token ids, not the tower's rows).
"""

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chat  # noqa: E402
import gen_data  # noqa: E402
import gen_images  # noqa: E402
import model as M  # noqa: E402
import train  # noqa: E402
import train_vision  # noqa: E402

NOT_GENERATED = chat.TOOLS + 1  # ids from here on (padding, image ids) are never generated


def init_from_layer0(model, layer=0):
    """The MTP block from the trunk's layer 0 (an mla layer with the dense
    FFN), its final norm from the trunk's, eh_proj = [I I]."""
    cfg = model.cfg
    if cfg.layer_types[0] != "mla" or cfg.first_dense_layers < 1:
        raise ValueError("init_from_layer0 needs layer 0 to be mla with the dense FFN")
    p = f"mtp.{layer}."
    D = cfg.hidden_size
    with torch.no_grad():
        for name in M.mtp_tensors(cfg):
            if not name.startswith(p):
                continue
            rest = name[len(p):]
            if rest.startswith(("attn", "ffn")):
                model.W(name).copy_(model.W("layers.0." + rest))
            elif rest == "norm.weight":
                model.W(name).copy_(model.W("norm.weight"))
            elif rest in ("enorm.weight", "hnorm.weight"):
                model.W(name).fill_(1.0)
            elif rest == "eh_proj.weight":
                eye = torch.eye(D)
                model.W(name).copy_(torch.cat([eye, eye], dim=1))


def mtp_parameters(model):
    return [v for k, v in model.p.items() if k.startswith("mtp__")]


def freeze_trunk(model):
    for k, v in model.p.items():
        v.requires_grad_(k.startswith("mtp__"))
    model.indexer_kl = False  # the indexers do not train either


def draft_stats(first, chained, trunk_next, full, gen):
    """Counts of the drafts against the truth and against the trunk's greedy
    predictions, whole sequences. first [B, L-2, V] drafts for full[:, 2:];
    chained [B, L-3, V] for full[:, 3:] or None; trunk_next [B, L-1] the
    trunk's argmax at positions 0..L-2 (its prediction for full[:, 1:]);
    gen [B, L] the generated-token mask. Counted where t_{i+1} and t_{i+2}
    (chained: also t_{i+3}) are generated."""
    L = full.shape[1]
    d1 = first[..., :NOT_GENERATED].argmax(-1)  # [B, L-2]
    where1 = gen[:, 1 : L - 1] & gen[:, 2:]
    ok1 = d1 == trunk_next[:, 1:]  # the trunk's prediction for t_{i+2}
    s = {"n1": int(where1.sum()), "true1": int(((d1 == full[:, 2:]) & where1).sum()),
         "accept1": int((ok1 & where1).sum())}
    if chained is not None:
        d2 = chained[..., :NOT_GENERATED].argmax(-1)  # [B, L-3], row j drafts t_{j+3}
        where2 = where1[:, : L - 3] & gen[:, 3:]
        ok2 = d2 == trunk_next[:, 2:]
        s.update(n2=int(where2.sum()), true2=int(((d2 == full[:, 3:]) & where2).sum()),
                 accept2=int((ok2 & where2).sum()), after1=int((where2 & ok1[:, : L - 3]).sum()),
                 both=int((where2 & ok1[:, : L - 3] & ok2).sum()))
    return s


def text_drafts(model, part, chain):
    """gen_data tasks rendered whole, through the trunk and the MTP layer:
    (full [B, L] ids, gen [B, L] generated mask, trunk_next [B, L-1] the
    trunk's argmax for full[:, 1:], first [B, L-2, V] drafts for full[:, 2:],
    chained [B, L-3, V] for full[:, 3:] or None)."""
    rendered = [chat.render(t["messages"], t["tools"]) for t in part]
    L = max(len(ids) for ids, _ in rendered)
    full = torch.zeros(len(part), L, dtype=torch.long)
    gen = torch.zeros(len(part), L, dtype=torch.bool)
    for b, (ids, mask) in enumerate(rendered):
        full[b, : len(ids)] = torch.tensor(ids)
        gen[b, : len(ids)] = torch.tensor(mask, dtype=torch.bool)
    logits, aux = model(full[:, :-1], dsa_mode="sparse")
    trunk_next = logits[..., :NOT_GENERATED].argmax(-1)  # [B, L-1]
    hidden = torch.cat([aux["hidden"], aux["hidden"][:, -1:]], dim=1)  # the last row is never read
    first, chained = model.mtp_sequence(hidden, full, chain=chain)
    return full, gen, trunk_next, first, chained


def render_vision_tasks(model, part):
    """(task, image) pairs rendered whole: [(ids, mask)] and the frozen
    tower's rows for their placeholders (forward's image_rows)."""
    rendered = [train_vision.render_vision(model, t) for t, _ in part]
    emb = model.embed_images(torch.from_numpy(np.stack([img for _, img in part])))
    n = emb.shape[1]
    rows = [(b, torch.arange(off, off + n), emb[b]) for b, (_, _, offs) in enumerate(rendered) for off in offs]
    return [(ids, mask) for ids, mask, _ in rendered], rows


def vision_drafts(model, part, chain, dsa_mode="sparse"):
    """text_drafts' tensors for (task, image) pairs, the tools block run once
    per batch as the shared prefix (as in training: the conversations are
    short next to it). full starts at the prefix's last token, so the first
    draft row reads the prefix's last hidden state, as in text_drafts."""
    P = chat.shared_prefix_len(gen_data.TOOLS)
    seqs, rows = render_vision_tasks(model, part)
    ids, mask, valid = (t[:, P:] for t in train_vision.pad(seqs))
    prefix = train_vision.model_prefix(P)
    logits, aux = model(ids[:, :-1], valid[:, :-1], dsa_mode=dsa_mode, prefix=prefix,
                        image_rows=[(b, pos - P, r) for b, pos, r in rows])
    first, chained = model.mtp_with_prefix(aux["prefix_hidden"], prefix, aux["hidden"], ids, chain=chain)
    B = ids.shape[0]
    last = M.rms_norm(aux["prefix_hidden"][:, -1:], model.W("norm.weight"), model.cfg.rms_norm_eps) @ model.W("head.weight").T
    trunk_next = torch.cat([last[..., :NOT_GENERATED].argmax(-1).expand(B, 1), logits[..., :NOT_GENERATED].argmax(-1)], 1)
    full = torch.cat([torch.full((B, 1), prefix[-1], dtype=torch.long), ids], 1)
    gen = torch.cat([torch.zeros(B, 1, dtype=torch.bool), mask & valid], 1)
    return full, gen, trunk_next, first, chained


def vision_tasks(split, seed, count):
    """gen_images.generate's tasks (the same draws) with their images."""
    g = gen_images.Generator(split, seed)
    return [g.task(kind) for kind in g.rng.choices(gen_images.KINDS, gen_images.WEIGHTS, k=count)]


def evaluate(model, tasks, batch=8, chain=True, drafts=text_drafts):
    """Teacher-forced figures on whole rendered conversations (no cuts), per
    kind and overall; also the trunk's own token accuracy and exact match (as
    tools/eval/teacher_forced.py counts them), to check the loaded trunk.
    drafts: text_drafts (gen_data tasks) or vision_drafts ((task, image))."""
    rows = {}
    with torch.no_grad():
        for i in range(0, len(tasks), batch):
            part = tasks[i : i + batch]
            full, gen, trunk_next, first, chained = drafts(model, part, chain)
            for b, t in enumerate(part):
                t = t[0] if isinstance(t, tuple) else t  # (task, image) for vision
                one = slice(b, b + 1)
                s = draft_stats(first[one], None if chained is None else chained[one], trunk_next[one], full[one],
                                gen[one])
                hit = (trunk_next[b] == full[b, 1:]) | ~gen[b, 1:]
                s.update(tasks=1, match=int(bool(hit.all())), tok=int(gen[b, 1:].sum()),
                         tok_ok=int((hit & gen[b, 1:]).sum()))
                for key in (t["kind"], "all"):
                    r = rows.setdefault(key, {})
                    for k, v in s.items():
                        r[k] = r.get(k, 0) + v
    return rows


def summarise(rows):
    """Percentages from evaluate's counts."""
    out = {}
    for kind, r in rows.items():
        o = {"tasks": r["tasks"], "trunk_exact_match": 100 * r["match"] / r["tasks"],
             "trunk_token_acc": 100 * r["tok_ok"] / r["tok"], "positions": r["n1"],
             "draft1_eq_truth": 100 * r["true1"] / r["n1"], "draft1_accept": 100 * r["accept1"] / r["n1"]}
        if "n2" in r:
            o.update(draft2_eq_truth=100 * r["true2"] / r["n2"],
                     draft2_accept_given_draft1=100 * r["both"] / max(1, r["after1"]),
                     both_accepted=100 * r["both"] / r["n2"])
            # Tokens per verification step with greedy drafting of k = 1, 2.
            a1 = r["accept1"] / r["n1"]
            o["tokens_per_step_k1"] = 1 + a1
            o["tokens_per_step_k2"] = 1 + a1 + r["both"] / r["n2"]
        out[kind] = {k: round(v, 2) if isinstance(v, float) else v for k, v in o.items()}
    return out


def print_summary(summary):
    cols = ["trunk_exact_match", "trunk_token_acc", "draft1_eq_truth", "draft1_accept", "draft2_eq_truth",
            "draft2_accept_given_draft1", "both_accepted", "tokens_per_step_k2"]
    cols = [c for c in cols if c in summary["all"]]
    print("kind     positions " + " ".join(f"{c:>26}" for c in cols))
    for kind, o in summary.items():
        print(f"{kind:8} {o['positions']:9} " + " ".join(f"{o[c]:26.2f}" for c in cols))


def cpu_model():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip() + f", {os.cpu_count()} CPUs"
    except OSError:
        pass
    return platform.processor()


def lr_at(a, step):
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    frac = (step - a.warmup) / max(1, a.steps - a.warmup)
    return a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(frac * math.pi)))


def text_batches(a):
    """train.py's windows: (x, valid, ids [B, T + 1] at positions Tp..Tp+T,
    generated mask of ids, image_rows); the shared prefix."""
    first_conv = train.window_examples(a.seed, 0, 1, 0.25)[0][0]
    n_prefix = chat.shared_prefix_len(gen_data.TOOLS)
    windows = -(-a.steps // train.WINDOW_BATCHES)
    jobs = ((a.seed, w, a.batch, False, False, n_prefix) for w in range(windows))
    stream = train.batch_stream(jobs, 1)

    def batches():
        try:
            while True:
                ids_a, mask_a, lens = next(stream)
                x, y, m, valid = train.tensors((ids_a, mask_a, lens), "cpu")
                T = x.shape[1]
                ids = torch.from_numpy(ids_a.astype("int64"))
                gen = torch.from_numpy(mask_a.copy()) & (torch.arange(T + 1)[None, :] < torch.from_numpy(lens)[:, None])
                yield x, valid, ids, gen, None
        finally:
            stream.close()

    return batches(), first_conv[:n_prefix]


def vision_batches(a, model):
    """train_vision.py's image batches (the train split drawn from --seed),
    whole conversations, the tools block as the shared prefix."""
    draws = gen_images.Generator("train", a.seed)
    P = chat.shared_prefix_len(gen_data.TOOLS)

    def batches():
        while True:
            with torch.no_grad():
                seqs, rows = render_vision_tasks(model, train_vision.draw(draws, a.batch))
            ids, mask, valid = (t[:, P:] for t in train_vision.pad(seqs))
            yield ids[:, :-1], valid[:, :-1], ids, mask & valid, [(b, pos - P, r) for b, pos, r in rows]

    return batches(), train_vision.model_prefix(P)


def train_mtp(a, model):
    freeze_trunk(model)
    params = mtp_parameters(model)
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), weight_decay=0.01)
    stream, prefix = vision_batches(a, model) if a.data == "vision" else text_batches(a)
    log = {"model": a.model, "data": a.data, "seed": a.seed, "steps": a.steps, "batch": a.batch, "lr": a.lr, "warmup": a.warmup,
           "chain_weight": a.chain_weight, "threads": a.threads, "cpu": cpu_model(),
           "torch": torch.__version__, "params": sum(p.numel() for p in params),
           "command": " ".join(["tools/train/train_mtp.py"] + sys.argv[1:]), "curve": []}
    t0 = time.time()
    chain = a.chain_weight > 0
    for step in range(a.steps):
        x, valid, ids, gen, image_rows = next(stream)  # ids [B, T + 1], positions Tp..Tp+T
        T = x.shape[1]
        with torch.no_grad():
            logits, aux = model(x, valid, dsa_mode="sparse", prefix=prefix, image_rows=image_rows)
        first, chained = model.mtp_with_prefix(aux["prefix_hidden"], prefix, aux["hidden"], ids, chain=chain)
        sel1 = gen[:, 1:]  # first row j drafts ids[:, j + 1]
        loss1 = F.cross_entropy(first[sel1], ids[:, 1:][sel1])
        loss = loss1
        if chain:
            sel2 = gen[:, 2:]  # chained row j drafts ids[:, j + 2]
            loss2 = F.cross_entropy(chained[sel2], ids[:, 2:][sel2])
            loss = loss + a.chain_weight * loss2
        lr = lr_at(a, step)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        with torch.no_grad():
            # The trunk's greedy prediction for ids[:, j + 1] is its argmax at x[:, j].
            trunk = logits[..., :NOT_GENERATED].argmax(-1)  # [B, T]
            d1 = first[..., :NOT_GENERATED].argmax(-1)
            where1 = gen[:, :T] & gen[:, 1:]
            ok1 = d1 == trunk
            s = {"n1": int(where1.sum()), "true1": int(((d1 == ids[:, 1:]) & where1).sum()),
                 "accept1": int((ok1 & where1).sum())}
            if chain:
                d2 = chained[..., :NOT_GENERATED].argmax(-1)  # [B, T-1]
                where2 = where1[:, : T - 1] & gen[:, 2:]
                after1 = where2 & ok1[:, : T - 1]
                s.update(after1=int(after1.sum()), both=int((after1 & (d2 == trunk[:, 1:])).sum()))
        entry = {"step": step, "lm": round(loss1.item(), 4), "acc": round(s["true1"] / max(1, s["n1"]), 4),
                 "accept": round(s["accept1"] / max(1, s["n1"]), 4)}
        if chain:
            entry.update(lm2=round(loss2.item(), 4), accept2_given_1=round(s["both"] / max(1, s["after1"]), 4))
        entry.update(lr=round(lr, 6), t=round(time.time() - t0, 1))
        log["curve"].append(entry)
        print(json.dumps(entry), flush=True)
    stream.close()
    log["train_seconds"] = round(time.time() - t0, 1)
    return log


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", choices=["text", "vision"], default="text",
                    help="text: gen_data's tool conversations; vision: gen_images' image tasks (a model with a tower)")
    ap.add_argument("--model", required=True, help="model directory whose trunk is used (and, with --eval-only, its MTP)")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--chain-weight", type=float, default=0.5, help="weight of the chained second draft's loss (0: off)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--eval-only", action="store_true", help="evaluate the MTP layer the model directory holds")
    ap.add_argument("--eval-seed", type=int, default=2)
    ap.add_argument("--eval-count", type=int, default=300)
    ap.add_argument("--limit", type=int, default=0, help="evaluate only the first N held-out tasks")
    ap.add_argument("--out", help="directory for mtp_weights.pt and mtp_log.json")
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    torch.use_deterministic_algorithms(True, warn_only=True)

    if a.eval_only:
        model, found = M.load_model_dir(a.model)
        if not found:
            sys.exit(f"{a.model}: the checkpoint has no MTP layer (mtp.* tensors and num_nextn_predict_layers)")
        log = {"model": a.model}
    else:
        if not a.out:
            sys.exit("--out is needed to train")
        model, _ = M.load_model_dir(a.model, mtp_layers=1)
        init_from_layer0(model)
        log = train_mtp(a, model)
        os.makedirs(a.out, exist_ok=True)
        mtp = {k: v for k, v in model.state_dict_fp32().items() if k.startswith("mtp.")}
        torch.save(mtp, os.path.join(a.out, "mtp_weights.pt"))
    if a.data == "vision":
        tasks, drafts, batch = vision_tasks("eval", a.eval_seed, a.eval_count), vision_drafts, 16
    else:
        tasks, drafts, batch = gen_data.generate("eval", a.eval_seed, a.eval_count), text_drafts, 8
    if a.limit:
        tasks = tasks[: a.limit]
    t0 = time.time()
    summary = summarise(evaluate(model, tasks, batch, chain=True, drafts=drafts))
    log["eval"] = {"data": a.data, "split": "eval", "seed": a.eval_seed, "tasks": len(tasks), "seconds": round(time.time() - t0, 1),
                   "results": summary}
    print_summary(summary)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "mtp_log.json"), "w") as f:
            json.dump(log, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
