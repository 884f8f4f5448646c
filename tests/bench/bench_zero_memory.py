#!/usr/bin/env python3
"""bench_zero_memory.py — peak memory per rank of a sharded group
(dist.zero_stage) at W = 1, 2, 3, in one run: each daemon's peak RSS
(VmHWM, /proc) over its RSS before Initialize, after an Initialize, one
training ForwardBackward and one OptimizerStep, against engined's own
accounting of that rank (GetStatus's Memory: parameters, gradients,
moments, part buffers and the call's activations). Prints, per W, the
measured and the accounted MB and their ratio (the issue asks for at most
1.15), and how the model state shrinks with W against 1/W.

  PYTHONPATH=client/python:build/client/python \\
      python3 tests/bench/bench_zero_memory.py [--preset small] [--stage 3]
"""
import argparse
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
from daemon_fixture import Daemon  # noqa: E402

from engined_client import EngineClient, EngineGroup  # noqa: E402


def proc_kb(pid, key):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def run(preset, W, stage, tokens):
    store = tempfile.mkdtemp(prefix="engined-bench-dist-")
    ds = [Daemon("--dist-store-root", store, "--threads", "1") for _ in range(W)]
    try:
        base = [proc_kb(d.proc.pid, "VmRSS") for d in ds]
        init = dict(preset=preset, seed=1, optimizer={"lr": 1e-4})
        rng = np.random.default_rng(0)
        lens = [tokens] * (2 * W)
        ids = rng.integers(0, 1000, sum(lens)).astype(np.int32)
        if W == 1:
            with EngineClient(ds[0].addr, timeout=3600) as c:
                c.initialize(**init)
                c.forward_backward(ids, lens, loss="sft")
                c.optimizer_step()
                st = [c.get_status()]
        else:
            with EngineGroup([d.addr for d in ds], timeout=3600) as g:
                g.initialize(dist_timeout_s=3000, dist_zero_stage=stage, **init)
                g.forward_backward(ids, lens, loss="sft")
                g.optimizer_step()
                st = g.get_status()
        peak = [proc_kb(d.proc.pid, "VmHWM") - b for d, b in zip(ds, base)]
    finally:
        for d in ds:
            d.stop()
    acct = []
    for s in st:
        m = s.memory
        acct.append(m.param_bytes + m.grad_bytes + m.optimizer_bytes + m.gathered_bytes
                    + m.activation_bytes)
    fams = [s.memory.param_bytes + s.memory.grad_bytes + s.memory.optimizer_bytes
            for s in st]
    state = [f + s.memory.gathered_bytes for f, s in zip(fams, st)]
    return max(peak), max(acct), max(state), st[0].num_parameters, max(fams)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="small")
    ap.add_argument("--stage", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64, help="tokens per sequence (2 per rank)")
    ap.add_argument("--worlds", default="1,2,3")
    a = ap.parse_args()
    os.environ.setdefault("ENGINED_BIN", "build/daemon/engined")
    rows = []
    for W in [int(w) for w in a.worlds.split(",")]:
        rows.append((W,) + run(a.preset, W, a.stage, a.tokens))
    P = rows[0][4]
    print("preset %s (%d parameters), zero_stage %d, %d tokens per rank; the worst rank"
          % (a.preset, P, a.stage, 2 * a.tokens))
    s1, f1 = rows[0][3], rows[0][5]
    for W, peak, acct, state, _, fams in rows:
        print("W=%d: peak RSS over idle %8.1f MB, accounted %8.1f MB (ratio %.3f); "
              "model state %8.1f MB = %.3f of W=1's, of which the sharded families %.3f "
              "(1/W = %.3f)" % (W, peak / 1e6, acct / 1e6, peak / acct, state / 1e6,
                                state / s1, fams / f1, 1 / W))


if __name__ == "__main__":
    main()
