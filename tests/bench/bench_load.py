#!/usr/bin/env python3
"""bench_load.py — the training step under load, old vs new OpenMP policy,
in one run (docs/PERF.md, "under load"; goal: <= 2.5x slower than quiet).

Two daemons with `[engine] threads = 0` (the CPU budget: all CPUs here):
  old: GOMP_SPINCOUNT=300000, libgomp's default spin (what engined ran with
       before it chose a wait policy; set explicitly, so the daemon keeps it)
  new: the daemon's own choice (no OpenMP variable in its environment: it
       sets OMP_WAIT_POLICY=passive and re-executes itself, daemon/omp_policy.h)
Each preset's step (ForwardBackward SFT + OptimizerStep, 256 tokens) is timed
under three conditions, interleaved in rounds so that the machine's drift
hits both policies alike:
  quiet   no competitor started (the machine may still run other work)
  busy    one busy-loop process per CPU
  bursty  a 2-thread torch process (Debian's torch, OMP_WAIT_POLICY=active):
          bursts of matmuls and elementwise ops with 2 ms sleeps, so that its
          OpenMP workers spin in between
Prints the median step time of each and its ratio against the same policy's
quiet time.

  PYTHONPATH=client/python:build/client/python /usr/bin/python3 \\
      tests/bench/bench_load.py [--presets tiny,small] [--rounds 2]

qwen2.5-0.5b-shape (~8 GiB) is not in the default list: add it with
--presets when the machine has the time. Its daemons run one at a time
(old, then new: not interleaved, so drift of the machine's other load
lands on one policy), as every preset's with --sequential; --interleave
runs them at once (~16 GiB), e.g. with --conds quiet.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
from daemon_fixture import Daemon  # noqa: E402

from engined_client import EngineClient  # noqa: E402

OMP_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "OMP_DYNAMIC")
POLICIES = {"old": {"GOMP_SPINCOUNT": "300000"}, "new": {}}
# (sequences, tokens each, timed steps) per preset.
BIG = ("qwen2.5-0.5b-shape",)
SHAPES = {"tiny": (4, 64, 30), "small": (2, 128, 8), "qwen2.5-0.5b-shape": (1, 256, 3)}

BURSTY = r"""
import time, torch
torch.set_num_threads(2)
a = torch.randn(384, 384)
x = torch.randn(1 << 20)
while True:
    for _ in range(8):
        a @ a
        x.mul_(1.0000001).add_(1e-7)
    time.sleep(0.002)
