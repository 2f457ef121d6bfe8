"""Train the tiny agent model (CPU or CUDA, deterministic from --seed on a
given device kind).

  /usr/bin/python3 tools/train/train.py --config tools/train/config.json \
      --seed 1 --steps 150 --batch 8 --out build-x/tiny-agent-train [--device cuda]

Data comes from gen_data.py (train split; each window of 32 batches from its
own seed, made ahead by --data-workers processes), rendered by chat.py; the
loss is next-token cross-entropy on the tokens the model generates (reasoning,
answers, tool call name and arguments, <|end|>), plus the DSA indexer's KL.
A quarter of the assistant turns have their reasoning cut short at a random
length, as a thinking budget cuts it, so the model learns to act after the
engine closes the span. The first --dense-steps steps attend densely in the
dsa layers (indexer warm-up), then top-k. The tools block every sequence
starts with is computed once per batch (model.forward's prefix); batches
hold conversations of similar length. The learning rate is cosine over
--steps, or warm-up-stable-decay with the decay timed to --time-budget (the
log's decay_start replays it with --decay-start). Writes weights.pt (fp32)
and train_log.json (loss curve, time, expert load per MoE layer).
"""

import argparse
import json
import math
import os
import random
import string
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chat  # noqa: E402
import gen_data  # noqa: E402
import model as M  # noqa: E402


WINDOW_BATCHES = 32  # batches per data window (sorted by length inside it)


def window_examples(seed, window, count, cut_fraction, copy_ids=False):
    """The conversations of one data window: its own generator seed, so that
    windows can be made in any order, by any number of workers, and still be
    the same."""
    r = random.Random(f"cut:{seed}:{window}")
    out = []
    for t in gen_data.generate("train", seed * 100_003 + window, count):
        cuts = {}
        for i, m in enumerate(t["messages"]):
            if m["role"] == "assistant" and r.random() < cut_fraction:
                n = len(m["reasoning_content"])
                cuts[i] = r.randint(0, max(0, n - 1))
        out.append(chat.render(t["messages"], t["tools"], cuts, copy_ids))
    return out


def copy_drills(seed, window, count):
    """Synthetic copying lessons, a curriculum before the conversations: the
    user turn is a random string (letters, digits, a few marks; 3 to 20
    bytes), the assistant repeats it. A model this small sits on a plateau
    for a long time before it can copy a value it has not seen; on these short
    sequences it gets past it in a few hundred steps (loss ~4 -> ~0), and the
    conversations then only have to learn where to copy from."""
    r = random.Random(f"copy:{seed}:{window}")
    chars = string.ascii_letters + string.digits + ".-+*"
    out = []
    for _ in range(count):
        s = chat.text_ids("".join(r.choice(chars) for _ in range(r.randint(3, 20))))
        ids = [chat.BOS, chat.USER] + s + [chat.END, chat.ASSISTANT, chat.THINK]
        out.append((ids + s + [chat.END], [0] * len(ids) + [1] * (len(s) + 1)))
    return out


def pack(items, n_prefix=0):
    """One batch as numpy arrays (cheap to hand between processes): ids
    [B, T+1] and loss mask [B, T+1] after the first n_prefix ids (the shared
    tools block, computed once per batch), and each row's length."""
    items = [(ids[n_prefix:], mask[n_prefix:]) for ids, mask in items]
    width = max(len(ids) for ids, _ in items)
    ids_a = np.zeros((len(items), width), dtype=np.int16)
    mask_a = np.zeros((len(items), width), dtype=np.bool_)
    lens = np.zeros(len(items), dtype=np.int64)
    for b, (ids, mask) in enumerate(items):
        ids_a[b, : len(ids)] = ids
        mask_a[b, : len(ids)] = mask
        lens[b] = len(ids)
    return ids_a, mask_a, lens


