"""Self tests of the golden reference.

  /usr/bin/python3 -m unittest discover -s tools/reference

The tiny model directory used here is built by make_model_dir below (random
weights written with our own safetensors writer) so that the tests do not
depend on the C++ generator.
"""

import copy
import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import mxfp4  # noqa: E402
import model as M  # noqa: E402
from safetensors_io import SafetensorsError, read_checkpoint, read_safetensors, write_safetensors  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

# model.md section 2, scaled down so that the tests run in seconds.
SMALL_CONFIG = {
    "architecture": "moe-dsa-v1",
    "vocab_size": 300,
    "hidden_size": 64,
    "num_layers": 5,
    "layer_types": ["mla", "delta", "dsa", "delta", "dsa"],
    "first_dense_layers": 1,
    "intermediate_size": 96,
    "rms_norm_eps": 1e-6,
    "mla": {"num_heads": 2, "q_lora_rank": 48, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
            "qk_rope_head_dim": 8, "v_head_dim": 16, "output_gate": True},
    "dsa": {"index_n_heads": 2, "index_head_dim": 16, "index_topk": 2048},
    "delta": {"num_heads": 2, "head_k_dim": 16, "head_v_dim": 32, "conv_size": 4, "norm_eps": 1e-5},
    "moe": {"num_experts": 8, "experts_per_token": 2, "num_shared_experts": 1, "moe_intermediate_size": 32,
            "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5, "score_func": "sigmoid"},
    "rope": {"theta": 10000.0, "scaling": "yarn", "factor": 256.0, "original_max_position": 4096,
             "beta_fast": 32, "beta_slow": 1, "mscale": 1.0},
    "max_position_embeddings": 1048576,
    "quantization": {"format": "mxfp4", "block_size": 32, "applies_to": ["experts"]},
    "thinking_budgets": {"low": 256, "medium": 2048, "high": 16384},
}


def make_model_dir(path, config=SMALL_CONFIG, seed=0, shards=1):
    """Random model with the exact names/shapes/dtypes of model.md 1.1."""
    os.makedirs(path, exist_ok=True)
    cfg = M.Config(config)
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in M.expected_tensors(cfg).items():
        if name.endswith(".scales"):
            continue
        if name.endswith(".blocks"):
            base = name[: -len(".blocks")]
            dense = torch.randn(*shape[:-2], shape[-2] * 32, generator=gen) / math.sqrt(shape[-2] * 32)
            blocks, scales = mxfp4.encode(dense)
            tensors[base + ".blocks"] = (blocks, "U8")
            tensors[base + ".scales"] = (scales, "U8")
            continue
        dtype = M.allowed_dtypes(name)[0]
        if name.endswith("A_log"):
            t = torch.log(torch.empty(shape).uniform_(1, 16, generator=gen))
        elif name.endswith("dt_bias"):
            t = 0.5 * torch.randn(shape, generator=gen)
        elif name.endswith("norm.weight"):
            t = 1 + 0.1 * torch.randn(shape, generator=gen)
        elif name.endswith(("k_norm.bias", "gate.bias")):
            t = 0.1 * torch.randn(shape, generator=gen)
        elif "conv1d" in name:
            t = 0.5 * torch.randn(shape, generator=gen)
        elif name == "embed.weight":
            t = torch.randn(shape, generator=gen)
        else:
            t = torch.randn(shape, generator=gen) / math.sqrt(shape[-1])
        tensors[name] = (t, dtype)
    names = sorted(tensors)
    if shards == 1:
        write_safetensors(os.path.join(path, "model.safetensors"), tensors)
    else:
        weight_map = {}
        for s in range(shards):
            part = {n: tensors[n] for n in names[s::shards]}
            fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            write_safetensors(os.path.join(path, fname), part)
            weight_map.update({n: fname for n in part})
        with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
            json.dump({"weight_map": weight_map}, f)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    return path


def with_changes(**sections):
    c = copy.deepcopy(SMALL_CONFIG)
    for key, val in sections.items():
        if isinstance(val, dict):
            c[key].update(val)
        else:
            c[key] = val
    return c


class MXFP4Test(unittest.TestCase):
    def encode_block(self, values):
        w = torch.zeros(1, 32)
        w[0, : len(values)] = torch.tensor(values)
        return mxfp4.encode(w)

    def codes(self, blocks):
        b = blocks.reshape(-1).to(torch.int64)
        return torch.stack([b & 15, b >> 4], -1).reshape(-1).tolist()

    def test_ties_to_even_and_saturation(self):
        # max 4 -> floor(log2 4) - 2 = 0: values are their own E2M1 inputs.
        vals = [4.0, 0.25, 0.75, 2.5, 5.0, 1.25, 1.75, 3.5, 5.9, 0.3]
        blocks, scales = self.encode_block(vals)
        self.assertEqual(scales.tolist(), [[127]])
        dec = mxfp4.decode(blocks, scales)[0, : len(vals)].tolist()
        self.assertEqual(dec, [4.0, 0.0, 1.0, 2.0, 4.0, 1.0, 2.0, 4.0, 6.0, 0.5])
        # max 7 -> scale 127 still (floor(log2 7) = 2): 7 and 6.5 saturate at 6.
        blocks, scales = self.encode_block([7.0, 6.5, -7.5])
        self.assertEqual(scales.tolist(), [[127]])
        self.assertEqual(mxfp4.decode(blocks, scales)[0, :3].tolist(), [6.0, 6.0, -6.0])
        self.assertEqual(self.codes(blocks)[:3], [7, 7, 15])

    def test_scale_exponent(self):
        blocks, scales = self.encode_block([1.0])  # floor(log2 1) - 2 = -2
        self.assertEqual(scales.tolist(), [[125]])
        self.assertEqual(mxfp4.decode(blocks, scales)[0, 0].item(), 1.0)
        self.assertEqual(self.codes(blocks)[0], 6)  # 1 / 2^-2 = 4 -> code 6
        blocks, scales = self.encode_block([1e-45])  # clamps at -127
        self.assertEqual(scales.tolist(), [[0]])

    def test_zero_block_and_negative_zero(self):
        blocks, scales = self.encode_block([])
        self.assertEqual(scales.tolist(), [[0]])
        self.assertEqual(blocks.tolist(), [[[0] * 16]])
        blocks, scales = self.encode_block([-0.0, 4.0, -0.01])
        c = self.codes(blocks)
        self.assertEqual(c[0], 8)
        self.assertEqual(c[2], 8)  # small negative rounds to -0: sign bit kept
        self.assertTrue(math.copysign(1, mxfp4.decode(blocks, scales)[0, 0].item()) < 0)

    def test_nibble_order(self):
        w = torch.zeros(1, 32)
        w[0, 0], w[0, 1] = 0.5, 6.0  # codes 1 (low nibble) and 7 (high nibble)
        blocks, scales = mxfp4.encode(w * 1.0)
        # max 6 -> floor(log2 6) - 2 = 0
        self.assertEqual(blocks[0, 0, 0].item(), 1 | (7 << 4))

    def test_scale_255_and_nonfinite_refused(self):
        blocks = torch.zeros(1, 1, 16, dtype=torch.uint8)
        with self.assertRaisesRegex(mxfp4.MXFP4Error, "255"):
            mxfp4.decode(blocks, torch.full((1, 1), 255, dtype=torch.uint8))
        for bad in (float("nan"), float("inf")):
            with self.assertRaises(mxfp4.MXFP4Error):
                self.encode_block([bad])

    def test_round_trip(self):
        gen = torch.Generator().manual_seed(3)
        w = torch.randn(3, 5, 96, generator=gen) * torch.rand(3, 5, 96, generator=gen) * 100
        blocks, scales = mxfp4.encode(w)
        self.assertEqual(tuple(blocks.shape), (3, 5, 3, 16))
        self.assertEqual(tuple(scales.shape), (3, 5, 3))
        dec = mxfp4.decode(blocks, scales)
        # Decoded values are representable: encoding them again is the identity.
        b2, s2 = mxfp4.encode(dec)
        self.assertTrue(torch.equal(b2, blocks) and torch.equal(s2, scales))
        # Every code decodes and re-encodes to itself at every scale.
        codes = torch.arange(256, dtype=torch.uint8).reshape(1, 16, 16)
        for s in (0, 1, 100, 127, 200, 252):  # 4 * 2^(253-127) overflows fp32
            sc = torch.full((1, 16), s, dtype=torch.uint8)
            # Blocks whose max magnitude is in [4, 6] keep their scale.
            blk = codes.clone()
            blk[0, :, 0] = 7 | (7 << 4)
            d = mxfp4.decode(blk, sc)
            b3, s3 = mxfp4.encode(d)
            self.assertTrue(torch.equal(s3, sc), s)
            # -0 and +0 both decode to 0 but keep their sign bit.
            self.assertTrue(torch.equal(b3, blk), s)


class SafetensorsTest(unittest.TestCase):
    def test_round_trip_and_bf16(self):
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "a.safetensors")
            x = torch.tensor([1.0, -2.5, 3.0078125, 1e-3])
            write_safetensors(p, {"x": (x, "BF16"), "y": (x, "F32"), "z": (torch.arange(5), "U8")})
            t = read_safetensors(p)
            self.assertEqual(t["x"].dtype, "BF16")
            self.assertTrue(torch.equal(t["x"].to_torch(), x.to(torch.bfloat16).float()))
            self.assertTrue(torch.equal(t["y"].to_torch(), x))
            self.assertEqual(t["z"].to_torch().tolist(), [0, 1, 2, 3, 4])

    def test_rejects_malformed(self):
        with tempfile.TemporaryDirectory() as d:
            def write_raw(header, data=b"\0" * 16):
                p = os.path.join(d, "bad.safetensors")
                h = json.dumps(header).encode()
                with open(p, "wb") as f:
                    f.write(struct.pack("<Q", len(h)) + h + data)
                return p

            cases = {
                "overlap": {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                            "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}},
                "out of range": {"a": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]}},
                "needs": {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}},
                "unknown dtype": {"a": {"dtype": "F4", "shape": [3], "data_offsets": [0, 8]}},
            }
            for msg, header in cases.items():
                with self.assertRaisesRegex(SafetensorsError, msg):
                    read_safetensors(write_raw(header))
            p = os.path.join(d, "short.safetensors")
            with open(p, "wb") as f:
                f.write(struct.pack("<Q", 1000) + b"{}")
            with self.assertRaisesRegex(SafetensorsError, "larger than the file"):
                read_safetensors(p)