"""


def start_competitors(kind):
    if kind == "quiet":
        return []
    env = {k: v for k, v in os.environ.items() if k not in OMP_VARS}
    if kind == "busy":
        return [subprocess.Popen(["/usr/bin/python3", "-c", "while True: pass"], env=env)
                for _ in range(len(os.sched_getaffinity(0)))]
    env["OMP_WAIT_POLICY"] = "active"
    return [subprocess.Popen(["/usr/bin/python3", "-c", BURSTY], env=env)]


def stop_competitors(procs):
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def run_group(preset, group, policies, ids, lens, steps, rounds, conds, results):
    """Start a daemon per policy of `group`, time the steps under each
    condition, rounds interleaved; append to results."""
    warm = 1 if preset in BIG else 3
    daemons, clients = {}, {}
    try:
        for name in group:
            daemons[name] = Daemon("--threads", "0", env=policies[name])
            clients[name] = EngineClient(daemons[name].addr, timeout=3600)
            clients[name].initialize(preset=preset, seed=1, optimizer={"lr": 1e-5})
            for _ in range(warm):
                clients[name].forward_backward(ids, lens, loss="sft")
                clients[name].optimizer_step()
        for rnd in range(rounds):
            for cond in conds:
                procs = start_competitors(cond)
                time.sleep(1.0 if cond == "bursty" else 0.2)
                try:
                    order = list(group)
                    if rnd % 2:
                        order.reverse()
                    for name in order:
                        c = clients[name]
                        c.forward_backward(ids, lens, loss="sft")
                        c.optimizer_step()
                        for _ in range(steps):
                            t = time.perf_counter()
                            c.forward_backward(ids, lens, loss="sft")
                            c.optimizer_step()
                            results.setdefault((preset, name, cond), []).append(
                                time.perf_counter() - t)
                finally:
                    stop_competitors(procs)
        for name, d in daemons.items():
            line = [ln for ln in d.log_text().splitlines() if "engine threads:" in ln]
            print("%s %s: %s" % (preset, name, line[0].split("info: ", 1)[-1]
                                 if line else "?"), flush=True)
    finally:
        for c in clients.values():
            c.close()
        for d in daemons.values():
            d.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", default="tiny,small")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--sequential", action="store_true",
                    help="one daemon at a time (always for the 0.5B shape: memory)")
    ap.add_argument("--interleave", action="store_true",
                    help="the 0.5B shape's daemons at once too (~16 GiB)")
    ap.add_argument("--conds", default="quiet,busy,bursty")
    ap.add_argument("--policy", action="append", default=[],
                    help="NAME=VAR=V[,VAR=V]: another policy to compare (e.g. "
                    "spin10k=GOMP_SPINCOUNT=10000)")
    a = ap.parse_args()
    os.environ.setdefault("ENGINED_BIN", "build/daemon/engined")
    for k in OMP_VARS:
        os.environ.pop(k, None)
    policies = dict(POLICIES)
    for spec in a.policy:
        name, _, assigns = spec.partition("=")
        policies[name] = dict(kv.split("=", 1) for kv in assigns.split(","))
    conds = a.conds.split(",")
    load0 = open("/proc/loadavg").read().split()[:3]
    rng = np.random.default_rng(0)
    results = {}   # (preset, policy, cond) -> [step seconds]
    for preset in a.presets.split(","):
        nseq, seqlen, steps = SHAPES[preset]
        lens = [seqlen] * nseq
        ids = rng.integers(0, 1000, sum(lens)).astype(np.int32)
        # Large models: one daemon at a time (memory), not interleaved.
        alone = a.sequential or (preset in BIG and not a.interleave)
        groups = [[p] for p in policies] if alone else [list(policies)]
        for group in groups:
            run_group(preset, group, policies, ids, lens, steps, a.rounds, conds, results)
    print("\nmedian step (ForwardBackward SFT + OptimizerStep), ratio vs the same policy quiet;"
          " %d CPUs, %d rounds" % (len(os.sched_getaffinity(0)), a.rounds))
    print("%-20s %-8s %12s %20s %20s" % ("preset", "policy", "quiet", "busy loops", "bursty torch"))
    worst = {}
    for preset in a.presets.split(","):
        for name in policies:
            q = statistics.median(results[(preset, name, "quiet")])
            cells = ["%9.1f ms" % (q * 1e3), "", ""]
            for cond in [c for c in conds if c != "quiet"]:
                m = statistics.median(results[(preset, name, cond)])
                cells[1 if cond == "busy" else 2] = "%9.1f ms %5.2fx" % (m * 1e3, m / q)
                worst[name] = max(worst.get(name, 0), m / q)
            print("%-20s %-8s %12s %20s %20s" % (preset, name, *cells))
        if "old" in policies and "new" in policies:
            print("%-20s quiet, old / new: %.2fx" % (preset, statistics.median(
                results[(preset, "old", "quiet")]) / statistics.median(
                results[(preset, "new", "quiet")])))
    for name, w in worst.items():
        print("worst ratio, %s: %.2fx (goal <= 2.5x)" % (name, w))
    print("load average at start %s, at end %s (other work on the machine)"
          % (" ".join(load0), " ".join(open("/proc/loadavg").read().split()[:3])))


if __name__ == "__main__":
    main()
