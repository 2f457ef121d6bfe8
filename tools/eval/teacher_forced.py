"""BF16 against MXFP4 experts on the held-out set, teacher-forced, in PyTorch.

  /usr/bin/python3 tools/eval/teacher_forced.py --data eval.jsonl --model models/tiny-agent/mxfp4 \
      [--weights RUN/weights.pt]

For each task, one forward over the whole correct conversation; a task
"matches" when the model's argmax equals the next token at every position
the model generates (reasoning, answers, tool names and arguments, <|end|>).
A matching task is one greedy decoding reproduces exactly (given the same
tool results and no thinking-budget cut), so this is a lower bound of the
high tier's task accuracy, computed without the daemon. Variants:
  mxfp4: the model directory as shipped (MXFP4 experts dequantised exactly, BF16 elsewhere);
  bf16:  --weights with every matrix, experts included, rounded to BF16.
Prints exact-match and token accuracy per kind for each variant, and each
MoE layer's expert load on these tasks (share of routed slots per expert).
"""

import argparse
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "train"))
import chat  # noqa: E402
import model as M  # noqa: E402


def bf16_weights(path, cfg):
    w = torch.load(path)
    out = {}
    for k, v in w.items():
        f32_only = k.endswith(("norm.weight", "k_norm.bias", ".A_log", ".dt_bias", "ffn.gate.bias"))
        out[k] = v if f32_only else v.to(torch.bfloat16).to(torch.float32)
    return out


def evaluate(cfg, weights, tasks, batch=8):
    tm = M.TrainModel(cfg, 0)
    tm.load_fp32(weights)
    rows = {}
    load = {}
    with torch.no_grad():
        for i in range(0, len(tasks), batch):
            part = tasks[i : i + batch]
            rendered = [chat.render(t["messages"], t["tools"]) for t in part]
            T = max(len(ids) for ids, _ in rendered) - 1
            x = torch.zeros(len(part), T, dtype=torch.long)
            y = torch.zeros_like(x)
            m = torch.zeros(len(part), T, dtype=torch.bool)
            for b, (ids, mask) in enumerate(rendered):
                n = len(ids) - 1
                x[b, :n], y[b, :n] = torch.tensor(ids[:-1]), torch.tensor(ids[1:])
                m[b, :n] = torch.tensor(mask[1:], dtype=torch.bool)
            valid = torch.zeros_like(m)
            for b, (ids, _) in enumerate(rendered):
                valid[b, : len(ids) - 1] = True
            logits, aux = tm(x, valid, dsa_mode="sparse")
            for k, v in aux["load"].items():
                load[k] = load.get(k, 0) + v
            logits[..., chat.TOOLS + 1 :] = float("-inf")  # padding ids are never generated
            hit = (logits.argmax(-1) == y) | ~m
            for b, t in enumerate(part):
                r = rows.setdefault(t["kind"], {"n": 0, "match": 0, "tok": 0, "tok_ok": 0})
                r["n"] += 1
                r["match"] += int(bool(hit[b].all()))
                r["tok"] += int(m[b].sum())
                r["tok_ok"] += int((hit[b] & m[b]).sum())
    return rows, {k.replace(".ffn.gate.bias", ""): [round(float(c) / float(v.sum()), 4) for c in v] for k, v in load.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--model", required=True, help="shipped MXFP4 model directory")
    ap.add_argument("--weights", help="training weights.pt for the BF16 variant")
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.set_num_threads(1)
    with open(a.data) as f:
        tasks = [json.loads(line) for line in f]
    if a.limit:
        tasks = tasks[: a.limit]
    cfg = M.Config.load(a.model)
    variants = {"mxfp4": M.ref.load_weights(a.model, cfg)}
    if a.weights:
        variants["bf16"] = bf16_weights(a.weights, cfg)
    results, loads = {}, {}
    for name, w in variants.items():
        results[name], loads[name] = evaluate(cfg, w, tasks)
    kinds = sorted({t["kind"] for t in tasks})
    print(f"teacher-forced exact match (%) on {len(tasks)} tasks; token accuracy (%) after /")
    print("variant " + "".join(f"{k:>16}" for k in kinds) + f"{'all':>16}")
    for name, rows in results.items():
        cells = []
        for k in kinds + ["all"]:
            rs = list(rows.values()) if k == "all" else [rows[k]]
            n, match = sum(r["n"] for r in rs), sum(r["match"] for r in rs)
            tok, ok = sum(r["tok"] for r in rs), sum(r["tok_ok"] for r in rs)
            cells.append(f"{100 * match / n:7.1f} / {100 * ok / tok:5.1f}")
        print(f"{name:8}" + "".join(f"{c:>16}" for c in cells))
    E = cfg.n_experts
    print(f"expert load ({E} experts, top-{cfg.experts_per_token}; uniform = {100 / E:.2f}% each), mxfp4:")
    for layer, shares in loads["mxfp4"].items():
        print(f"  {layer}: min {100 * min(shares):.2f}%  max {100 * max(shares):.2f}%  max/mean {max(shares) * E:.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"results": results, "expert_load": loads}, f, indent=1)


if __name__ == "__main__":
    main()
