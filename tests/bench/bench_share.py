#!/usr/bin/env python3
"""bench_share.py — ShareWeights (the same-host fast path) against its
limits and its peer, in one run (docs/PERF.md; goal: >= 5 GB/s).

One daemon with a share socket initializes --preset (default
qwen2.5-0.5b-shape: 494M parameters, 1.98 GB of fp32 weights, 0.99 GB
bf16) and, --rounds times, for each dtype, interleaved:
  memcpy        numpy copyto of the share's size between two buffers this
                process faulted in once (the machine's copy bandwidth: the
                limit of anything that writes every byte once);
  memcpy-fresh  the same into a buffer allocated for the copy (np.empty):
                what writing into memory the kernel has to hand out first
                costs here (a share's memory is always new: it is sealed);
  share         share_weights(dtype) (the RPC, in which the daemon fills and
                seals the memfd; the pick-up over the unix socket; the mmap)
                and then every byte of every view read (np.add.reduce over
                a uint64 view of each tensor), then close;
  stream        stream_weights(dtype) with the same read of each array (the
                gRPC path: protobuf over loopback, reassembled in Python).
Before each share, as in an RL loop, one training step (a 2 x 16-token
SFT forward_backward and an optimizer step, TRAIN mode) changes the
weights; --no-steps leaves them as they are. A bfloat16 share of all the
weights is the engine's own bf16 copy, lent (no copy made: the daemon's
log says "lent"); an fp32 engine makes that copy at its first lend and
keeps it current in AdamW from then on. A lent copy is never written
again, so the next optimizer step writes its new copy into fresh memory:
the bench times the optimizer steps that follow a lent share and those
that follow a copied one, the difference being the cost the lend moves
into the step.
--matmul bf16: the engine runs bf16 matmuls and one training step in TRAIN
mode first, so its bf16 copy is current from the start.
Prints the medians in GB/s (payload bytes over wall time) and the share's
ratios against each, and where the share's time went (RPC / pick-up and
map / read).

  PYTHONPATH=client/python:build/client/python build/venv-pypi/bin/python \\
      tests/bench/bench_share.py [--preset small] [--rounds 3] [--dtypes float32,bfloat16]
      [--matmul f32|bf16] [--no-steps]
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
from daemon_fixture import Daemon  # noqa: E402
from bench_engine import initialize, train_step  # noqa: E402

from engined_client import EngineClient  # noqa: E402


def read_all(a):
    """Read every byte of array a (its memory, whatever its dtype)."""
    b = a.reshape(-1).view(np.uint8)
    n8 = b.size // 8 * 8
    s = int(np.add.reduce(b[:n8].view(np.uint64))) if n8 else 0
    return s + int(b[n8:].sum())


def bench_share(c, dtype):
    t0 = time.perf_counter()
    w = c.share_weights(dtype=dtype)
    t1 = time.perf_counter()
    for a in w.values():
        read_all(a)
    t2 = time.perf_counter()
    n = w.nbytes
    w.close()
    return n, t2 - t0, t1 - t0, t2 - t1


def last_share_lent(d):
    """Whether the daemon lent its last share (its log line)."""
    lines = [ln for ln in d.log_text().splitlines() if "share #" in ln and " tensors, " in ln]
    return bool(lines) and "lent (" in lines[-1]


def bench_stream(c, dtype):
    t0 = time.perf_counter()
    n = 0
    for _, a in c.stream_weights(dtype=dtype):
        read_all(a)
        n += a.nbytes
    return n, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen2.5-0.5b-shape")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--no-stream", action="store_true")
    ap.add_argument("--matmul", choices=("f32", "bf16"), default="f32")
    ap.add_argument("--no-steps", action="store_true")
    args = ap.parse_args()
    dtypes = args.dtypes.split(",")

    tmp = tempfile.mkdtemp(prefix="engined-bench-share-")
    d = Daemon("--share-socket", os.path.join(tmp, "share.sock"))
    res = {dt: {"memcpy": [], "memcpy-fresh": [], "share": [], "stream": [],
                "rpc": [], "read": [], "lent": []} for dt in dtypes}
    steps = {True: [], False: []}     # optimizer step seconds, after a lent share or not
    try:
        c = EngineClient(d.addr, timeout=3600)
        t = time.perf_counter()
        r = initialize(c, args.preset, args.matmul, seed=1)
        print("initialized %s: %d parameters in %.1f s" % (args.preset, r.num_parameters,
                                                           time.perf_counter() - t),
              flush=True)
        size = {}
        for dt in dtypes:      # a warm-up share of each dtype: its size
            with c.share_weights(dtype=dt) as w:
                size[dt] = w.nbytes
        big = max(size.values())
        src = np.ones(big, np.uint8)
        dst = np.zeros(big, np.uint8)
        for rnd in range(args.rounds):
            for dt in dtypes:
                n = size[dt]
                t = time.perf_counter()
                np.copyto(dst[:n], src[:n])
                res[dt]["memcpy"].append(n / (time.perf_counter() - t) / 1e9)
                t = time.perf_counter()
                fresh = np.empty(n, np.uint8)
                np.copyto(fresh, src[:n])
                res[dt]["memcpy-fresh"].append(n / (time.perf_counter() - t) / 1e9)
                del fresh
                if not args.no_steps:
                    steps[last_share_lent(d)].append(train_step(c))
                n, total, rpc, rd = bench_share(c, dt)
                res[dt]["lent"].append(last_share_lent(d))
                res[dt]["share"].append(n / total / 1e9)
                res[dt]["rpc"].append(rpc)
                res[dt]["read"].append(rd)
                if not args.no_stream:
                    n2, t2 = bench_stream(c, dt)
                    res[dt]["stream"].append(n2 / t2 / 1e9)
                print("round %d %s: memcpy %.2f, fresh %.2f, share %.2f GB/s (%s; rpc %.3f s, "
                      "read %.3f s)%s" % (
                          rnd, dt, res[dt]["memcpy"][-1], res[dt]["memcpy-fresh"][-1],
                          res[dt]["share"][-1], "lent" if res[dt]["lent"][-1] else "copied",
                          rpc, rd,
                          "" if args.no_stream else ", stream %.2f GB/s" % res[dt]["stream"][-1]),
                      flush=True)
        c.close()
    finally:
        d.stop()
        shares = [ln for ln in d.log_text().splitlines() if "GB/s)" in ln and "share #" in ln]
        shutil.rmtree(tmp, ignore_errors=True)
    med = {dt: {k: statistics.median(v) if v else float("nan") for k, v in r.items()
                if k != "lent"} for dt, r in res.items()}
    print("\nmedians of %d rounds, %s (%.2f GB fp32), matmuls %s:" % (
        args.rounds, args.preset, size.get("float32", big) / 1e9, args.matmul))
    for dt in dtypes:
        m = med[dt]
        how = {True: "lent", False: "copied"}
        print("  %-8s %.3f GB, %s: share %.2f GB/s (RPC %.3f s, read %.3f s) | memcpy %.2f "
              "(share %.2fx) | memcpy-fresh %.2f (%.2fx) | stream %.2f (%.2fx)" % (
                  dt, size[dt] / 1e9, "/".join(sorted({how[x] for x in res[dt]["lent"]})),
                  m["share"], m["rpc"], m["read"], m["memcpy"],
                  m["share"] / m["memcpy"], m["memcpy-fresh"], m["share"] / m["memcpy-fresh"],
                  m["stream"], m["share"] / m["stream"] if m["stream"] else float("nan")))
    if steps[True] and steps[False]:
        a, b = statistics.median(steps[True]), statistics.median(steps[False])
        print("optimizer step after a lent share %.3f s, after a copied one %.3f s: the lend "
              "moves %+.3f s into the step (its new bf16 copy in fresh memory)" % (a, b, a - b))
    print("daemon's fill (its log):")
    for ln in shares[-2 * len(dtypes):]:
        print("  " + ln.split(": ", 1)[1] if ": " in ln else ln)


if __name__ == "__main__":
    main()