def tensors(packed, device):
    """Inputs, targets, loss mask and validity of a packed batch."""
    ids_a, mask_a, lens = packed
    ids = torch.from_numpy(ids_a.astype(np.int64))
    x, y = ids[:, :-1], ids[:, 1:]
    m = torch.from_numpy(mask_a[:, 1:].copy())
    valid = torch.arange(x.shape[1])[None, :] < torch.from_numpy(lens - 1)[:, None]
    return tuple(t.to(device, non_blocking=True) for t in (x, y, m & valid, valid))


def make_window(job):
    """Batches of similar lengths from one window (less padding): its
    conversations sorted by length, cut into batches, the batches shuffled."""
    seed, window, batch_size, drills, copy_ids, n_prefix = job
    n = batch_size * WINDOW_BATCHES
    data = copy_drills(seed, window, n) if drills else window_examples(seed, window, n, 0.25, copy_ids)
    part = sorted(data, key=lambda e: len(e[0]))
    batches = [pack(part[i : i + batch_size], n_prefix) for i in range(0, n, batch_size)]
    random.Random(f"batches:{seed}:{window}").shuffle(batches)
    return batches


def batch_stream(jobs, workers):
    """Yields the batches of every window in order; with workers > 1 the
    windows are made ahead in other processes (a bounded queue)."""
    if workers <= 1:
        for job in jobs:
            yield from make_window(job)
        return
    import multiprocessing as mp
    with mp.get_context("fork").Pool(workers) as pool:
        pending = []
        jobs = iter(jobs)
        for job in jobs:
            pending.append(pool.apply_async(make_window, (job,)))
            if len(pending) >= 2 * workers:
                break
        while pending:
            yield from pending.pop(0).get()
            nxt = next(jobs, None)
            if nxt is not None:
                pending.append(pool.apply_async(make_window, (nxt,)))


