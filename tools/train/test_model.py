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


def mtp_config():
    raw = small_config(2048)
    raw["num_nextn_predict_layers"] = 1
    return raw


def reference_mtp_decode(cfg, W, hidden, ids):
    """The MTP layer as inference runs it, written from its definition with the
    reference's functions, one token at a time (absorbed MLA over a latent
    cache): position i reads h_i and t_{i+1} and drafts t_{i+2}; then, from a
    copy of the cache, the chained step at i + 1 reads the block's output at
    i and t_{i+2}. Returns (first-draft logits [L-2, V], chained [L-3, V])."""
    eps = cfg.rms_norm_eps
    norm = M.ref.rms_norm
    p = "mtp.0."

    def block(h, tok, pos, cache):
        x = torch.cat([norm(W["embed.weight"][tok][None], W[p + "enorm.weight"], eps),
                       norm(h[None], W[p + "hnorm.weight"], eps)], dim=-1) @ W[p + "eh_proj.weight"].T
        a = norm(x, W[p + "attn_norm.weight"], eps)
        attn, _ = M.ref.mla_attention(W, p + "attn.", cfg, a, torch.tensor([pos]), cache, absorbed=True)
        x = x + attn
        f = norm(x, W[p + "ffn_norm.weight"], eps)
        x = x + M.ref.swiglu(f, W[p + "ffn.w1.weight"], W[p + "ffn.w3.weight"], W[p + "ffn.w2.weight"])
        return (norm(x, W[p + "norm.weight"], eps) @ W["head.weight"].T)[0], x[0]

    L = len(ids)
    cache, first, chained = {}, [], []
    for i in range(L - 2):
        logits, out = block(hidden[i], ids[i + 1], i, cache)
        first.append(logits)
        if i < L - 3:
            side = {k: v.clone() for k, v in cache.items()}
            chained.append(block(out, ids[i + 2], i + 1, side)[0])
    return torch.stack(first), torch.stack(chained)


