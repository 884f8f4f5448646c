#!/usr/bin/env python3
"""bench_dp_step.py — the step overhead of data parallelism, in one run:
2 daemons as one engine (EngineGroup, Gloo), each on half of a batch with
one compute thread, against 1 daemon with one thread on one half (the same
work per rank). The ratio (2-rank step time / 1-rank step time) is the
overhead: 1.0 is free; the excess is the reduction of the gradients, the
norm and the all-gather of the parameters (4 bytes a parameter each) and
the split/merge. Two ways to reduce, interleaved round by round:
  step:     OptimizerStep reduce-scatters the gradients (after the backward);
  backward: the ForwardBackward reduces them to their owners bucket by
            bucket while its last backward pass runs (reduce_gradients).
and the sharded stages (dist.zero_stage, the group re-initialized each
round): ZeRO-2 (each part's gradients reduced as the backward finishes
it) and ZeRO-3 (each part's weights gathered before the forward and the
backward use it, the next one's while the current one computes), with
the fraction of their collectives' time the calls did not wait for (the
communication hidden behind compute: 1 - reduce_wait_s / reduce_s of
GetStatus.dist, the ranks' worst).
Medians of the steps after a warm-up, over --rounds rounds.

--link-gbit R puts rank 1's daemon in a network namespace of its own,
joined to rank 0's by a veth pair shaped to R Gbit/s each way (tc tbf):
the two ranks then talk over a link of a real network's speed instead of
loopback (which is memory bandwidth), so what the overlap hides shows.
Needs root (ip netns, tc); everything is removed at the end.

  PYTHONPATH=client/python:build/client/python \\
      python3 tests/bench/bench_dp_step.py [--preset small] [--steps 3] \\
      [--rounds 2] [--link-gbit 2]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
from daemon_fixture import Daemon  # noqa: E402

from engined_client import EngineClient, EngineGroup  # noqa: E402

NS, VETH0, VETH1 = "engined-bench", "veth-ebench0", "veth-ebench1"
ADDR0, ADDR1 = "10.77.93.1", "10.77.93.2"


def sh(*cmd):
    subprocess.run(cmd, check=True)


def link_up(gbit):
    """rank 0's end in this namespace, rank 1's in NS; tbf on both ends."""
    link_down()
    sh("ip", "netns", "add", NS)
    sh("ip", "link", "add", VETH0, "type", "veth", "peer", "name", VETH1)
    sh("ip", "link", "set", VETH1, "netns", NS)
    sh("ip", "addr", "add", ADDR0 + "/24", "dev", VETH0)
    sh("ip", "link", "set", VETH0, "up")
    sh("ip", "netns", "exec", NS, "ip", "addr", "add", ADDR1 + "/24", "dev", VETH1)
    sh("ip", "netns", "exec", NS, "ip", "link", "set", VETH1, "up")
    sh("ip", "netns", "exec", NS, "ip", "link", "set", "lo", "up")
    rate = "%gmbit" % (gbit * 1000)
    for pre, dev in (([], VETH0), (["ip", "netns", "exec", NS], VETH1)):
        sh(*pre, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
           "burst", "4mb", "latency", "100ms")


def link_down():
    subprocess.run(["ip", "netns", "del", NS], stderr=subprocess.DEVNULL)
    subprocess.run(["ip", "link", "del", VETH0], stderr=subprocess.DEVNULL)


def dist_conf(tmp, host):
    path = os.path.join(tmp, "dist-%s.ini" % host)
    with open(path, "w") as f:
        f.write("[dist]\nhost = %s\n" % host)
    return path


def timed_steps(run, steps):
    times = []
    for i in range(steps + 1):
        t = time.perf_counter()
        run()
        if i:  # the first is the warm-up
            times.append(time.perf_counter() - t)
    return times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="small")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seqs", type=int, default=8, help="sequences of 128 tokens per rank")
    ap.add_argument("--link-gbit", type=float, default=0,
                    help="rank 1 behind a veth of this speed (0: loopback)")
    ap.add_argument("--bucket-mib", type=float, default=0, help="0: the default (25 MiB)")
    a = ap.parse_args()
    os.environ.setdefault("ENGINED_BIN", "build/daemon/engined")
    store = tempfile.mkdtemp(prefix="engined-bench-dist-")
    common = ("--dist-store-root", store, "--threads", "1")
    ds = []
    try:
        if a.link_gbit:
            link_up(a.link_gbit)
            ds.append(Daemon(*common, "--config", dist_conf(store, ADDR0)))
            # Plaintext on the bench's own private link (--insecure).
            d1 = Daemon(*common, "--config", dist_conf(store, ADDR1), "--insecure",
                        listen=ADDR1 + ":0", wrap=["ip", "netns", "exec", NS])
            d1.addr = "%s:%d" % (ADDR1, d1.port)
            ds.append(d1)
        else:
            ds += [Daemon(*common), Daemon(*common)]
        ds.append(Daemon(*common))
        init = dict(preset=a.preset, seed=1, optimizer={"lr": 1e-4})
        rng = np.random.default_rng(0)
        lens = [128] * (2 * a.seqs)
        ids = rng.integers(0, 1000, sum(lens)).astype(np.int32)
        half = sum(lens[:a.seqs])
        bucket = int(a.bucket_mib * (1 << 20)) or None
        with EngineGroup([ds[0].addr, ds[1].addr], timeout=900) as g, \
                EngineClient(ds[2].addr, timeout=900) as one:
            g.initialize(dist_timeout_s=600, dist_bucket_bytes=bucket, **init)
            one.initialize(**init)
            n = one.get_status().num_parameters

            def group_step(reduce):
                def run():
                    g.forward_backward(ids, lens, loss="sft", reduce_gradients=reduce)
                    g.optimizer_step()
                return run

            def one_step():
                one.forward_backward(ids[:half], lens[:a.seqs], loss="sft")
                one.optimizer_step()

            t = {"one": [], "step": [], "backward": [], 2: [], 3: []}
            waits, reduce_s, buckets = [], [], 0
            hidden = {2: [], 3: []}
            for _ in range(a.rounds):
                g.initialize(dist_timeout_s=600, dist_bucket_bytes=bucket, replace=True,
                             **init)
                t["one"] += timed_steps(one_step, a.steps)
                t["step"] += timed_steps(group_step(False), a.steps)
                t["backward"] += timed_steps(group_step(True), a.steps)
                st = [s.dist for s in g.get_status()]
                waits.append(max(s.reduce_wait_s for s in st))
                reduce_s.append(max(s.reduce_s for s in st))
                buckets = st[0].reduce_buckets
                for stage in (2, 3):
                    g.initialize(dist_timeout_s=600, dist_zero_stage=stage, replace=True,
                                 **init)
                    t[stage] += timed_steps(group_step(False), a.steps)
                    st = [s.dist for s in g.get_status()]
                    hidden[stage].append(min(1 - s.reduce_wait_s / s.reduce_s for s in st))
    finally:
        for d in ds:
            d.stop()
        if a.link_gbit:
            link_down()
    med = {k: statistics.median(v) for k, v in t.items()}
    link = ("a %g Gbit/s veth between the ranks" % a.link_gbit if a.link_gbit
            else "loopback")
    print("preset %s, %d parameters (%.0f MB of gradients), %d tokens per rank, 1 compute "
          "thread per daemon, %s; %d rounds x %d steps, medians"
          % (a.preset, n, 4e-6 * n, half, link, a.rounds, a.steps))
    print("1 rank  (half the batch):                    %.3f s per step" % med["one"])
    print("2 ranks, gradients reduced in the step:      %.3f s per step  (%.3fx)"
          % (med["step"], med["step"] / med["one"]))
    print("2 ranks, reduced during the backward pass:   %.3f s per step  (%.3fx)"
          % (med["backward"], med["backward"] / med["one"]))
    print("  the reduction in the backward: %d buckets, %.3f s of reductions, of which the "
          "call waited %.3f s after its backward (median of the rounds)"
          % (buckets, statistics.median(reduce_s), statistics.median(waits)))
    print("reducing during the backward / in the step: %.3fx the step time"
          % (med["backward"] / med["step"]))
    for stage in (2, 3):
        print("2 ranks, ZeRO-%d:                             %.3f s per step  (%.3fx the "
              "ZeRO-1 step); %.0f%% of its collectives' time hidden behind compute"
              % (stage, med[stage], med[stage] / med["step"],
                 100 * statistics.median(hidden[stage])))


if __name__ == "__main__":
    main()