class Schedule:
    """Learning rate: linear warm-up, then either cosine to 10% over --steps,
    or (with --time-budget or --decay-start) warm-up-stable-decay: the peak
    rate until the decay starts, then cosine to 10% over --decay-steps. With
    --time-budget the decay starts at the first step from which the remaining
    decay would still end inside the budget (timed on the recent steps); the
    log records that step, and --decay-start N replays the same run exactly."""

    def __init__(self, a):
        self.a = a
        self.wsd = a.time_budget > 0 or a.decay_start > 0
        self.warm = a.warmup if a.warmup else max(1, a.steps // 20)
        self.decay_start = a.decay_start or None
        self.times = []

    @staticmethod
    def cosine(peak, frac):
        return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(frac * math.pi)))

    def observe(self, step, elapsed, step_seconds):
        """After a step: may fix the decay start from the time budget."""
        self.times = (self.times + [step_seconds])[-50:]
        if self.wsd and self.decay_start is None and step + 1 >= self.warm:
            mean = sum(self.times) / len(self.times)
            out_of_time = self.a.time_budget > 0 and elapsed + mean * (self.a.decay_steps + 1) >= self.a.time_budget
            if out_of_time or step + 1 >= self.a.steps - self.a.decay_steps:
                self.decay_start = step + 1

    def last_step(self):
        if not self.wsd:
            return self.a.steps
        if self.decay_start is None:
            return self.a.steps
        return min(self.a.steps, self.decay_start + self.a.decay_steps)

    def lr(self, step):
        a = self.a
        if step < self.warm:
            return a.lr * (step + 1) / self.warm
        if not self.wsd:
            return self.cosine(a.lr, (step - self.warm) / max(1, a.steps - self.warm))
        if self.decay_start is None or step < self.decay_start:
            return a.lr
        return self.cosine(a.lr, (step - self.decay_start) / max(1, a.decay_steps))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=150, help="steps (the most, with --time-budget)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=0, help="warm-up steps (default: 5%% of --steps)")
    ap.add_argument("--time-budget", type=float, default=0,
                    help="seconds: warm-up-stable-decay, the decay timed to end inside this budget")
    ap.add_argument("--decay-start", type=int, default=0, help="warm-up-stable-decay with the decay from this step")
    ap.add_argument("--decay-steps", type=int, default=300)
    ap.add_argument("--dense-steps", type=int, default=30)
    ap.add_argument("--bias-rate", type=float, default=0.01)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (fp32 either way; deterministic per device)")
    ap.add_argument("--data-workers", type=int, default=1, help="processes making data windows ahead")
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
    # Same seed, same device kind: the same weights. Integer bincounts have no
    # "deterministic" CUDA kernel but are exact anyway, hence warn_only.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    if a.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32, as the reference
        torch.backends.cudnn.allow_tf32 = False
    with open(a.config) as f:
        raw = json.load(f)
    cfg = M.Config(raw)
    model = M.TrainModel(cfg, a.seed)
    if a.init:
        model.load_fp32(torch.load(a.init, map_location="cpu"))
    model.to_device(a.device)
    n_params = sum(p.numel() for p in model.parameters())
    if a.copy_drills:
        n_prefix, prefix = 0, None
    else:
        # Every sequence starts with the same tools block: computed once per batch.
        first = window_examples(a.seed, 0, 1, 0.25, a.copy_ids)[0][0]
        n_prefix = chat.shared_prefix_len(gen_data.TOOLS)
        prefix = first[:n_prefix]
    windows = -(-a.steps // WINDOW_BATCHES)
    jobs = ((a.seed, w, a.batch, a.copy_drills, a.copy_ids, n_prefix) for w in range(windows))
    stream = batch_stream(jobs, a.data_workers)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.01)
    sched = Schedule(a)

    os.makedirs(a.out, exist_ok=True)
    log = {"config": raw, "seed": a.seed, "steps": a.steps, "batch": a.batch, "params": n_params,
           "device": a.device, "curve": []}
    load_total = {}
    t0 = time.time()
    step = 0
    while step < sched.last_step() and not (a.stop_after and step >= a.stop_after):
        ts = time.time()  # a step's time includes waiting for its data
        x, y, m, valid = tensors(next(stream), a.device)
        mode = "dense" if step < a.dense_steps else "sparse"
        logits, aux = model(x, valid, dsa_mode=mode, prefix=prefix)
        lm = F.cross_entropy(logits[m], y[m])
        # Indexer KL per query token: the shared prefix's queries count once.
        kl = torch.cat([k[valid] for k in aux["indexer_kl"]] + [k.reshape(-1) for k in aux.get("prefix_indexer_kl", [])]).mean()
        loss = lm + kl
        for g in opt.param_groups:
            g["lr"] = sched.lr(step)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        model.update_bias(aux["load"], a.bias_rate)
        for k, v in aux["load"].items():
            load_total[k] = load_total.get(k, 0) + v
        acc = (logits[m].argmax(-1) == y[m]).float().mean().item()
        entry = {"step": step, "lm": round(lm.item(), 4), "kl": round(kl.item(), 4), "acc": round(acc, 4),
                 "mode": mode, "lr": round(sched.lr(step), 6), "t": round(time.time() - t0, 1)}
        log["curve"].append(entry)
        print(json.dumps(entry), flush=True)
        sched.observe(step, time.time() - t0, time.time() - ts)
        step += 1
        if a.save_every and step % a.save_every == 0:
            torch.save(model.state_dict_fp32(), os.path.join(a.out, f"weights-{step}.pt"))
    stream.close()
    log["steps_run"] = step
    log["decay_start"] = sched.decay_start
    log["train_seconds"] = round(time.time() - t0, 1)
    # Expert load over the whole run: each expert's share of the routed slots.
    log["expert_load"] = {k.replace(".ffn.gate.bias", ""): [round(float(c) / float(v.sum()), 4) for c in v]
                          for k, v in load_total.items()}
    torch.save(model.state_dict_fp32(), os.path.join(a.out, "weights.pt"))
    with open(os.path.join(a.out, "train_log.json"), "w") as f:
        json.dump(log, f, indent=1)
    replay = f" (replay: --decay-start {sched.decay_start})" if sched.wsd else ""
    print(f"train: {n_params} parameters, {step} steps in {log['train_seconds']} s{replay}", flush=True)


if __name__ == "__main__":
    main()
