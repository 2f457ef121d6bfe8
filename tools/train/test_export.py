"""export.py's MTP tensors: a trained MTP layer added to a shipped model
directory leaves every tensor it had bit for bit, and loads back.

  /usr/bin/python3 -m unittest discover -s tools/train
"""

import hashlib
import json
import os
import sys
import tempfile
import unittest

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import export  # noqa: E402
import model as M  # noqa: E402


def config(mtp):
    with open(os.path.join(HERE, "config.json")) as f:
        raw = json.load(f)
    if mtp:
        raw["num_nextn_predict_layers"] = 1
    return raw


class AddMtp(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.src = os.path.join(self.tmp.name, "src")
        self.out = os.path.join(self.tmp.name, "out")
        os.makedirs(self.src)
        tm = M.TrainModel(M.Config(config(mtp=True)), seed=2)
        w = tm.state_dict_fp32()
        self.mtp = {k: v for k, v in w.items() if k.startswith("mtp.")}
        self.mtp["mtp.0.hnorm.weight"] = 1 + 0.1 * torch.randn(self.mtp["mtp.0.hnorm.weight"].shape)
        trunk_cfg = M.Config(config(mtp=False))
        export.write_safetensors(os.path.join(self.src, "model.safetensors"),
                                 export.checkpoint_tensors(trunk_cfg, w), {"generator": "test"})
        with open(os.path.join(self.src, "config.json"), "w") as f:
            json.dump(config(mtp=False), f, indent=2)
            f.write("\n")
        with open(os.path.join(self.src, "tokenizer.json"), "w") as f:
            f.write("{}\n")
        export.write_manifest(self.src)

    def tearDown(self):
        self.tmp.cleanup()

    def test_trunk_bit_identical_and_mtp_loads_back(self):
        added = export.add_mtp(self.src, self.mtp, self.out)
        self.assertEqual(set(added), set(self.mtp))
        old = export.read_safetensors(os.path.join(self.src, "model.safetensors"))
        new = export.read_safetensors(os.path.join(self.out, "model.safetensors"))
        self.assertEqual(set(new), set(old) | set(self.mtp))
        for name, t in old.items():
            self.assertEqual((new[name].dtype, new[name].shape, bytes(new[name].data)),
                             (t.dtype, t.shape, bytes(t.data)), name)
        self.assertEqual(new["mtp.0.enorm.weight"].dtype, "F32")
        self.assertEqual(new["mtp.0.eh_proj.weight"].dtype, "BF16")
        self.assertEqual(new["mtp.0.attn.wq_a.weight"].dtype, "BF16")
        with open(os.path.join(self.out, "config.json")) as f:
            raw = json.load(f)
        self.assertEqual(raw.pop("num_nextn_predict_layers"), 1)
        self.assertEqual(raw, config(mtp=False))
        with open(os.path.join(self.out, "manifest.json")) as f:
            files = json.load(f)["files"]
        self.assertEqual([e["path"] for e in files], ["config.json", "model.safetensors", "tokenizer.json"])
        for e in files:
            with open(os.path.join(self.out, e["path"]), "rb") as f:
                data = f.read()
            self.assertEqual((e["size"], e["sha256"]), (len(data), hashlib.sha256(data).hexdigest()))
        model, found = M.load_model_dir(self.out)
        self.assertEqual(set(found), set(self.mtp))
        for name, v in self.mtp.items():
            want = v if name.endswith("norm.weight") else v.to(torch.bfloat16).float()
            self.assertTrue(torch.equal(model.W(name).detach(), want), name)

    def test_refuses_a_second_mtp_and_wrong_shapes(self):
        export.add_mtp(self.src, self.mtp, self.out)
        with self.assertRaisesRegex(ValueError, "already has num_nextn_predict_layers"):
            export.add_mtp(self.out, self.mtp, os.path.join(self.tmp.name, "again"))
        bad = dict(self.mtp, **{"mtp.0.eh_proj.weight": torch.zeros(128, 128)})
        with self.assertRaisesRegex(ValueError, "mtp.0.eh_proj.weight: shape"):
            export.add_mtp(self.src, bad, os.path.join(self.tmp.name, "bad"))
        unknown = dict(self.mtp, **{"mtp.0.extra.weight": torch.zeros(4)})
        with self.assertRaisesRegex(ValueError, "mtp.0.extra.weight"):
            export.add_mtp(self.src, unknown, os.path.join(self.tmp.name, "unknown"))


if __name__ == "__main__":
    unittest.main()
