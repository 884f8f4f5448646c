"""bf16_ref.py — what the integration tests hold bf16 bytes to: float32
rounded to nearest even, as uint16 bit patterns. rne_bits is the rule in
numpy; torch_bits is torch's own rounding where torch imports (an
independent implementation), else the rule."""
import os

import numpy as np


def rne_bits(a):
    """float32 a rounded to nearest even bf16: the bit patterns (numpy only)."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def expect_native_bf16_matmul():
    """Whether the daemon's CPU device should run oneDNN's own bf16 matmul
    (else it emulates it with fp32 products): oneDNN 2.6 needs avx512_core
    (AVX-512 F, BW, VL, DQ), by this CPU's flags, unless ONEDNN_MAX_CPU_ISA
    caps it below."""
    if os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper() in ("AVX2", "AVX2_VNNI", "AVX", "SSE41"):
        return False
    with open("/proc/cpuinfo") as f:
        flags = next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")), [])
    return all(x in flags for x in ("avx512f", "avx512bw", "avx512vl", "avx512dq"))


def torch_bits(a):
    """The same through torch's float32 -> bfloat16 (rne_bits without torch)."""
    try:
        import torch
    except ImportError:
        return rne_bits(a)
    return torch.from_numpy(np.ascontiguousarray(a, np.float32)).to(torch.bfloat16) \
        .view(torch.int16).numpy().view(np.uint16)
