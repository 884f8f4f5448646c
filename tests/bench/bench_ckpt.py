#!/usr/bin/env python3
"""bench_ckpt.py — SaveCheckpoint and LoadCheckpoint against dd on the same
disk, in one run (docs/PERF.md; goal: >= 80% of dd).

One daemon (checkpoint root in --dir, default a new directory under the
build tree, i.e. the disk the build is on) initializes --preset (default
qwen2.5-0.5b-shape: 494M parameters, 5.5 GiB with the AdamW moments) and,
--rounds times, interleaved:
  save   SaveCheckpoint of everything (model, optimizer, extra): files
         written, fsync'ed, renamed (the daemon's own crash-safe path);
  dd-w   dd if=/dev/zero of=DIR/dd.bin bs=8M count=<the same bytes>
         conv=fsync: the disk's streaming write with one fsync;
  load   LoadCheckpoint of that checkpoint, its files dropped from the page
         cache first (posix_fadvise DONTNEED after an fsync), so it reads
         the disk: every byte read, checksummed (XXH64) and copied into the
         engine;
  dd-r   dd if=DIR/dd.bin of=/dev/null bs=8M, dropped from the cache alike;
  dd-r2  two such dd processes at once, each reading one half (skip=):
         the disk's read with two streams, which the load's verification
         uses (a second thread pulls each file's second half into the page
         cache, engines/io/xxh.c).
Prints each median in GB/s and engined's ratio against dd's (and dd-r2's).

  PYTHONPATH=client/python:build/client/python /usr/bin/python3 \\
      tests/bench/bench_ckpt.py [--preset small] [--rounds 3] [--dir DIR]
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
from daemon_fixture import Daemon  # noqa: E402

from engined_client import EngineClient  # noqa: E402

BS = 8 << 20


def drop_cache(path):
    """Write back and drop path's pages (every file below it)."""
    files = [path] if os.path.isfile(path) else [
        os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def dd(*args):
    subprocess.run(["dd", *args, "status=none"], check=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen2.5-0.5b-shape")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    base = a.dir or os.path.join(os.path.dirname(__file__), "..", "..", "build")
    tmp = tempfile.mkdtemp(prefix="bench-ckpt-", dir=base)
    d = Daemon(tmp=tmp)
    try:
        c = EngineClient(d.addr, timeout=3600)
        c.initialize(preset=a.preset)
        ddfile = os.path.join(tmp, "dd.bin")
        t = {"save": [], "dd-w": [], "load": [], "dd-r": [], "dd-r2": []}
        nbytes = 0
        for r in range(a.rounds):
            path = "round%d" % r
            t["save"].append(timed(lambda: c.save_checkpoint(path)))
            ck = os.path.join(d.ckpt_root, path)
            nbytes = sum(os.path.getsize(os.path.join(ck, f)) for f in os.listdir(ck))
            count = (nbytes + BS - 1) // BS
            t["dd-w"].append(timed(lambda: dd("if=/dev/zero", "of=" + ddfile, "bs=%d" % BS,
                                              "count=%d" % count, "conv=fsync")))
            drop_cache(ck)
            t["load"].append(timed(lambda: c.load_checkpoint(path)))
            drop_cache(ddfile)
            t["dd-r"].append(timed(lambda: dd("if=" + ddfile, "of=/dev/null", "bs=%d" % BS)))
            drop_cache(ddfile)
            half = (count + 1) // 2
            t["dd-r2"].append(timed(lambda: [p.wait() for p in [subprocess.Popen(
                ["dd", "if=" + ddfile, "of=/dev/null", "bs=%d" % BS, "count=%d" % half,
                 "skip=%d" % k, "status=none"]) for k in (0, half)]]))
            shutil.rmtree(ck)
            os.unlink(ddfile)
        gb = nbytes / 1e9
        med = {k: statistics.median(v) for k, v in t.items()}
        print("preset %s: checkpoint %.2f GB, %d rounds (medians; all: %s)" % (
            a.preset, gb, a.rounds, {k: ["%.2f" % x for x in v] for k, v in t.items()}))
        print("%-8s %8s %8s" % ("", "s", "GB/s"))
        for k in ("save", "dd-w", "load", "dd-r", "dd-r2"):
            print("%-8s %8.2f %8.3f" % (k, med[k], gb / med[k]))
        print("save / dd write: %.0f%%   load / dd read: %.0f%%   (goal >= 80%%);"
              "   load / two dd reads at once: %.0f%%" % (
                  100 * med["dd-w"] / med["save"], 100 * med["dd-r"] / med["load"],
                  100 * med["dd-r2"] / med["load"]))
    finally:
        d.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
