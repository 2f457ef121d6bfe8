"""Write trained weights as a model directory (docs/model-format.md section 1).

  /usr/bin/python3 tools/train/export.py --weights RUN/weights.pt --config tools/train/config.json \
      --tokenizer DIR/tokenizer.json --out models/tiny-agent/mxfp4 [--expert-format bf16]

Experts are MXFP4 (section 7, the reference's bit-exact encoder) or, with
--expert-format bf16, BF16 (section 1.2: the same trained values rounded to
BF16, to judge MXFP4 against); norms, A_log, dt_bias and the gate bias F32;
every other matrix BF16. The tokenizer.json
comes from moe-model-gen (it depends only on vocab_size). manifest.json lists
every other file with its size and sha256.
"""

import argparse
import hashlib
import json
import os
import shutil
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import model as M  # noqa: E402

sys.path.insert(0, M.REFERENCE_DIR)
import mxfp4  # noqa: E402
from safetensors_io import write_safetensors  # noqa: E402


def checkpoint_tensors(cfg, weights):
    """{name: (tensor, dtype)} in the checkpoint's names and dtypes."""
    out = {}
    for name, shape in M.ref.expected_tensors(cfg).items():
        if name.endswith(".scales"):
            continue
        if name.endswith(".blocks"):
            base = name[: -len(".blocks")]
            blocks, scales = mxfp4.encode(weights[base], name=base)
            out[name] = (blocks, "U8")
            out[base + ".scales"] = (scales, "U8")
            continue
        if ".experts." in name and name.endswith(".weight"):
            out[name] = (weights[name[: -len(".weight")]], "BF16")
            continue
        t = weights[name]
        if tuple(t.shape) != tuple(shape):
            raise ValueError(f"{name}: shape {list(t.shape)}, the config needs {list(shape)}")
        out[name] = (t, M.ref.allowed_dtypes(name)[0])
    return out


def write_manifest(out_dir):
    files = []
    for name in sorted(os.listdir(out_dir)):
        if name == "manifest.json":
            continue
        with open(os.path.join(out_dir, name), "rb") as f:
            data = f.read()
        files.append({"path": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump({"files": files}, f, indent=2)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--note", default="", help="written into the safetensors metadata")
    ap.add_argument("--expert-format", choices=["mxfp4", "bf16"], default="mxfp4")
    a = ap.parse_args()
    with open(a.config) as f:
        raw = json.load(f)
    if a.expert_format == "bf16":
        raw["quantization"] = {"format": "bf16", "applies_to": ["experts"]}
    cfg = M.Config(raw)
    weights = torch.load(a.weights)
    os.makedirs(a.out, exist_ok=True)
    write_safetensors(os.path.join(a.out, "model.safetensors"), checkpoint_tensors(cfg, weights),
                      {"format": "pt", "generator": "tools/train/export.py " + a.note})
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(raw, f, indent=2)
        f.write("\n")
    shutil.copyfile(a.tokenizer, os.path.join(a.out, "tokenizer.json"))
    write_manifest(a.out)
    print(f"export: {a.out}")


if __name__ == "__main__":
    main()
