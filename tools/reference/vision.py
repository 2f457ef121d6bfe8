"""fp32 golden reference of the optional vision tower (model.md section 14).

Reads top to bottom like the spec: config (14.1), resize rule and filter
(14.2), tensors (14.3), the tower (14.4). The tower's output for one image is
[tokens, D]: the rows that replace the placeholders' embeddings (14.5).

The design follows Qwen2-VL's vision encoder (2D rotary embedding with
half-split pairs, patches numbered merge square by merge square, a 2x2
merge) with Qwen2.5-VL's RMSNorm and SwiGLU blocks and LLaVA-1.5's
Linear-GELU-Linear projector; model.md 14 says why. The formulas here are
written from model.md, not copied from those code bases.
"""

import math

import torch
import torch.nn.functional as F

FIRST_PADDING_ID = 268


class VisionError(ValueError):
    pass


# ----------------------------------------------------------------------------
# Section 14.1: config.json "vision"
# ----------------------------------------------------------------------------


class VisionConfig:
    def __init__(self, raw, vocab_size):
        if not isinstance(raw, dict):
            raise VisionError("config.json: vision: must be an object")

        def get(key, default=None):
            if key not in raw:
                if default is None:
                    raise VisionError(f"config.json: vision.{key}: missing")
                return default
            return raw[key]

        self.hidden_size = int(get("hidden_size"))
        self.num_layers = int(get("num_layers"))
        self.num_heads = int(get("num_heads"))
        self.intermediate_size = int(get("intermediate_size"))
        self.patch_size = int(get("patch_size", 14))
        self.merge_size = int(get("merge_size", 2))
        self.max_patches = int(get("max_patches", 1024))
        self.projector_hidden_size = int(get("projector_hidden_size", self.merge_size**2 * self.hidden_size))
        self.norm_eps = float(get("norm_eps", 1e-6))
        self.rope_theta = float(get("rope_theta", 10000.0))
        self.image_mean = [float(v) for v in get("image_mean", [0.5, 0.5, 0.5])]
        self.image_std = [float(v) for v in get("image_std", [0.5, 0.5, 0.5])]
        self.image_token_id = int(get("image_token_id", 268))
        self.image_start_token_id = int(get("image_start_token_id", 269))
        self.image_end_token_id = int(get("image_end_token_id", 270))
        if self.merge_size not in (1, 2):
            raise VisionError(f"config.json: vision.merge_size: {self.merge_size} must be 1 or 2")
        if self.hidden_size % self.num_heads or (self.hidden_size // self.num_heads) % 4:
            raise VisionError("config.json: vision.num_heads: the head size must divide hidden_size and be a multiple of 4")
        if self.max_patches < self.merge_size**2:
            raise VisionError("config.json: vision.max_patches: must be >= merge_size^2")
        if len(self.image_mean) != 3 or len(self.image_std) != 3 or min(self.image_std) <= 0:
            raise VisionError("config.json: vision.image_mean/image_std: 3 numbers each, std > 0")
        ids = (self.image_token_id, self.image_start_token_id, self.image_end_token_id)
        if len(set(ids)) != 3 or min(ids) < FIRST_PADDING_ID or max(ids) >= vocab_size:
            raise VisionError("config.json: vision token ids must be distinct padding ids")

    @property
    def head_dim(self):
        return self.hidden_size // self.num_heads

    @property
    def token_ids(self):
        return (self.image_token_id, self.image_start_token_id, self.image_end_token_id)


def expected_tensors(vc, D):
    """{name: shape} of the tower's tensors (14.3)."""
    Dv, Iv, P, p = vc.hidden_size, vc.intermediate_size, vc.projector_hidden_size, vc.patch_size
    t = {"vision.patch_embed.weight": (Dv, 3 * p * p), "vision.patch_embed.bias": (Dv,)}
    for i in range(vc.num_layers):
        b = f"vision.blocks.{i}."
        t[b + "norm1.weight"] = (Dv,)
        t[b + "attn.qkv.weight"] = (3 * Dv, Dv)
        t[b + "attn.qkv.bias"] = (3 * Dv,)
        t[b + "attn.proj.weight"] = (Dv, Dv)
        t[b + "attn.proj.bias"] = (Dv,)
        t[b + "norm2.weight"] = (Dv,)
        t[b + "mlp.w1.weight"] = (Iv, Dv)
        t[b + "mlp.w3.weight"] = (Iv, Dv)
        t[b + "mlp.w2.weight"] = (Dv, Iv)
    t["vision.norm.weight"] = (Dv,)
    t["vision.projector.w1.weight"] = (P, vc.merge_size**2 * Dv)
    t["vision.projector.w1.bias"] = (P,)
    t["vision.projector.w2.weight"] = (D, P)
    t["vision.projector.w2.bias"] = (D,)
    return t


def allowed_dtypes(name):
    """Norms and biases F32 only; matrices BF16 or F32 (no MXFP4 in the tower)."""
    if name.endswith(("norm.weight", "norm1.weight", "norm2.weight", ".bias")):
        return ("F32",)
    return ("BF16", "F32")


# ----------------------------------------------------------------------------
# Section 14.2: resize rule, filter, normalisation
# ----------------------------------------------------------------------------


def image_grid(vc, width, height):
    """(gh, gw) patches; the same IEEE double expressions, in the same order, as
    engine/vision/vision_config.cpp."""
    if not (1 <= width <= 65536 and 1 <= height <= 65536):
        raise VisionError(f"image size {width}x{height} must have sides in [1, 65536]")
    m = vc.merge_size
    unit = vc.patch_size * m
    max_units = vc.max_patches // (m * m)
    hu = height / unit
    wu = width / unit
    gh = max(1, math.floor(hu + 0.5))
    gw = max(1, math.floor(wu + 0.5))
    if gh * gw > max_units:
        s = math.sqrt(max_units / (hu * wu))
        gh = max(1, math.floor(hu * s))
        gw = max(1, math.floor(wu * s))
        while gh * gw > max_units:
            if gh >= gw:
                gh -= 1
            else:
                gw -= 1
    return gh * m, gw * m


def image_token_count(vc, width, height):
    gh, gw = image_grid(vc, width, height)
    return gh * gw // (vc.merge_size**2)


def tent_weights(n, o):
    """[o, n] normalised triangle-filter weights for one axis (14.2), computed in
    float64 and rounded to fp32 once normalised."""
    r = n / o
    f = max(r, 1.0)
    W = torch.zeros(o, n, dtype=torch.float64)
    for i in range(o):
        c = (i + 0.5) * r
        lo = max(0, math.floor(c - f - 0.5))
        hi = min(n, math.ceil(c + f + 0.5))
        row = []
        for j in range(lo, hi):
            row.append((j, max(0.0, 1.0 - abs(j + 0.5 - c) / f)))
        total = sum(w for _, w in row)
        for j, w in row:
            W[i, j] = w / total
    return W.to(torch.float32)


def resize(rgb, out_h, out_w):
    """rgb: uint8 [H, W, 3] -> fp32 [out_h, out_w, 3] byte values, horizontal
    pass first, then vertical."""
    H, W, _ = rgb.shape
    x = rgb.to(torch.float32)
    Wx = tent_weights(W, out_w)  # [out_w, W]
    Wy = tent_weights(H, out_h)  # [out_h, H]
    tmp = torch.einsum("ij,yjc->yic", Wx, x)
    return torch.einsum("oy,yic->oic", Wy, tmp)


def patches(vc, img, gh, gw):
    """Normalised [N, 3*p*p] patch vectors in merge order and their (row, col)."""
    p, m = vc.patch_size, vc.merge_size
    mean = torch.tensor(vc.image_mean, dtype=torch.float32)
    std = torch.tensor(vc.image_std, dtype=torch.float32)
    x = (img / 255.0 - mean) / std  # [gh*p, gw*p, 3]
    vecs, rows, cols = [], [], []
    for bh in range(gh // m):
        for bw in range(gw // m):
            for dy in range(m):
                for dx in range(m):
                    r, c = bh * m + dy, bw * m + dx
                    patch = x[r * p:(r + 1) * p, c * p:(c + 1) * p, :]  # [ky, kx, ch]
                    vecs.append(patch.permute(2, 0, 1).reshape(-1))  # index (ch*p + ky)*p + kx
                    rows.append(r)
                    cols.append(c)
    return torch.stack(vecs), torch.tensor(rows), torch.tensor(cols)


# ----------------------------------------------------------------------------
# Section 14.4: the tower
# ----------------------------------------------------------------------------


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope2d_angles(vc, rows, cols):
    """cos, sin [N, hd/2]: row angles in the first hd/4, column angles in the rest."""
    hd = vc.head_dim
    quarter = hd // 4
    freqs = 1.0 / (vc.rope_theta ** (torch.arange(quarter, dtype=torch.float64) * 4.0 / hd))
    freqs = freqs.to(torch.float32)
    ang = torch.cat([rows.to(torch.float32)[:, None] * freqs[None, :], cols.to(torch.float32)[:, None] * freqs[None, :]], dim=1)
    return torch.cos(ang), torch.sin(ang)


def rope_half_split(x, cos, sin):
    """x [N, heads, hd]; dims (j, j + hd/2) rotate together."""
    half = x.shape[-1] // 2
    c, s = cos[:, None, :], sin[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * c - b * s, b * c + a * s], dim=-1)


def tower(vc, W, rgb):
    """rgb: uint8 tensor [H, W, 3] -> (embeddings [tokens, D] fp32, (gh, gw))."""
    H, Wd, _ = rgb.shape
    gh, gw = image_grid(vc, Wd, H)
    p, m = vc.patch_size, vc.merge_size
    img = resize(rgb, gh * p, gw * p)
    x, rows, cols = patches(vc, img, gh, gw)
    h = x @ W["vision.patch_embed.weight"].T + W["vision.patch_embed.bias"]
    N, Dv, heads, hd = h.shape[0], vc.hidden_size, vc.num_heads, vc.head_dim
    cos, sin = rope2d_angles(vc, rows, cols)
    for i in range(vc.num_layers):
        b = f"vision.blocks.{i}."
        a = rms_norm(h, W[b + "norm1.weight"], vc.norm_eps)
        qkv = a @ W[b + "attn.qkv.weight"].T + W[b + "attn.qkv.bias"]
        q, k, v = qkv[:, :Dv], qkv[:, Dv:2 * Dv], qkv[:, 2 * Dv:]
        q = rope_half_split(q.reshape(N, heads, hd), cos, sin)
        k = rope_half_split(k.reshape(N, heads, hd), cos, sin)
        v = v.reshape(N, heads, hd)
        scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(hd)
        o = torch.einsum("hts,shd->thd", torch.softmax(scores, dim=-1), v).reshape(N, Dv)
        h = h + o @ W[b + "attn.proj.weight"].T + W[b + "attn.proj.bias"]
        f = rms_norm(h, W[b + "norm2.weight"], vc.norm_eps)
        h = h + (F.silu(f @ W[b + "mlp.w1.weight"].T) * (f @ W[b + "mlp.w3.weight"].T)) @ W[b + "mlp.w2.weight"].T
    z = rms_norm(h, W["vision.norm.weight"], vc.norm_eps)
    merged = z.reshape(N // (m * m), m * m * Dv)
    u = merged @ W["vision.projector.w1.weight"].T + W["vision.projector.w1.bias"]
    e = F.gelu(u) @ W["vision.projector.w2.weight"].T + W["vision.projector.w2.bias"]
    return e, (gh, gw)


# ----------------------------------------------------------------------------
# Image files for the CLI: "u32 width, u32 height (little-endian), RGB bytes"
# ----------------------------------------------------------------------------


def read_rgb_file(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise VisionError(f"{path}: shorter than its 8-byte header")
    w = int.from_bytes(data[0:4], "little")
    h = int.from_bytes(data[4:8], "little")
    if w < 1 or h < 1 or len(data) != 8 + w * h * 3:
        raise VisionError(f"{path}: {len(data) - 8} pixel bytes do not make a {w}x{h} RGB image")
    return torch.frombuffer(bytearray(data[8:]), dtype=torch.uint8).reshape(h, w, 3)