class ModelPiecesTest(unittest.TestCase):
    def test_routing_selects_with_bias_weights_without(self):
        cfg = M.Config(with_changes(moe={"num_experts": 4, "experts_per_token": 1, "n_group": 1, "topk_group": 1,
                                         "routed_scaling_factor": 1.0}))
        # Gate logits make expert 0 the best by score; the bias makes expert 3 the pick.
        x = torch.zeros(1, cfg.hidden_size)
        x[0, 0] = 1.0
        gate_w = torch.zeros(4, cfg.hidden_size)
        gate_w[:, 0] = torch.tensor([2.0, 0.0, 0.0, 1.0])
        bias = torch.tensor([0.0, 0.0, 0.0, 0.5])
        idx, w = M.moe_route(cfg, gate_w, bias, x)
        self.assertEqual(idx.tolist(), [[3]])
        self.assertAlmostEqual(w.item(), 1.0, places=6)  # sigmoid(1)/sigmoid(1) * 1.0
        cfg2 = M.Config(with_changes(moe={"num_experts": 4, "experts_per_token": 2, "n_group": 1, "topk_group": 1,
                                          "routed_scaling_factor": 2.5}))
        idx, w = M.moe_route(cfg2, gate_w, bias, x)
        self.assertEqual(idx.tolist(), [[3, 0]])
        s = torch.sigmoid(torch.tensor([1.0, 2.0]))
        self.assertTrue(torch.allclose(w[0], s / s.sum() * 2.5))

    def test_group_limited_routing_and_ties(self):
        cfg = M.Config(with_changes(moe={"num_experts": 8, "experts_per_token": 2, "n_group": 4, "topk_group": 2}))
        # sb per expert (logit 0 -> s = 0.5 everywhere); bias decides.
        x = torch.zeros(1, cfg.hidden_size)
        gate_w = torch.zeros(8, cfg.hidden_size)
        # groups {0,1} {2,3} {4,5} {6,7}: group sums 1.0+0.9, 1.0+0.0, 0.95+0.95, 0.0
        bias = torch.tensor([0.5, 0.4, 0.5, -0.5, 0.45, 0.45, -0.5, -0.5])
        idx, _ = M.moe_route(cfg, gate_w, bias, x)
        # groups 0 and 2 survive; best experts: 0 (1.0), then 4 and 5 tie at 0.95 -> 4.
        self.assertEqual(idx.tolist(), [[0, 4]])
        # Full tie: lowest indices win.
        idx, w = M.moe_route(cfg, gate_w, torch.zeros(8), x)
        self.assertEqual(idx.tolist(), [[0, 1]])
        self.assertTrue(torch.allclose(w, torch.tensor([[1.25, 1.25]])))

    def test_dsa_select_ties_and_margin(self):
        inf = float("-inf")
        I = torch.tensor([[1.0, inf, inf, inf], [2.0, 2.0, inf, inf], [1.0, 3.0, 1.0, inf], [0.0, 5.0, 4.0, 4.5]])
        keep, sel, margin, max_abs = M.dsa_select(I, 2)
        self.assertEqual(sel, [[0], [0, 1], [0, 1], [1, 3]])
        self.assertEqual(margin, [None, None, 0.0, 0.5])
        self.assertEqual(max_abs, [1.0, 2.0, 3.0, 5.0])

    def test_yarn_frequencies(self):
        cfg = M.Config(SMALL_CONFIG)
        f = M.rope_frequencies(cfg)
        base = 1.0 / (10000.0 ** (torch.arange(0, 8, 2).float() / 8))
        d = 8
        c = lambda r: d * math.log(4096 / (2 * math.pi * r)) / (2 * math.log(10000.0))  # noqa: E731
        low, high = max(math.floor(c(32)), 0), min(math.ceil(c(1)), d - 1)
        for j in range(4):
            smooth = 1 - min(max((j - low) / (high - low), 0), 1)
            self.assertAlmostEqual(f[j].item(), base[j].item() / 256 * (1 - smooth) + base[j].item() * smooth, 7)
        m = 0.1 * math.log(256) + 1
        self.assertAlmostEqual(M.mla_softmax_scale(cfg), 24**-0.5 * m * m, 12)
        # No correction when the context is not extended.
        cfg2 = M.Config(with_changes(max_position_embeddings=4096))
        self.assertTrue(torch.equal(M.rope_frequencies(cfg2), base))
        self.assertEqual(M.mla_softmax_scale(cfg2), 24**-0.5)

    def test_rope_pairings(self):
        cos, sin = M.rope_angles(torch.tensor([1.0, 0.01]), torch.tensor([1]))
        x = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
        inter = M.rope_interleaved(x, cos, sin)
        half = M.rope_half_split(x, cos, sin)
        c, s = math.cos(1.0), math.sin(1.0)
        self.assertAlmostEqual(inter[0, 0].item(), 1 * c - 2 * s, 6)  # pair (0, 1)
        self.assertAlmostEqual(inter[0, 1].item(), 1 * s + 2 * c, 6)
        self.assertAlmostEqual(half[0, 0].item(), 1 * c - 3 * s, 6)  # pair (0, 2)
        self.assertAlmostEqual(half[0, 2].item(), 1 * s + 3 * c, 6)

    def test_delta_chunked_equals_recurrent(self):
        gen = torch.Generator().manual_seed(5)
        T, H, dk, dv = 150, 3, 16, 24
        q = M.l2_normalize(torch.randn(T, H, dk, generator=gen)) * dk**-0.5
        k = M.l2_normalize(torch.randn(T, H, dk, generator=gen))
        v = torch.randn(T, H, dv, generator=gen)
        beta = torch.sigmoid(torch.randn(T, H, generator=gen))
        g = -torch.exp(torch.randn(H, generator=gen)) * torch.nn.functional.softplus(torch.randn(T, H, generator=gen))
        o_r, s_r = M.delta_rule_recurrent(q, k, v, beta, g)
        for chunk in (1, 16, 64):
            o_c, s_c = M.delta_rule_chunked(q, k, v, beta, g, chunk=chunk)
            self.assertLess((o_c - o_r).abs().max().item(), 1e-4 * o_r.abs().max().item(), chunk)
            self.assertLess((s_c - s_r).abs().max().item(), 1e-4 * s_r.abs().max().item(), chunk)

    def test_delta_recurrence_by_hand(self):
        # One head, dk = dv = 1, two steps: S1 = b1 v1 k1^2..., computed by hand.
        q = torch.tensor([[[1.0]], [[1.0]]])
        k = torch.tensor([[[1.0]], [[1.0]]])
        v = torch.tensor([[[2.0]], [[4.0]]])
        beta = torch.tensor([[0.5], [0.5]])
        g = torch.tensor([[0.0], [math.log(0.5)]])
        o, S = M.delta_rule_recurrent(q, k, v, beta, g)
        # t0: S = 0 + 1*0.5*(2-0) = 1; t1: S = 0.5, u = 0.5*(4 - 0.5) = 1.75, S = 2.25
        self.assertTrue(torch.allclose(o.reshape(-1), torch.tensor([1.0, 2.25])))

    def test_causal_conv(self):
        u = torch.tensor([[1.0], [2.0], [3.0]])
        w = torch.tensor([[10.0, 100.0, 1000.0]])  # w[:, conv-1] multiplies the current input
        out = M.causal_depthwise_conv(u, w).reshape(-1).tolist()
        self.assertEqual(out, [1000.0, 2100.0, 3210.0])


class ModelTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.set_num_threads(2)
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dir = make_model_dir(os.path.join(cls.tmp.name, "small"), seed=1)
        cls.model = M.Model.load(cls.dir)
        gen = torch.Generator().manual_seed(7)
        cls.tokens = torch.randint(0, 268, (40,), generator=gen).tolist()
        cls.logits, cls.dsa = cls.model.forward(cls.tokens)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_logits_sane(self):
        self.assertEqual(tuple(self.logits.shape), (40, 300))
        self.assertTrue(torch.isfinite(self.logits).all())
        self.assertGreater(self.logits.std().item(), 0.1)
        self.assertEqual(sorted(self.dsa), [2, 4])

    def test_causal(self):
        prefix, _ = self.model.forward(self.tokens[:17])
        ref = self.logits[:17]
        self.assertLess((prefix - ref).abs().max().item(), 1e-5 * ref.abs().max().item())

    def test_incremental_equals_full(self):
        # Prefill in pieces, then one token at a time, through the cache.
        for topk in (2048, 8):
            cfg = M.Config(with_changes(dsa={"index_topk": topk}))
            model = M.Model(cfg, self.model.W)
            full, full_dsa = model.forward(self.tokens)
            for absorbed, chunked in ((False, False), (True, True)):
                cache = model.new_cache()
                parts, sel = [], {2: [], 4: []}
                for piece in [self.tokens[:17], self.tokens[17:30]] + [[t] for t in self.tokens[30:]]:
                    logits, dsa = model.forward(piece, cache, mla_absorbed=absorbed, delta_chunked=chunked)
                    parts.append(logits)
                    for layer in sel:
                        sel[layer] += dsa[layer]["selected"]
                inc = torch.cat(parts)
                self.assertLess((inc - full).abs().max().item(), 1e-5 * full.abs().max().item(), (topk, absorbed))
                for layer in sel:
                    self.assertEqual(sel[layer], full_dsa[layer]["selected"])

    def test_second_forms_agree(self):
        # absorbed vs expanded MLA, chunked vs recurrent DeltaNet: 1e-4 * max|ref| (section 10).
        alt, dsa = self.model.forward(self.tokens, mla_absorbed=True, delta_chunked=True)
        self.assertLess((alt - self.logits).abs().max().item(), 1e-4 * self.logits.abs().max().item())
        self.assertEqual(dsa[2]["selected"], self.dsa[2]["selected"])

    def test_dsa_with_short_context_is_dense_mla(self):
        # Context 40 <= index_topk 2048: every s <= t selected, and the model
        # with dsa layers relabelled mla (indexer weights unused) is identical.
        for t, sel in enumerate(self.dsa[2]["selected"]):
            self.assertEqual(sel, list(range(t + 1)))
        self.assertTrue(all(m is None for m in self.dsa[2]["margin"]))
        cfg = M.Config(with_changes(layer_types=["mla", "delta", "mla", "delta", "mla"]))
        dense, dsa = M.Model(cfg, self.model.W).forward(self.tokens)
        self.assertEqual(dsa, {})
        self.assertTrue(torch.equal(dense, self.logits))

    def test_dsa_restricts_when_context_exceeds_topk(self):
        cfg = M.Config(with_changes(dsa={"index_topk": 8}))
        logits, dsa = M.Model(cfg, self.model.W).forward(self.tokens)
        for layer in (2, 4):
            sel = dsa[layer]["selected"]
            self.assertEqual([len(s) for s in sel], [min(8, t + 1) for t in range(40)])
            self.assertTrue(all(s[-1] <= t for t, s in enumerate(sel)))
            self.assertTrue(all(m is not None and m >= 0 for m in dsa[layer]["margin"][8:]))
        self.assertTrue(torch.equal(logits[:8], self.logits[:8]))  # t < 8 sees everything
        self.assertGreater((logits[8:] - self.logits[8:]).abs().max().item(), 1e-3)

    def test_loader_errors_name_the_tensor(self):
        with tempfile.TemporaryDirectory() as d:
            cfg = with_changes(num_layers=2, layer_types=["mla", "delta"])
            make_model_dir(d, cfg)
            t = read_safetensors(os.path.join(d, "model.safetensors"))
            tensors = {n: (r.to_torch(), r.dtype) for n, r in t.items()}
            good = dict(tensors)
            del tensors["layers.1.attn.A_log"]
            write_safetensors(os.path.join(d, "model.safetensors"), tensors)
            with self.assertRaisesRegex(M.ModelError, r"layers\.1\.attn\.A_log is missing"):
                M.Model.load(d)
            tensors = dict(good)
            tensors["layers.0.attn.wq_a.weight"] = (torch.zeros(3, 3), "BF16")
            write_safetensors(os.path.join(d, "model.safetensors"), tensors)
            with self.assertRaisesRegex(M.ModelError, r"layers\.0\.attn\.wq_a\.weight has shape"):
                M.Model.load(d)
            tensors = dict(good)
            tensors["norm.weight"] = (good["norm.weight"][0], "BF16")
            write_safetensors(os.path.join(d, "model.safetensors"), tensors)
            with self.assertRaisesRegex(M.ModelError, r"norm\.weight has dtype BF16"):
                M.Model.load(d)

    def test_config_validation_names_field(self):
        bad = {
            "layer_types": with_changes(layer_types=["mla"]),
            "moe.topk_group": with_changes(moe={"topk_group": 5}),
            "dsa.index_head_dim": with_changes(dsa={"index_head_dim": 6}),
            "max_position_embeddings": with_changes(max_position_embeddings=4096 * 257),
            "vocab_size": with_changes(vocab_size=200),
        }
        for field, cfg in bad.items():
            with self.assertRaisesRegex(M.ModelError, field.replace(".", r"\.")):
                M.Config(cfg)

    def test_sharded_checkpoint_and_cli(self):
        with tempfile.TemporaryDirectory() as d:
            sharded = make_model_dir(os.path.join(d, "sharded"), seed=1, shards=3)
            a = read_checkpoint(sharded)
            b = read_checkpoint(self.dir)
            self.assertEqual(sorted(a), sorted(b))
            out = os.path.join(d, "out")
            toks = ",".join(map(str, self.tokens[:12]))
            subprocess.run(
                [sys.executable, os.path.join(HERE, "reference.py"), "--model", sharded, "--tokens", toks,
                 "--decode", "5", "--out", out], check=True, capture_output=True)
            with open(os.path.join(out, "meta.json")) as f:
                meta = json.load(f)
            logits = np.fromfile(os.path.join(out, "logits.f32"), dtype="<f4").reshape(meta["positions"], -1)
            self.assertEqual((meta["prompt_len"], meta["positions"], meta["vocab_size"]), (12, 17, 300))
            self.assertEqual(len(meta["greedy_tokens"]), 5)
            full = self.tokens[:12] + meta["greedy_tokens"]
            ref, _ = self.model.forward(full)
            self.assertLess(np.abs(logits - ref.numpy()).max(), 1e-4 * meta["max_abs_logit"])
            for n, tok in enumerate(meta["greedy_tokens"]):
                self.assertEqual(tok, int(np.argmax(logits[11 + n, :268])))
            self.assertEqual(len(meta["dsa_selected"]["2"]), 17)
            self.assertEqual(len(meta["top2_margin"]), 17)
            bad = subprocess.run(
                [sys.executable, os.path.join(HERE, "reference.py"), "--model", sharded, "--tokens", "1,268",
                 "--out", out], capture_output=True, text=True)
            self.assertEqual(bad.returncode, 1)
            self.assertIn("token 1 = 268", bad.stderr)


