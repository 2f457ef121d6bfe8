"""MXFP4 (OCP MX v1.0) encode/decode exactly as model.md section 7.

A weight W [rows, cols] is stored as
  NAME.blocks  U8 [rows, cols/32, 16]   two E2M1 codes per byte
  NAME.scales  U8 [rows, cols/32]       one E8M0 scale per 32 elements
Byte j of a block holds element 2j in its LOW nibble and 2j+1 in its HIGH
nibble. Leading dimensions (the expert axis) pass through unchanged.

All arithmetic here is exact: scaling by a power of two in float64 never
rounds, and rounding to E2M1 compares against the exactly representable
midpoints instead of computing distances.
"""

import torch

BLOCK = 32

# E2M1 value of each 4-bit code; bit 3 is the sign (code 8 is -0).
E2M1_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]

# Midpoints between consecutive E2M1 magnitudes 0,0.5,1,1.5,2,3,4,6.
_MIDPOINTS = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]


class MXFP4Error(ValueError):
    pass


def decode(blocks, scales, name="mxfp4 tensor"):
    """blocks U8 [..., rows, cols/32, 16], scales U8 [..., rows, cols/32]
    -> fp32 [..., rows, cols]. Scale 255 is NaN in E8M0 and is refused."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise MXFP4Error(f"{name}: blocks and scales must be U8, got {blocks.dtype} and {scales.dtype}")
    if blocks.shape[-1] != 16 or tuple(blocks.shape[:-1]) != tuple(scales.shape):
        raise MXFP4Error(
            f"{name}: blocks shape {tuple(blocks.shape)} does not match scales shape {tuple(scales.shape)} (+[16])"
        )
    if bool((scales == 255).any()):
        raise MXFP4Error(f"{name}: scale byte 255 (NaN) is not allowed")
    b = blocks.to(torch.int64)
    lo = b & 0x0F  # element 2j
    hi = b >> 4  # element 2j+1
    codes = torch.stack([lo, hi], dim=-1).reshape(*blocks.shape[:-1], BLOCK)
    table = torch.tensor(E2M1_VALUES, dtype=torch.float64)
    vals = table[codes] * torch.pow(2.0, scales.to(torch.float64) - 127.0).unsqueeze(-1)
    return vals.reshape(*scales.shape[:-1], scales.shape[-1] * BLOCK).to(torch.float32)


def encode(w, name="mxfp4 tensor"):
    """fp32 [..., rows, cols] (cols a multiple of 32) -> (blocks, scales)."""
    if w.shape[-1] % BLOCK != 0:
        raise MXFP4Error(f"{name}: last dimension {w.shape[-1]} is not a multiple of {BLOCK}")
    x = w.detach().to(torch.float64)
    if not bool(torch.isfinite(x).all()):
        raise MXFP4Error(f"{name}: NaN or infinite value cannot be encoded")
    nb = x.shape[-1] // BLOCK
    x = x.reshape(*x.shape[:-1], nb, BLOCK)
    amax = x.abs().amax(dim=-1)
    # floor(log2(amax)) exactly: frexp gives amax = m * 2^e with m in [0.5, 1).
    _, e = torch.frexp(torch.where(amax > 0, amax, torch.ones_like(amax)))
    X = (e.to(torch.int64) - 1 - 2).clamp(-127, 127)
    scales = torch.where(amax > 0, X + 127, torch.zeros_like(X))
    a = x.abs() / torch.pow(2.0, (scales - 127).to(torch.float64)).unsqueeze(-1)
    mids = torch.tensor(_MIDPOINTS, dtype=torch.float64)
    # i = number of midpoints strictly below a = index of the lower neighbour;
    # a value above 5 gets 7 (saturates at 6).
    i = torch.searchsorted(mids, a.contiguous(), right=False)
    # Exactly on midpoint i (between codes i and i+1): ties to the even code.
    on_mid = (i < len(_MIDPOINTS)) & (mids[i.clamp(max=len(_MIDPOINTS) - 1)] == a)
    mag = torch.where(on_mid & (i % 2 == 1), i + 1, i)
    codes = mag | (torch.signbit(x).to(torch.int64) << 3)
    codes = codes.reshape(*codes.shape[:-1], 16, 2)
    blocks = (codes[..., 0] | (codes[..., 1] << 4)).to(torch.uint8)
    return blocks, scales.to(torch.uint8)
