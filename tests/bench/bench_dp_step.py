#!/usr/bin/env python3
"""bench_dp_step.py — the step overhead of data parallelism, in one run:
2 daemons as one engine (EngineGroup, Gloo on loopback), each on half of
a batch with one compute thread, against 1 daemon with one thread on one
half (the same work per rank). The ratio (2-rank step time / 1-rank step
time) is the overhead: 1.0 is free; the excess is the reduce-scatter,
norm and all-gather of every parameter (8 bytes a parameter each way) and
the split/merge. Median of the steps after a warm-up.

  PYTHONPATH=client/python:build/tests/integration \\
      python3 tests/bench/bench_dp_step.py [--preset small] [--steps 5]
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
from daemon_fixture import Daemon  # noqa: E402

from engined_client import EngineClient, EngineGroup  # noqa: E402


def timed_steps(run, steps):
    times = []
    for i in range(steps + 1):
        t = time.perf_counter()
        run()
        if i:  # the first is the warm-up
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="small")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--seqs", type=int, default=8, help="sequences of 128 tokens per rank")
    a = ap.parse_args()
    os.environ.setdefault("ENGINED_BIN", "build/daemon/engined")
    store = tempfile.mkdtemp(prefix="engined-bench-dist-")
    ds = [Daemon("--dist-store-root", store, "--threads", "1") for _ in range(3)]
    init = dict(preset=a.preset, seed=1, optimizer={"lr": 1e-4})
    rng = np.random.default_rng(0)
    lens = [128] * (2 * a.seqs)
    ids = rng.integers(0, 1000, sum(lens)).astype(np.int32)
    half = sum(lens[:a.seqs])
    try:
        with EngineGroup([ds[0].addr, ds[1].addr], timeout=600) as g, \
                EngineClient(ds[2].addr, timeout=600) as one:
            g.initialize(dist_timeout_s=300, **init)
            one.initialize(**init)
            n = one.get_status().num_parameters

            def group_step():
                g.forward_backward(ids, lens, loss="sft")
                g.optimizer_step()

            def one_step():
                one.forward_backward(ids[:half], lens[:a.seqs], loss="sft")
                one.optimizer_step()

            t1 = timed_steps(one_step, a.steps)
            t2 = timed_steps(group_step, a.steps)
            t1b = timed_steps(one_step, a.steps)   # again: the machine may drift
            t1 = min(t1, t1b)
    finally:
        for d in ds:
            d.stop()
    print("preset %s, %d parameters, %d tokens per rank, 1 thread per daemon"
          % (a.preset, n, half))
    print("1 rank  (half the batch): %.3f s per step" % t1)
    print("2 ranks (whole batch):    %.3f s per step" % t2)
    print("data-parallel step overhead: %.3fx (2 ranks / 1 rank, same work per rank)"
          % (t2 / t1))


if __name__ == "__main__":
    main()