BF16_EXPERTS = {"quantization": {"format": "bf16"}}


def with_quantization(q, **sections):
    """with_changes, then "quantization" replaced by q as a whole."""
    c = with_changes(**sections)
    c["quantization"] = q
    return c


def bf16_copy_of(mxfp4_dir, out_dir):
    """The MXFP4 model at mxfp4_dir with its experts written as BF16 tensors
    (model.md 1.2) holding the decoded MXFP4 values, which BF16 holds exactly
    (an E2M1 value times a power of two has at most two significant bits)."""
    tensors = {}
    for name, r in read_checkpoint(mxfp4_dir).items():
        if name.endswith(".scales"):
            continue
        if name.endswith(".blocks"):
            base = name[: -len(".blocks")]
            scales = read_checkpoint(mxfp4_dir)[base + ".scales"].to_torch()
            tensors[base + ".weight"] = (mxfp4.decode(r.to_torch(), scales), "BF16")
        else:
            tensors[name] = (r.to_torch(), r.dtype)
    os.makedirs(out_dir)
    write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors)
    with open(os.path.join(mxfp4_dir, "config.json")) as f:
        config = json.load(f)
    config.update(BF16_EXPERTS)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f)
    return out_dir


class Bf16ExpertsTest(unittest.TestCase):
    """model.md 1.2: routed experts stored as BF16 tensors."""

    def test_same_values_give_the_same_logits(self):
        torch.set_num_threads(2)
        with tempfile.TemporaryDirectory() as d:
            mx = make_model_dir(os.path.join(d, "mxfp4"), seed=3)
            bf = bf16_copy_of(mx, os.path.join(d, "bf16"))
            self.assertIn("layers.1.ffn.experts.w13.weight", read_checkpoint(bf))
            tokens = list(range(250, 268)) + list(range(0, 200, 11))
            a, _ = M.Model.load(mx).forward(tokens)
            b, _ = M.Model.load(bf).forward(tokens)
            self.assertTrue(torch.equal(a, b))

    def test_generated_bf16_model_runs(self):
        torch.set_num_threads(2)
        with tempfile.TemporaryDirectory() as d:
            cfg = copy.deepcopy(SMALL_CONFIG)
            cfg.update(BF16_EXPERTS)
            m = M.Model.load(make_model_dir(os.path.join(d, "bf16"), cfg, seed=2))
            logits, _ = m.forward(list(range(30)))
            self.assertTrue(torch.isfinite(logits).all())
            self.assertGreater(logits.abs().max().item(), 0)

    def test_loader_errors_name_the_tensor(self):
        with tempfile.TemporaryDirectory() as d:
            cfg = with_quantization({"format": "bf16"}, num_layers=2, layer_types=["mla", "delta"])
            make_model_dir(d, cfg)
            path = os.path.join(d, "model.safetensors")
            good = {n: (r.to_torch(), r.dtype) for n, r in read_safetensors(path).items()}
            w13 = "layers.1.ffn.experts.w13.weight"
            self.assertEqual(good[w13][1], "BF16")
            cases = [
                ({w13: (good[w13][0], "F32")}, None, r"layers\.1\.ffn\.experts\.w13\.weight has dtype F32"),
                ({w13: (good[w13][0][:, :-1], "BF16")}, None, r"layers\.1\.ffn\.experts\.w13\.weight has shape"),
                ({}, w13, r"layers\.1\.ffn\.experts\.w13\.weight is missing"),
                ({"layers.1.ffn.experts.w2.blocks": (torch.zeros(8, 64, 1, 16, dtype=torch.uint8), "U8")}, None,
                 r"layers\.1\.ffn\.experts\.w2\.blocks holds routed experts in another format"),
            ]
            for add, remove, pattern in cases:
                tensors = dict(good)
                tensors.update(add)
                if remove:
                    del tensors[remove]
                write_safetensors(path, tensors)
                with self.assertRaisesRegex(M.ModelError, pattern):
                    M.Model.load(d)

    def test_config_formats(self):
        self.assertEqual(M.Config(SMALL_CONFIG).expert_format, "mxfp4")
        no_q = copy.deepcopy(SMALL_CONFIG)
        del no_q["quantization"]
        self.assertEqual(M.Config(no_q).expert_format, "mxfp4")
        self.assertEqual(M.Config(with_quantization({"format": "bf16"})).expert_format, "bf16")
        with self.assertRaisesRegex(M.ModelError, r"quantization\.format 'fp8' is not supported"):
            M.Config(with_quantization({"format": "fp8"}))
        with self.assertRaisesRegex(M.ModelError, r"quantization\.block_size has no meaning"):
            M.Config(with_quantization({"format": "bf16", "block_size": 32}))


