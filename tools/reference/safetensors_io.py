"""Minimal safetensors reader/writer for the moe-dsa-v1 golden reference.

Self-contained on purpose (no `safetensors` package): the format is tiny and
the checks model.md section 1 requires (header length within the file,
offsets in range and non-overlapping, byte size matching the shape, known
dtype) are easier to see here than behind a library.

File layout: 8-byte little-endian header length N, N bytes of JSON
({name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}),
then the raw data; offsets are relative to the first byte after the header.
"""

import json
import os
import struct

import numpy as np
import torch

# Bytes per element for every dtype this reader understands. Anything else in
# a header is refused ("unknown dtype").
DTYPE_SIZES = {
    "BF16": 2,
    "F16": 2,
    "F32": 4,
    "F64": 8,
    "U8": 1,
    "F8_E4M3": 1,  # raw e4m3fn codes (decoded by the family that uses them)
    "I8": 1,
    "I16": 2,
    "I32": 4,
    "I64": 8,
    "BOOL": 1,
}

_NUMPY = {
    "F16": np.float16,
    "F32": np.float32,
    "F64": np.float64,
    "U8": np.uint8,
    "F8_E4M3": np.uint8,
    "I8": np.int8,
    "I16": np.int16,
    "I32": np.int32,
    "I64": np.int64,
    "BOOL": np.bool_,
}


class SafetensorsError(ValueError):
    """A malformed file or a tensor that does not match what is needed."""


class RawTensor:
    """A tensor as stored: dtype string, shape, and the raw little-endian bytes."""

    def __init__(self, name, dtype, shape, data, source):
        self.name = name
        self.dtype = dtype
        self.shape = tuple(shape)
        self.data = data  # bytes / memoryview
        self.source = source  # file the tensor came from, for error messages

    def to_torch(self):
        """Decode to a torch tensor. BF16 becomes fp32 exactly (bf16 is the top
        half of an fp32), U8 stays uint8, every float widens to fp32."""
        if self.dtype == "BF16":
            u16 = np.frombuffer(self.data, dtype="<u2").astype(np.uint32)
            f32 = (u16 << 16).view(np.float32)
            return torch.from_numpy(f32.reshape(self.shape).copy())
        np_dtype = np.dtype(_NUMPY[self.dtype]).newbyteorder("<")
        arr = np.frombuffer(self.data, dtype=np_dtype).reshape(self.shape).copy()
        if arr.dtype.kind == "f":
            arr = arr.astype(np.float32)
        return torch.from_numpy(arr)


def read_safetensors(path):
    """Read one .safetensors file into {name: RawTensor}, validating the header."""
    with open(path, "rb") as f:
        blob = f.read()
    size = len(blob)
    if size < 8:
        raise SafetensorsError(f"{path}: file is {size} bytes, shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > size - 8:
        raise SafetensorsError(f"{path}: header length {n} is larger than the file ({size} bytes)")
    try:
        header = json.loads(blob[8 : 8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{path}: header is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: header is not a JSON object")
    data = memoryview(blob)[8 + n :]
    tensors = {}
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
            raise SafetensorsError(f"{path}: tensor {name}: header entry needs dtype, shape, data_offsets")
        dtype = info["dtype"]
        shape = info["shape"]
        begin, end = info["data_offsets"]
        if dtype not in DTYPE_SIZES:
            raise SafetensorsError(f"{path}: tensor {name}: unknown dtype {dtype!r}")
        if not all(isinstance(d, int) and d >= 0 for d in shape):
            raise SafetensorsError(f"{path}: tensor {name}: bad shape {shape}")
        if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end <= len(data)):
            raise SafetensorsError(
                f"{path}: tensor {name}: data_offsets [{begin}, {end}] out of range (data is {len(data)} bytes)"
            )
        numel = 1
        for d in shape:
            numel *= d
        if numel * DTYPE_SIZES[dtype] != end - begin:
            raise SafetensorsError(
                f"{path}: tensor {name}: shape {shape} of {dtype} needs {numel * DTYPE_SIZES[dtype]} bytes, "
                f"offsets give {end - begin}"
            )
        spans.append((begin, end, name))
        tensors[name] = RawTensor(name, dtype, shape, data[begin:end], path)
    spans.sort()
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise SafetensorsError(f"{path}: tensors {n0} and {n1} overlap ([{b0},{e0}) and [{b1},{e1}))")
    return tensors


def read_checkpoint(model_dir):
    """Read every tensor of a model directory: the single model.safetensors, or
    the shards listed by model.safetensors.index.json (its weight_map says
    which shard holds which tensor; a tensor in the wrong shard is an error)."""
    index_path = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index_path):
        with open(index_path) as f:
            weight_map = json.load(f)["weight_map"]
        tensors = {}
        shards = {}
        for name, shard in weight_map.items():
            if shard not in shards:
                shards[shard] = read_safetensors(os.path.join(model_dir, shard))
            if name not in shards[shard]:
                raise SafetensorsError(f"{os.path.join(model_dir, shard)}: tensor {name} listed in the index is missing")
            tensors[name] = shards[shard][name]
        return tensors
    files = sorted(p for p in os.listdir(model_dir) if p.endswith(".safetensors"))
    if not files:
        raise SafetensorsError(f"{model_dir}: no .safetensors file")
    if len(files) > 1:
        raise SafetensorsError(f"{model_dir}: {len(files)} shards but no model.safetensors.index.json")
    return read_safetensors(os.path.join(model_dir, files[0]))


def _to_bytes(tensor, dtype):
    """Encode a torch tensor as the raw bytes of `dtype`. BF16 rounds fp32 to
    nearest even (as torch's own conversion does)."""
    t = tensor.detach().cpu().contiguous()
    if dtype == "BF16":
        u16 = t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
        return u16.astype("<u2").tobytes()
    if dtype == "F32":
        return t.to(torch.float32).numpy().astype("<f4").tobytes()
    if dtype in ("U8", "F8_E4M3"):
        return t.to(torch.uint8).numpy().tobytes()
    np_dtype = np.dtype(_NUMPY[dtype]).newbyteorder("<")
    return t.numpy().astype(np_dtype).tobytes()


def write_safetensors(path, tensors, metadata=None):
    """Write {name: (torch tensor, dtype string)} to one .safetensors file."""
    header = {}
    chunks = []
    offset = 0
    for name in sorted(tensors):
        tensor, dtype = tensors[name]
        if dtype not in DTYPE_SIZES:
            raise SafetensorsError(f"tensor {name}: cannot write dtype {dtype!r}")
        raw = _to_bytes(tensor, dtype)
        header[name] = {"dtype": dtype, "shape": list(tensor.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((8 - len(hjson) % 8) % 8)  # keep the data 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for c in chunks:
            f.write(c)
