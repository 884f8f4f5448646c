"""bf16_ref.py — what the integration tests hold bf16 bytes to: float32
rounded to nearest even, as uint16 bit patterns. rne_bits is the rule in
numpy; torch_bits is torch's own rounding where torch imports (an
independent implementation), else the rule."""
import numpy as np


def rne_bits(a):
    """float32 a rounded to nearest even bf16: the bit patterns (numpy only)."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def torch_bits(a):
    """The same through torch's float32 -> bfloat16 (rne_bits without torch)."""
    try:
        import torch
    except ImportError:
        return rne_bits(a)
    return torch.from_numpy(np.ascontiguousarray(a, np.float32)).to(torch.bfloat16) \
        .view(torch.int16).numpy().view(np.uint16)