GENERATOR = os.path.join(os.environ.get("MOESERVE_BINARY_DIR", os.path.join(HERE, "..", "..", "build")), "engine", "moe-model-gen")


@unittest.skipUnless(os.access(GENERATOR, os.X_OK), "build/engine/moe-model-gen not built")
class GeneratorCheckpointTest(unittest.TestCase):
    """The C++ generator's tiny checkpoint loads here, its MXFP4 blocks are
    canonical (decode then encode is the identity), and the model runs."""

    def test_tiny_preset(self):
        torch.set_num_threads(2)
        with tempfile.TemporaryDirectory() as tmp:
            d = os.path.join(tmp, "m")  # the generator creates the directory itself
            subprocess.run([GENERATOR, "--preset", "tiny", "--seed", "1", "--index-topk", "16", "--out", d],
                           check=True, capture_output=True)
            raw = read_checkpoint(d)
            for name, r in raw.items():
                if name.endswith(".blocks"):
                    blocks, scales = r.to_torch(), raw[name[: -len(".blocks")] + ".scales"].to_torch()
                    b2, s2 = mxfp4.encode(mxfp4.decode(blocks, scales))
                    self.assertTrue(torch.equal(b2, blocks) and torch.equal(s2, scales), name)
            model = M.Model.load(d)
            tokens = list(range(250, 268)) + list(range(0, 240, 9))
            full, dsa = model.forward(tokens)
            self.assertTrue(torch.isfinite(full).all())
            self.assertEqual([len(s) for s in dsa[3]["selected"]], [min(16, t + 1) for t in range(len(tokens))])
            cache = model.new_cache()
            inc = torch.cat([model.forward(tokens[:20], cache)[0]] + [model.forward([t], cache)[0] for t in tokens[20:]])
            self.assertLess((inc - full).abs().max().item(), 1e-5 * full.abs().max().item())

