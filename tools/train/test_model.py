"""The training model against the fp32 reference on the same weights.

  /usr/bin/python3 -m unittest discover -s tools/train

Tolerance as docs/model-format.md section 10 (CPU paths against the fp32
reference): max|logit - ref| <= 1e-3 * max|ref| at every position.
"""

import json
import os
import sys
import unittest

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import chat  # noqa: E402
import gen_data  # noqa: E402
import model as M  # noqa: E402


def small_config(index_topk):
    with open(os.path.join(HERE, "config.json")) as f:
        raw = json.load(f)
    raw["dsa"]["index_topk"] = index_topk
    return raw


class TrainModelMatchesReference(unittest.TestCase):
    def compare(self, index_topk, dsa_mode, perturb_bias):
        torch.manual_seed(0)
        cfg = M.Config(small_config(index_topk))
        tm = M.TrainModel(cfg, seed=3)
        tm.exact_ties = True
        weights = tm.state_dict_fp32()
        # Trained-looking weights: norms and biases away from their init values.
        for k in weights:
            if k.endswith(("norm.weight", "k_norm.bias")):
                weights[k] = weights[k] + 0.2 * torch.randn(weights[k].shape)
            if k.endswith("gate.bias") and perturb_bias:
                weights[k] = 0.1 * torch.randn(weights[k].shape)
        tm.load_fp32(weights)
        task = gen_data.generate("train", 5, 4)[3]
        ids = chat.render(task["messages"], task["tools"])[0][:300]
        reference = M.ref.Model(cfg, weights)
        with torch.no_grad():
            want, info = reference.forward(ids)
            got, _ = tm(torch.tensor([ids]), dsa_mode=dsa_mode)
        bound = 1e-3 * want[:, :268].abs().max().item()
        err = (got[0] - want).abs().max().item()
        self.assertLessEqual(err, bound, f"max |logit - ref| {err} > {bound}")
        return info

    def test_dense_context_within_topk(self):
        # Context shorter than index_topk: the dsa layers are dense MLA.
        self.compare(index_topk=2048, dsa_mode="sparse", perturb_bias=True)

    def test_sparse_selection_matches(self):
        # 300 tokens against top-32: the indexer really drops keys.
        info = self.compare(index_topk=32, dsa_mode="sparse", perturb_bias=True)
        self.assertTrue(any(len(s) == 32 for s in info[2]["selected"][100:]))

    def test_dense_warmup_differs_from_sparse(self):
        # The warm-up mode attends to every key; with top-32 that is another model.
        with self.assertRaises(AssertionError):
            self.compare(index_topk=32, dsa_mode="dense", perturb_bias=False)


class SharedPrefixMatchesWholeSequences(unittest.TestCase):
    """Training computes the tools block every sequence starts with once per
    batch and lets the rest of each sequence attend to it (MLA/DSA keys,
    DeltaNet state, conv tail): the logits must be those of whole sequences."""

    def check(self, dsa_mode, index_topk):
        torch.manual_seed(0)
        cfg = M.Config(small_config(index_topk))
        tm = M.TrainModel(cfg, seed=4)
        tm.exact_ties = True  # equal indexer scores (ReLU zeros) are common at init
        tasks = gen_data.generate("train", 6, 3)
        rows = [chat.render(t["messages"], t["tools"])[0] for t in tasks]
        n = chat.shared_prefix_len(tasks[0]["tools"])
        self.assertTrue(all(r[:n] == rows[0][:n] for r in rows))
        T = max(len(r) for r in rows)
        with torch.no_grad():
            whole, _ = tm(torch.tensor([r + [0] * (T - len(r)) for r in rows]), dsa_mode=dsa_mode)
            shared, aux = tm(torch.tensor([r[n:] + [0] * (T - len(r)) for r in rows]), dsa_mode=dsa_mode,
                             prefix=rows[0][:n])
        for b, r in enumerate(rows):
            err = (whole[b, n : len(r)] - shared[b, : len(r) - n]).abs().max().item()
            self.assertLessEqual(err, 1e-4 * whole.abs().max().item(), f"row {b}: {err}")
        self.assertEqual(len(aux["prefix_indexer_kl"]), 2)

    def test_dense(self):
        self.check("dense", 128)

    def test_sparse(self):
        # top-64 of 350-800 keys: the selection reaches into the prefix.
        self.check("sparse", 64)


if __name__ == "__main__":
    unittest.main()
