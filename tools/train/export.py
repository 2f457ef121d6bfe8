"""Write trained weights as a model directory (docs/model-format.md section 1).

  /usr/bin/python3 tools/train/export.py --weights RUN/weights.pt --config tools/train/config.json \
      --tokenizer DIR/tokenizer.json --out models/tiny-agent/mxfp4 [--expert-format bf16]

Experts are MXFP4 (section 7, the reference's bit-exact encoder) or, with
--expert-format bf16, BF16 (section 1.2: the same trained values rounded to
BF16, to judge MXFP4 against); norms, A_log, dt_bias and the gate bias F32;
every other matrix BF16. The tokenizer.json
comes from moe-model-gen (it depends only on vocab_size). manifest.json lists
every other file with its size and sha256.

With a config whose num_nextn_predict_layers is set, the weights' MTP layers
(mtp.k.*, model.py's mtp_tensors) are written too: matrices BF16, norms F32.
To add a trained MTP layer to a model directory already shipped, its
tensors copied bit for bit (checked after writing):

  /usr/bin/python3 tools/train/export.py --add-mtp RUN/mtp/mtp_weights.pt \
      --from models/tiny-agent/mxfp4 --out OUT_DIR
"""

import argparse
import hashlib
import json
import os
import shutil
import struct
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import model as M  # noqa: E402

sys.path.insert(0, M.REFERENCE_DIR)
import mxfp4  # noqa: E402
from safetensors_io import _to_bytes, read_safetensors, write_safetensors  # noqa: E402


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
    out.update(mtp_checkpoint_tensors(cfg, weights))
    return out


def mtp_checkpoint_tensors(cfg, weights):
    """{name: (tensor, dtype)} of the MTP layers the config asks for (none
    without num_nextn_predict_layers): norms F32, matrices BF16."""
    out = {}
    for name, shape in M.mtp_tensors(cfg).items():
        if name not in weights:
            raise ValueError(f"{name}: missing from the weights (config num_nextn_predict_layers "
                             f"= {M.mtp_layers(cfg)})")
        t = weights[name]
        if tuple(t.shape) != tuple(shape):
            raise ValueError(f"{name}: shape {list(t.shape)}, the config needs {list(shape)}")
        out[name] = (t, "F32" if name.endswith("norm.weight") else "BF16")
    return out


def read_metadata(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)).get("__metadata__", {})


def write_raw_safetensors(path, tensors, metadata):
    """{name: (dtype, shape, raw bytes)} to one .safetensors file, laid out as
    write_safetensors lays it out (names sorted, header padded to 8 bytes)."""
    header, chunks, offset = {}, [], 0
    for name in sorted(tensors):
        dtype, shape, raw = tensors[name]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for c in chunks:
            f.write(c)


def add_mtp(src_dir, mtp_weights, out_dir, note=""):
    """A copy of model directory src_dir with the MTP layers of mtp_weights
    ({mtp.k.* name: fp32 tensor}) added: config.json gains
    num_nextn_predict_layers, every tensor src_dir has is copied bit for bit
    (compared after writing), tokenizer.json is copied, manifest.json is
    rewritten. Returns the names of the tensors added."""
    with open(os.path.join(src_dir, "config.json")) as f:
        raw = json.load(f)
    if M.mtp_layers(M.Config(raw)):
        raise ValueError(f"{src_dir}: config.json already has num_nextn_predict_layers")
    layers = 1 + max(int(k.split(".")[1]) for k in mtp_weights if k.startswith("mtp."))
    raw["num_nextn_predict_layers"] = layers
    cfg = M.Config(raw)
    src = os.path.join(src_dir, "model.safetensors")
    old = read_safetensors(src)
    clash = sorted(set(old) & set(M.mtp_tensors(cfg)))
    if clash:
        raise ValueError(f"{src}: already holds {clash[0]}")
    extra = sorted(set(mtp_weights) - set(M.mtp_tensors(cfg)))
    if extra:
        raise ValueError(f"the MTP weights hold {extra[0]}, which the format does not have")
    tensors = {n: (t.dtype, t.shape, bytes(t.data)) for n, t in old.items()}
    added = mtp_checkpoint_tensors(cfg, mtp_weights)
    for name, (t, dtype) in added.items():
        tensors[name] = (dtype, tuple(t.shape), _to_bytes(t, dtype))
    metadata = dict(read_metadata(src))
    metadata["mtp"] = "tools/train/export.py --add-mtp " + note
    os.makedirs(out_dir, exist_ok=True)
    dst = os.path.join(out_dir, "model.safetensors")
    write_raw_safetensors(dst, tensors, metadata)
    new = read_safetensors(dst)
    for name, t in old.items():
        if (new[name].dtype, new[name].shape, bytes(new[name].data)) != (t.dtype, t.shape, bytes(t.data)):
            raise RuntimeError(f"{dst}: tensor {name} differs from {src}")
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(raw, f, indent=2)
        f.write("\n")
    if os.path.abspath(src_dir) != os.path.abspath(out_dir):
        shutil.copyfile(os.path.join(src_dir, "tokenizer.json"), os.path.join(out_dir, "tokenizer.json"))
    write_manifest(out_dir)
    return sorted(added)


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
    ap.add_argument("--weights")
    ap.add_argument("--config")
    ap.add_argument("--tokenizer")
    ap.add_argument("--out", required=True)
    ap.add_argument("--note", default="", help="written into the safetensors metadata")
    ap.add_argument("--expert-format", choices=["mxfp4", "bf16"], default="mxfp4")
    ap.add_argument("--add-mtp", metavar="MTP_WEIGHTS_PT",
                    help="add these MTP layers (train_mtp.py's mtp_weights.pt) to the model directory --from")
    ap.add_argument("--from", dest="src", help="with --add-mtp: the model directory to copy")
    a = ap.parse_args()
    if a.add_mtp:
        if not a.src:
            ap.error("--add-mtp needs --from MODEL_DIR")
        names = add_mtp(a.src, torch.load(a.add_mtp), a.out, a.note)
        print(f"export: {a.out} ({a.src} and {len(names)} MTP tensors; every tensor of {a.src} bit-identical)")
        return
    if not (a.weights and a.config and a.tokenizer):
        ap.error("--weights, --config and --tokenizer are needed (or --add-mtp with --from)")
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