if __name__ == "__main__":
    unittest.main()


import vision as VI  # noqa: E402

VISION = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 48, "patch_size": 4,
          "merge_size": 2, "max_patches": 64, "projector_hidden_size": 40}


class VisionTest(unittest.TestCase):
    """model.md section 14: the resize rule, the filter, the tower, --image."""

    def test_grid_examples_match_the_engine(self):
        # The table of tests/engine/vision_config_test.cpp (28-pixel units, at most 256).
        vc = VI.VisionConfig({"hidden_size": 64, "num_layers": 1, "num_heads": 4, "intermediate_size": 8}, 384)
        cases = {(224, 224): (16, 16), (300, 200): (14, 22), (41, 13): (2, 2), (1, 1): (2, 2),
                 (1000, 500): (22, 44), (1920, 1080): (24, 42), (10000, 1): (2, 512), (1, 10000): (512, 2)}
        for (w, h), want in cases.items():
            self.assertEqual(VI.image_grid(vc, w, h), want, (w, h))
        with self.assertRaises(VI.VisionError):
            VI.image_grid(vc, 0, 5)

    def test_tent_filter(self):
        for n, o in [(10, 10), (7, 20), (40, 9), (1, 3), (5, 1)]:
            W = VI.tent_weights(n, o)
            self.assertTrue(torch.allclose(W.sum(1), torch.ones(o)), (n, o))
            self.assertTrue((W >= 0).all())
        self.assertTrue(torch.equal(VI.tent_weights(6, 6), torch.eye(6)))
        # Upscaling is bilinear with half-pixel centres: output 1 of 2 -> 4 sits at 0.75.
        W = VI.tent_weights(2, 4)
        self.assertAlmostEqual(float(W[1, 0]), 0.75, places=6)
        self.assertAlmostEqual(float(W[0, 0]), 1.0, places=6)  # clamped edge
        # A constant image stays constant at any size.
        img = torch.full((13, 29, 3), 77, dtype=torch.uint8)
        self.assertTrue(torch.allclose(VI.resize(img, 8, 8), torch.full((8, 8, 3), 77.0)))

    def test_patches_in_merge_order(self):
        vc = VI.VisionConfig(VISION, 300)
        img = torch.arange(8 * 16 * 3, dtype=torch.float32).reshape(8, 16, 3)
        x, rows, cols = VI.patches(vc, img, 2, 4)
        self.assertEqual(rows.tolist(), [0, 0, 1, 1, 0, 0, 1, 1])
        self.assertEqual(cols.tolist(), [0, 1, 0, 1, 2, 3, 2, 3])
        self.assertEqual(x.shape, (8, 48))
        # Element (ch, ky, kx) of patch 1 (row 0, col 1) is pixel (ky, 4 + kx), channel ch.
        self.assertAlmostEqual(float(x[1, (2 * 4 + 1) * 4 + 3]), (float(img[1, 7, 2]) / 255 - 0.5) / 0.5, places=5)

    def test_rope2d_rotates_rows_and_columns(self):
        vc = VI.VisionConfig(VISION, 300)
        cos, sin = VI.rope2d_angles(vc, torch.tensor([0, 3]), torch.tensor([0, 5]))
        x = torch.randn(2, 2, 16)
        y = VI.rope_half_split(x, cos, sin)
        self.assertTrue(torch.allclose(y[0], x[0]))  # position (0, 0): no rotation
        self.assertTrue(torch.allclose(y.norm(dim=-1), x.norm(dim=-1), atol=1e-5))
        self.assertAlmostEqual(float(torch.atan2(sin[1, 0], cos[1, 0])), 3.0, places=5)  # row angle, freq 1
        self.assertAlmostEqual(float(torch.atan2(sin[1, 4], cos[1, 4])), 5.0 - 2 * math.pi, places=5)  # column

    def test_tower_replaces_placeholders_and_cli_writes_rows(self):
        config = copy.deepcopy(SMALL_CONFIG)
        config["vision"] = VISION
        with tempfile.TemporaryDirectory() as d:
            make_model_dir(d, config)
            model = M.Model.load(d)
            rgb = torch.randint(0, 256, (20, 30, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
            rows, grid = VI.tower(model.cfg.vision, model.W, rgb)
            n = VI.image_token_count(model.cfg.vision, 30, 20)
            self.assertEqual(grid, (6, 8))  # 2.5 x 3.75 units round to 3 x 4
            self.assertEqual(rows.shape, (n, 64))
            tokens = [256, 259, 269] + [268] * n + [270, 104]
            with torch.no_grad():
                plain, _ = model.forward(list(tokens))
                seen, _ = model.forward(list(tokens), images=[(3, rows)])
            self.assertTrue(torch.equal(plain[:3], seen[:3]))  # causal: before the image nothing changes
            self.assertFalse(torch.allclose(plain[-1], seen[-1]))
            img_file = os.path.join(d, "img.rgb")
            with open(img_file, "wb") as f:
                f.write(struct.pack("<II", 30, 20) + rgb.numpy().tobytes())
            out = os.path.join(d, "out")
            subprocess.run([sys.executable, os.path.join(HERE, "reference.py"), "--model", d, "--tokens",
                            ",".join(map(str, tokens)), "--image", img_file, "--out", out, "--threads", "1"],
                           check=True, capture_output=True)
            got = np.fromfile(os.path.join(out, "vision_0.f32"), dtype="<f4").reshape(n, 64)
            self.assertTrue(np.allclose(got, rows.numpy(), atol=1e-6))
            with open(os.path.join(out, "meta.json")) as f:
                meta = json.load(f)
            self.assertEqual(meta["images"], [{"offset": 3, "tokens": n, "grid": [6, 8]}])
            # Placeholders without an image are refused.
            r = subprocess.run([sys.executable, os.path.join(HERE, "reference.py"), "--model", d, "--tokens",
                                ",".join(map(str, tokens)), "--out", out], capture_output=True, text=True)
            self.assertEqual(r.returncode, 1)
            self.assertIn("1 image placeholder runs but 0 --image files", r.stderr)
