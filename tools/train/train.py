"""Train the tiny agent model (CPU, deterministic from --seed).

  nice /usr/bin/python3 tools/train/train.py --config tools/train/config.json \
      --seed 1 --steps 150 --batch 8 --out build-x/tiny-agent-train

Data comes from gen_data.py (train split, same seed), rendered by chat.py; the
loss is next-token cross-entropy on the tokens the model generates (reasoning,
answers, tool call name and arguments, <|end|>), plus the DSA indexer's KL.
A quarter of the assistant turns have their reasoning cut short at a random
length, as a thinking budget cuts it, so the model learns to act after the
engine closes the span. The first --dense-steps steps attend densely in the
dsa layers (indexer warm-up), then top-k. The tools block every sequence
starts with is computed once per batch (model.forward's prefix); batches
hold conversations of similar length. Writes weights.pt (fp32) and
train_log.json (loss curve, time, expert load per MoE layer).
"""

import argparse
import json
import os
import random
import string
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chat  # noqa: E402
import gen_data  # noqa: E402
import model as M  # noqa: E402


def examples(seed, count, cut_fraction, copy_ids=False):
    r = random.Random(f"cut:{seed}")
    out = []
    for t in gen_data.generate("train", seed, count):
        cuts = {}
        for i, m in enumerate(t["messages"]):
            if m["role"] == "assistant" and r.random() < cut_fraction:
                n = len(m["reasoning_content"])
                cuts[i] = r.randint(0, max(0, n - 1))
        out.append(chat.render(t["messages"], t["tools"], cuts, copy_ids))
    return out


def copy_drills(seed, count):
    """Synthetic copying lessons, a curriculum before the conversations: the
    user turn is a random string (letters, digits, a few marks; 3 to 20
    bytes), the assistant repeats it. A model this small sits on a plateau
    for a long time before it can copy a value it has not seen; on these short
    sequences it gets past it in a few hundred steps (loss ~4 -> ~0), and the
    conversations then only have to learn where to copy from."""
    r = random.Random(f"copy:{seed}")
    chars = string.ascii_letters + string.digits + ".-+*"
    out = []
    for _ in range(count):
        s = chat.text_ids("".join(r.choice(chars) for _ in range(r.randint(3, 20))))
        ids = [chat.BOS, chat.USER] + s + [chat.END, chat.ASSISTANT, chat.THINK]
        out.append((ids + s + [chat.END], [0] * len(ids) + [1] * (len(s) + 1)))
    return out


def batch(items, n_prefix=0):
    """Inputs, targets, loss mask and validity of each row after its first
    n_prefix ids (the shared tools block, computed once per batch)."""
    items = [(ids[n_prefix:], mask[n_prefix:]) for ids, mask in items]
    T = max(len(ids) for ids, _ in items) - 1
    x = torch.zeros(len(items), T, dtype=torch.long)
    y = torch.zeros(len(items), T, dtype=torch.long)
    m = torch.zeros(len(items), T, dtype=torch.bool)
    valid = torch.zeros(len(items), T, dtype=torch.bool)
    for b, (ids, mask) in enumerate(items):
        n = len(ids) - 1
        x[b, :n] = torch.tensor(ids[:-1])
        y[b, :n] = torch.tensor(ids[1:])
        m[b, :n] = torch.tensor(mask[1:], dtype=torch.bool)
        valid[b, :n] = True
    return x, y, m, valid