class MTPLayer(unittest.TestCase):
    """The multi-token-prediction layer (DeepSeek-V3 form, one mla block)."""

    def model(self, seed=3):
        torch.manual_seed(0)
        tm = M.TrainModel(M.Config(mtp_config()), seed=seed)
        w = tm.state_dict_fp32()
        for k in w:  # trained-looking norms
            if k.endswith("norm.weight"):
                w[k] = w[k] + 0.2 * torch.randn(w[k].shape)
        tm.load_fp32(w)
        return tm

    def ids(self, n=120):
        task = gen_data.generate("train", 5, 4)[1]
        return chat.render(task["messages"], task["tools"])[0][:n]

    def test_tensor_names_and_shapes(self):
        cfg = M.Config(mtp_config())
        t = M.mtp_tensors(cfg)
        D = cfg.hidden_size
        self.assertEqual(t["mtp.0.eh_proj.weight"], (D, 2 * D))
        for name in ("enorm", "hnorm", "norm", "attn_norm", "ffn_norm"):
            self.assertEqual(t[f"mtp.0.{name}.weight"], (D,))
        layer0 = {k[len("layers.0."):]: v for k, v in M.ref.expected_tensors(cfg).items() if k.startswith("layers.0.")}
        for name, shape in layer0.items():  # layer 0 is mla with the dense FFN
            self.assertEqual(t["mtp.0." + name], shape, name)
        self.assertEqual(len(t), len(layer0) + 4)
        self.assertEqual(M.mtp_tensors(M.Config(small_config(2048))), {})  # no field, no layer

    def test_trunk_draw_is_the_same_with_the_mtp_layer(self):
        with_mtp = M.TrainModel(M.Config(mtp_config()), seed=9).state_dict_fp32()
        without = M.TrainModel(M.Config(small_config(2048)), seed=9).state_dict_fp32()
        self.assertEqual(set(with_mtp) - set(without), set(M.mtp_tensors(M.Config(mtp_config()))))
        for k, v in without.items():
            self.assertTrue(torch.equal(v, with_mtp[k]), k)

    def test_matches_token_by_token_reference_with_chained_step(self):
        tm = self.model()
        ids = self.ids()
        with torch.no_grad():
            _, aux = tm(torch.tensor([ids]), dsa_mode="sparse")
            first, chained = tm.mtp_sequence(aux["hidden"], torch.tensor([ids]), chain=True)
        want1, want2 = reference_mtp_decode(tm.cfg, tm.state_dict_fp32(), aux["hidden"][0], ids)
        self.assertEqual(tuple(first.shape), (1, len(ids) - 2, tm.cfg.vocab_size))
        self.assertEqual(tuple(chained.shape), (1, len(ids) - 3, tm.cfg.vocab_size))
        for got, want in ((first[0], want1), (chained[0], want2)):
            err = (got - want).abs().max().item()
            self.assertLessEqual(err, 1e-4 * want.abs().max().item())

    def test_chained_step_fed_the_trunk_equals_the_first_step(self):
        # The chained row j, fed what the first step reads at j + 1, is the first step at j + 1.
        tm = self.model()
        ids = torch.tensor([self.ids()])
        L = ids.shape[1]
        with torch.no_grad():
            _, aux = tm(ids, dsa_mode="sparse")
            keys = {}
            first, _ = tm.mtp_step(aux["hidden"][:, : L - 2], ids[:, 1 : L - 1], keep=keys)
            chained, _ = tm.mtp_chained_step(aux["hidden"][:, 1 : L - 2], ids[:, 2 : L - 1], keys)
        self.assertLessEqual((chained - first[:, 1:]).abs().max().item(), 1e-4 * first.abs().max().item())

    def test_shared_prefix_matches_whole_sequences(self):
        # Training computes the tools block's MTP keys once per batch.
        tm = self.model()
        tasks = gen_data.generate("train", 6, 3)
        rows = [chat.render(t["messages"], t["tools"])[0] for t in tasks]
        n = chat.shared_prefix_len(tasks[0]["tools"])
        L = max(len(r) for r in rows)
        whole = torch.tensor([r + [0] * (L - len(r)) for r in rows])
        with torch.no_grad():
            _, aux = tm(whole, dsa_mode="sparse")
            want1, want2 = tm.mtp_sequence(aux["hidden"], whole, chain=True)
            _, paux = tm(whole[:, n:-1], dsa_mode="sparse", prefix=rows[0][:n])
            got1, got2 = tm.mtp_with_prefix(paux["prefix_hidden"], rows[0][:n], paux["hidden"], whole[:, n:],
                                            chain=True)
        # want1 row i drafts whole[:, i + 2]; got1 row j drafts whole[:, n + j + 1].
        for b, r in enumerate(rows):
            m = len(r)
            for got, want, skip in ((got1, want1, 1), (got2, want2, 2)):
                err = (got[b, : m - n - skip] - want[b, n - 1 : m - 1 - skip]).abs().max().item()
                self.assertLessEqual(err, 1e-4 * want.abs().max().item(), f"row {b}")

    def test_embedding_half_comes_first(self):
        tm = self.model()
        D = tm.cfg.hidden_size
        ids = torch.tensor([self.ids(60)])
        h = torch.randn(1, 60, D)
        with torch.no_grad():
            tm.W("mtp.0.eh_proj.weight")[:, D:] = 0  # the hidden half off: only the tokens count
            base, _ = tm.mtp_sequence(h, ids)
            other_h, _ = tm.mtp_sequence(torch.randn(1, 60, D), ids)
            other_tok, _ = tm.mtp_sequence(h, (ids + 1) % 256)
        self.assertTrue(torch.equal(base, other_h))
        self.assertGreater((base - other_tok).abs().max().item(), 1e-3)

    def test_shared_embedding_and_head(self):
        tm = self.model()
        ids = torch.tensor([self.ids(60)])
        h = torch.randn(1, 60, tm.cfg.hidden_size)
        with torch.no_grad():
            base, _ = tm.mtp_sequence(h, ids)
            tm.W("head.weight").mul_(2)
            doubled, _ = tm.mtp_sequence(h, ids)
            tm.W("embed.weight")[ids[0, 1]] += 1.0  # the first position's next token
            moved, _ = tm.mtp_sequence(h, ids)
        self.assertLessEqual((doubled - 2 * base).abs().max().item(), 1e-5 * base.abs().max().item())
        self.assertGreater((moved[0, 0] - doubled[0, 0]).abs().max().item(), 1e-3)
        self.assertFalse(any(k.startswith("mtp.") and ("embed" in k or "head" in k) for k in tm.state_dict_fp32()))


if __name__ == "__main__":
    unittest.main()
