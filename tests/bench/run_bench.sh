#!/bin/sh
# run_bench.sh — the engine against torch 1.13 on the Qwen2.5-0.5B shape,
# in one run (the machines are shared and noisy: docs/PERF.md compares ratios
# measured together, never stored times).
#
# Usage: tests/bench/run_bench.sh [BUILD_DIR] [STEPS]      (defaults: build 3)
#
# Runs, one after the other (each needs ~8 GiB for params + grads + Adam):
#   bench_gemm (the fp32 FMA peak of these cores, measured now),
#   bench_train (fp32), bench_train --bf16, torch_train.py (fp32, 2 threads),
#   bench_train --seqs 8 --tokens 512 (a realistic RL step: 4096 tokens in
#   8 micro-batches per optimizer step, fp32; STEPS of them)
# and prints tokens/s, GFLOP/s, peak RSS and the ratios (the shares of the
# peak: each step against the FMA peak bench_train measures right before
# and after it, tests/bench/bench_peak.h; this VM's speed drifts too much
# over the run for one peak taken at its start):
#   engine fp32 / torch (training), engine forward-only / engine training,
#   engine bf16 / engine fp32 (training), engine / torch (forward-only).
# The environment is passed through unchanged (docs/PERF.md: do not change
# OPENBLAS_* here); torch's BLAS and OpenBLAS kernel are reported, because
# a torch on netlib BLAS or on OpenBLAS's "Prescott" fallback is a much
# slower peer than docs/PERF.md's.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}
steps=${2:-3}
bench="$build/tests/bench/bench_train"
[ -x "$bench" ] || { echo "run_bench.sh: $bench not built (ninja -C $build)" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

echo "== fp32 FMA peak of these cores, now (bench_gemm)"
"$build/tests/bench/bench_gemm" 2 256 | tee "$out/gemm.txt"
echo "== engine fp32"
"$bench" --steps "$steps" | tee "$out/fp32.txt"
echo "== engine bf16 matmul"
"$bench" --steps "$steps" --bf16 | tee "$out/bf16.txt"
echo "== torch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)') fp32"
/usr/bin/python3 "$here/torch_train.py" --steps "$steps" | tee "$out/torch.txt"
echo "== engine fp32, RL step: 8 x 512 tokens over 8 micro-batches"
"$bench" --steps "$steps" --seqs 8 --tokens 512 | tee "$out/rl.txt"

/usr/bin/python3 - "$out" <<'PY'
import json, sys, os
d = sys.argv[1]
def last_json(name):
    lines = [l for l in open(os.path.join(d, name)) if l.startswith("{")]
    return json.loads(lines[-1])
e, b, t = last_json("fp32.txt"), last_json("bf16.txt"), last_json("torch.txt")
rl = last_json("rl.txt")
import re
peak = float(re.search(r"FMA peak measured now: ([0-9.]+)", open(os.path.join(d, "gemm.txt")).read()).group(1))
print()
print("%-34s %12s %12s %12s" % ("", "engine fp32", "engine bf16", "torch fp32"))
print("%-34s %12.1f %12.1f %12.1f" % ("training tokens/s", e["train_tokens_per_s"],
      b["train_tokens_per_s"], t["train_tokens_per_s"]))
print("%-34s %12.1f %12.1f %12.1f" % ("forward-only tokens/s", e["fwd_tokens_per_s"],
      b["fwd_tokens_per_s"], t["fwd_tokens_per_s"]))
print("%-34s %12.1f %12.1f %12s" % ("training GFLOP/s", e["train_gflops"], b["train_gflops"], "-"))
print("%-34s %12.1f %12.1f %12s" % ("forward-only GFLOP/s", e["fwd_gflops"], b["fwd_gflops"], "-"))
print("%-34s %12.0f %12.0f %12.0f" % ("peak RSS MiB", e["peak_rss_mib"], b["peak_rss_mib"],
      t["peak_rss_mib"]))
print()
ratios = [
    ("engine fp32 / torch, training", e["train_tokens_per_s"] / t["train_tokens_per_s"], ">= 5"),
    ("engine fp32 / torch, forward-only", e["fwd_tokens_per_s"] / t["fwd_tokens_per_s"], "-"),
    ("forward-only / training (fp32)", e["fwd_tokens_per_s"] / e["train_tokens_per_s"], ">= 3"),
    ("bf16 / fp32 training", b["train_tokens_per_s"] / e["train_tokens_per_s"], ">= 1.8"),
    ("fp32 training, share of the FMA peak", e["train_peak_share"], ">= 0.65"),
    ("fp32 forward-only, share of the FMA peak", e["fwd_peak_share"], ">= 0.85"),
    ("fp32 RL step 8 x 512, share of the FMA peak", rl["train_peak_share"], ">= 0.75"),
    ("peak RSS / (params+grads+Adam)", e["peak_rss_mib"] / e["state_mib"], "<= 1.15 (+acts)"),
]
for name, r, goal in ratios:
    print("%-42s %8.2f   goal %s" % (name, r, goal))
print("(the three shares against bench_gemm's peak at the start, %.0f GFLOP/s: %.2f / %.2f / %.2f)"
      % (peak, e["train_gflops"] / peak, e["fwd_gflops"] / peak, rl["train_gflops"] / peak))
core = t.get("openblas_core")
if not core:
    print("\nWARNING: torch does not use OpenBLAS here (%s): the peer is far slower than "
          "docs/PERF.md's" % t.get("blas_libs"))
elif core == "Prescott":
    print("\nWARNING: OpenBLAS picked its generic 'Prescott' kernels for this CPU "
          "(docs/PERF.md's peer runs with OPENBLAS_CORETYPE=Haswell set in the environment)")
print(json.dumps({"engine_fp32": e, "engine_bf16": b, "torch": t, "engine_fp32_rl": rl,
                  "fma_peak_gflops": peak}))
PY
