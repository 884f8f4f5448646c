#!/usr/bin/env python3
"""bench_stream_py.py — the Python client's weight iterator against raw TCP
in one run (docs/PERF.md: whole tensors through each client's iterator
>= 70% of raw TCP).

Interleaved, --reps times (medians reported):
  raw     raw TCP loopback: --raw-gib GiB sent in 4 MiB sendall() calls and
          received with recv_into() into a 4 MiB buffer, two threads of
          this process (the socket calls release the GIL: C speed); one
          4 MiB buffer sent again and again, so it stays in the caches;
  rawmem  the same, the GiB sent from a buffer of that size holding data
          (written before the timing): its bytes leave DRAM, as the
          stream's do from the engine's memory;
  f32     EngineClient.stream_weights(dtype="float32"): whole tensors as
          numpy arrays, every byte received, decoded and copied once into
          its array;
  bf16    the same in bfloat16 (half the bytes; the daemon converts, or
          with --matmul bf16 sends its current bf16 copy as it is: one
          training step in TRAIN mode runs first, as in an RL loop);
  grpc    the bf16 stream's messages as grpcio delivers them (bytes, not
          decoded or copied): the most any grpcio consumer gets, so
          bf16 / grpc is what the client itself costs.
Rates are tensor bytes (or raw bytes) per second; CPU-s/GB is this
process's CPU time (all threads) per GB.

  PYTHONPATH=client/python:build/client/python build/venv-pypi/bin/python \\
      tests/bench/bench_stream_py.py [--preset qwen2.5-0.5b-shape] [--reps 3]
      [--matmul f32|bf16]
"""
import argparse
import os
import resource
import socket
import statistics
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
from daemon_fixture import Daemon  # noqa: E402
from bench_engine import initialize  # noqa: E402

from engined_client import EngineClient  # noqa: E402

CHUNK = 4 << 20


def raw_tcp(nbytes, src=None):
    """GB/s of nbytes over a loopback TCP connection: one 4 MiB chunk sent
    again and again, or src's bytes."""
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
    data = memoryview(bytes(CHUNK)) if src is None else memoryview(src)
    t0 = time.perf_counter()
    sent = 0
    while sent < nbytes:
        s.sendall(data if src is None else data[sent:sent + CHUNK])
        sent += CHUNK
    t.join()
    el = time.perf_counter() - t0
    s.close()
    srv.close()
    return got[0] / el / 1e9


def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def stream(c, dtype):
    t0, c0 = time.perf_counter(), cpu_s()
    n = sum(a.nbytes for _, a in c.stream_weights(dtype=dtype))
    return n / (time.perf_counter() - t0) / 1e9, n, (cpu_s() - c0) / (n / 1e9)


def grpc_ceiling(c):
    """The bf16 stream's messages as grpcio hands them over (bytes)."""
    from engined_client.client import SERVICE, param_request
    f = c.channel.unary_stream(SERVICE + "GetPerTensorParam",
                               request_serializer=lambda m: m.SerializeToString(),
                               response_deserializer=lambda b: b)
    t0, c0 = time.perf_counter(), cpu_s()
    n = sum(len(m) for m in f(param_request("bfloat16", None, 0)))
    return n / (time.perf_counter() - t0) / 1e9, n, (cpu_s() - c0) / (n / 1e9)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen2.5-0.5b-shape")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--raw-gib", type=float, default=1.0)
    ap.add_argument("--matmul", choices=("f32", "bf16"), default="f32")
    a = ap.parse_args()
    raw_bytes = int(a.raw_gib * (1 << 30)) // CHUNK * CHUNK
    src = np.arange(raw_bytes // 8, dtype=np.uint64).view(np.uint8)
    d = Daemon()
    try:
        c = EngineClient(d.addr, timeout=3600)
        initialize(c, a.preset, a.matmul)
        kinds = ("float32", "bfloat16", "grpc")
        rates = {k: [] for k in ("raw", "rawmem") + kinds}
        cpus = {k: [] for k in kinds}
        sizes = {}
        for _ in range(a.reps):
            rates["raw"].append(raw_tcp(raw_bytes))
            rates["rawmem"].append(raw_tcp(raw_bytes, src))
            for k in kinds:
                r, sizes[k], cpu = stream(c, k) if k != "grpc" else grpc_ceiling(c)
                rates[k].append(r)
                cpus[k].append(cpu)
        med = {k: statistics.median(v) for k, v in rates.items()}
        print("preset %s, %d reps (all: %s)" % (
            a.preset, a.reps, {k: ["%.2f" % x for x in v] for k, v in rates.items()}))
        print("matmuls %s" % a.matmul)
        print("raw TCP (Python sockets)      %6.2f GB/s" % med["raw"])
        print("raw TCP from memory           %6.2f GB/s" % med["rawmem"])
        for k in kinds:
            label = "grpcio, bf16 bytes" if k == "grpc" else "stream_weights %s" % k
            print("%-24s %5.2f GB %6.2f GB/s %5.2f CPU-s/GB  %3.0f%% of raw TCP, %3.0f%% from"
                  " memory%s" % (label, sizes[k] / 1e9, med[k], statistics.median(cpus[k]),
                                 100 * med[k] / med["raw"], 100 * med[k] / med["rawmem"],
                                 " (goal >= 70%)" if k != "grpc" else ""))
        print("stream_weights bfloat16 = %.0f%% of what grpcio delivers in the same run"
              % (100 * med["bfloat16"] / med["grpc"]))
    finally:
        d.stop()


if __name__ == "__main__":
    main()
