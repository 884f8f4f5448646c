"""bench_engine.py — the engine state the Python benchmarks start from
(bench_stream_py.py, bench_share.py; bench_stream.c does the same in C) and
the training step bench_share.py runs between its shares."""
import time

import numpy as np


def initialize(c, preset, matmul="f32", **kw):
    """c.initialize(preset); with matmul "bf16", bf16 matmuls and then one
    SFT step of 2 x 16 tokens in TRAIN mode, so that the engine's bf16 copy
    of its weights is current, as after every optimizer step of a bf16 RL
    loop (bf16 exports then send that copy as it is). Returns Initialize's
    result."""
    r = c.initialize(preset=preset, bf16_matmul=matmul == "bf16", **kw)
    if matmul == "bf16":
        train_step(c)
    return r


def train_step(c):
    """One SFT step of 2 x 16 tokens in TRAIN mode; returns the optimizer
    step's seconds."""
    c.set_mode("train")
    c.forward_backward(np.arange(32, dtype=np.int32) * 37 % 1000, [16, 16], loss="sft")
    t = time.perf_counter()
    c.optimizer_step()
    return time.perf_counter() - t