def bucketed(data, size, rng, window=32):
    """Batches of similar lengths (less padding): each window of `window`
    batches' worth of conversations is sorted by length and cut into batches;
    the batches are then shuffled."""
    out = []
    for w in range(0, len(data), size * window):
        part = sorted(data[w : w + size * window], key=lambda e: len(e[0]))
        out.extend(part[i : i + size] for i in range(0, len(part), size))
    rng.shuffle(out)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--dense-steps", type=int, default=30)
    ap.add_argument("--bias-rate", type=float, default=0.01)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--init", help="weights.pt to continue from (a second stage with its own --seed data)")
    ap.add_argument("--save-every", type=int, default=0, help="also write weights.pt every N steps")
    ap.add_argument("--stop-after", type=int, default=0,
                    help="stop after this many steps, keeping the --steps schedule (a shorter run of the same command)")
    ap.add_argument("--copy-drills", action="store_true",
                    help="train on copy_drills instead of conversations (a first stage)")
    ap.add_argument("--copy-ids", action="store_true",
                    help="also train on the call id each tool message repeats (chat.render's copy_ids)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    with open(a.config) as f:
        raw = json.load(f)
    cfg = M.Config(raw)
    model = M.TrainModel(cfg, a.seed)
    if a.init:
        model.load_fp32(torch.load(a.init))
    n_params = sum(p.numel() for p in model.parameters())
    if a.copy_drills:
        data, n_prefix, prefix = copy_drills(a.seed, a.steps * a.batch), 0, None
    else:
        data = examples(a.seed, a.steps * a.batch, 0.25, a.copy_ids)
        # Every sequence starts with the same tools block: computed once per batch.
        n_prefix = chat.shared_prefix_len(gen_data.TOOLS)
        prefix = data[0][0][:n_prefix]
        assert all(ids[:n_prefix] == prefix for ids, _ in data)
    batches = bucketed(data, a.batch, random.Random(f"batches:{a.seed}"))
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.01)
    warm = max(1, a.steps // 20)

    def lr_at(step):
        if step < warm:
            return a.lr * (step + 1) / warm
        frac = (step - warm) / max(1, a.steps - warm)
        return a.lr * (0.1 + 0.9 * 0.5 * (1 + torch.cos(torch.tensor(frac * 3.14159265)).item()))

    os.makedirs(a.out, exist_ok=True)
    log = {"config": raw, "seed": a.seed, "steps": a.steps, "batch": a.batch, "params": n_params, "curve": []}
    load_total = {}
    t0 = time.time()
    last = min(a.steps, a.stop_after) if a.stop_after else a.steps
    for step in range(last):
        x, y, m, valid = batch(batches[step], n_prefix)
        mode = "dense" if step < a.dense_steps else "sparse"
        logits, aux = model(x, valid, dsa_mode=mode, prefix=prefix)
        lm = F.cross_entropy(logits[m], y[m])
        # Indexer KL per query token: the shared prefix's queries count once.
        kl = torch.cat([k[valid] for k in aux["indexer_kl"]] + [k.reshape(-1) for k in aux.get("prefix_indexer_kl", [])]).mean()
        loss = lm + kl
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        model.update_bias(aux["load"], a.bias_rate)
        for k, v in aux["load"].items():
            load_total[k] = load_total.get(k, 0) + v
        acc = (logits[m].argmax(-1) == y[m]).float().mean().item()
        entry = {"step": step, "lm": round(lm.item(), 4), "kl": round(kl.item(), 4), "acc": round(acc, 4),
                 "mode": mode, "t": round(time.time() - t0, 1)}
        log["curve"].append(entry)
        print(json.dumps(entry), flush=True)
        if a.save_every and (step + 1) % a.save_every == 0:
            torch.save(model.state_dict_fp32(), os.path.join(a.out, f"weights-{step + 1}.pt"))
    log["steps_run"] = last
    log["train_seconds"] = round(time.time() - t0, 1)
    # Expert load over the whole run: each expert's share of the routed slots.
    log["expert_load"] = {k.replace(".ffn.gate.bias", ""): [round(float(c) / float(v.sum()), 4) for c in v]
                          for k, v in load_total.items()}
    torch.save(model.state_dict_fp32(), os.path.join(a.out, "weights.pt"))
    with open(os.path.join(a.out, "train_log.json"), "w") as f:
        json.dump(log, f, indent=1)
    print(f"train: {n_params} parameters, {last} steps in {log['train_seconds']} s", flush=True)


if __name__ == "__main__":
    main()
