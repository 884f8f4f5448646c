#!/usr/bin/env python3
"""bench_stream_py.py — the Python client's weight iterator against raw TCP
in one run (docs/PERF.md: whole tensors through each client's iterator
>= 70% of raw TCP).

Interleaved, --reps times (medians reported):
  raw     raw TCP loopback: --raw-gib GiB sent in 4 MiB sendall() calls and
          received with recv_into() into a 4 MiB buffer, two threads of
          this process (the socket calls release the GIL: C speed);
  f32     EngineClient.stream_weights(dtype="float32"): whole tensors as
          numpy arrays, every byte received, decoded and copied once into
          its array;
  bf16    the same in bfloat16 (half the bytes; the daemon converts).
Rates are tensor bytes (or raw bytes) per second.

  PYTHONPATH=client/python:build/tests/integration build/venv-pypi/bin/python \\
      tests/bench/bench_stream_py.py [--preset qwen2.5-0.5b-shape] [--reps 3]
"""
import argparse
import os
import socket
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
from daemon_fixture import Daemon  # noqa: E402

from engined_client import EngineClient  # noqa: E402

CHUNK = 4 << 20


def raw_tcp(nbytes):
    """GB/s of nbytes over a loopback TCP connection."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    got = [0]

    def recv():
        c, _ = srv.accept()
        buf = bytearray(CHUNK)
        mv = memoryview(buf)
        while got[0] < nbytes:
            n = c.recv_into(mv)
            if not n:
                break
            got[0] += n
        c.close()
    t = threading.Thread(target=recv)
    t.start()
    s = socket.create_connection(srv.getsockname())
    data = memoryview(bytes(CHUNK))
    t0 = time.perf_counter()
    sent = 0
    while sent < nbytes:
        s.sendall(data)
        sent += CHUNK
    t.join()
    el = time.perf_counter() - t0
    s.close()
    srv.close()
    return got[0] / el / 1e9


def stream(c, dtype):
    t0 = time.perf_counter()
    n = sum(a.nbytes for _, a in c.stream_weights(dtype=dtype))
    return n / (time.perf_counter() - t0) / 1e9, n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen2.5-0.5b-shape")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--raw-gib", type=float, default=1.0)
    a = ap.parse_args()
    d = Daemon()
    try:
        c = EngineClient(d.addr, timeout=3600)
        c.initialize(preset=a.preset)
        rates = {"raw": [], "float32": [], "bfloat16": []}
        sizes = {}
        for _ in range(a.reps):
            rates["raw"].append(raw_tcp(int(a.raw_gib * (1 << 30))))
            for dt in ("float32", "bfloat16"):
                r, sizes[dt] = stream(c, dt)
                rates[dt].append(r)
        med = {k: statistics.median(v) for k, v in rates.items()}
        print("preset %s, %d reps (all: %s)" % (
            a.preset, a.reps, {k: ["%.2f" % x for x in v] for k, v in rates.items()}))
        print("raw TCP (Python sockets)      %6.2f GB/s" % med["raw"])
        for dt in ("float32", "bfloat16"):
            print("stream_weights %-9s %5.2f GB %6.2f GB/s   %3.0f%% of raw TCP (goal >= 70%%)"
                  % (dt, sizes[dt] / 1e9, med[dt], 100 * med[dt] / med["raw"]))
    finally:
        d.stop()


if __name__ == "__main__":
    main()
