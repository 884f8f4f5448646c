"""bench_sample.py — generation (issue 28) against its limits and its
peer, in one run (docs/PERF.md):

  decode: tokens/s at batch 1, 8 and 64 of engined's Sample (a daemon,
    the Qwen2.5-0.5B shape, fp32, random weights) against
    - the memory-bandwidth limit: the bytes a decode step must read (every
      weight once, and each sequence's cached keys and values) over the
      copy bandwidth measured here (torch's copy_ of 1 GiB, reads and
      writes counted as STREAM counts them, on the same threads; the best
      of the measures taken before and after each engined batch size);
    - transformers' generate() (do_sample, KV cache) on the same shape with
      the same threads (PyPI torch);
  prefill: a prompt through Sample (max_tokens 1) against a forward-only
    ForwardBackward of the same tokens.
A decode step's time is (t(1 + S new tokens) - t(1)) / S for both, the
median of R rounds. Goals (issue 28): batch-1 decode >= 70% of the limit;
batch 64 >= 10x the tokens/s of batch 1; ahead of transformers at every
batch size.

BENCH_OMP_WAIT=active runs the daemon with OMP_WAIT_POLICY=active instead
of the passive policy engined sets for itself (see README, "threads").
Run with the verl venv's python (torch 2.x, transformers):
  PYTHONPATH=client/python:build/client/python:tests/integration \\
    build/venv-verl/bin/python tests/bench/bench_sample.py [--layers L] [--steps S]
Last line: JSON.
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np


def qwen_shape(layers, vocab):
    return {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
            "vocab_size": vocab, "hidden_size": 896, "intermediate_size": 4864,
            "num_hidden_layers": layers, "num_attention_heads": 14,
            "num_key_value_heads": 2, "max_position_embeddings": 32768,
            "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": True,
            "use_sliding_window": False, "torch_dtype": "float32"}


def median_time(fn, rounds):
    fn()   # warm-up
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def copy_bandwidth(torch):
    """Bytes read and written a second by torch's copy_ of 1 GiB (STREAM's
    count), the best of 10: the machines are shared, and the best is the
    strictest limit."""
    a = torch.ones(256 << 20)
    b = torch.empty_like(a)
    best = 1e30
    for _ in range(10):
        t0 = time.perf_counter()
        b.copy_(a)
        best = min(best, time.perf_counter() - t0)
    return 2 * a.numel() * 4 / best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--context", type=int, default=32, help="decode prompts' length")
    ap.add_argument("--prompt", type=int, default=512, help="prefill length")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--engined", default=os.environ.get("ENGINED_BIN", "build/daemon/engined"))
    a = ap.parse_args()

    import torch
    import transformers
    from daemon_fixture import Daemon
    from engined_client import EngineClient

    torch.set_num_threads(a.threads)
    cfg = qwen_shape(a.layers, a.vocab)
    batches = [int(x) for x in a.batches.split(",")]
    rng = np.random.default_rng(0)
    ids = rng.integers(0, a.vocab, max(batches) * a.context + a.prompt).astype(np.int32)
    kv_per_pos = 2 * a.layers * 2 * 64 * 4       # k and v, 2 kv heads x 64, fp32

    bws = [copy_bandwidth(torch)]
    d = Daemon("--threads", str(a.threads), bin_path=a.engined,
               env={"OMP_WAIT_POLICY": os.environ["BENCH_OMP_WAIT"]} if os.environ.get("BENCH_OMP_WAIT") else None)
    out = {}
    try:
        c = EngineClient(d.addr, timeout=3600)
        c.initialize(hf_config_json=json.dumps(cfg), seed=1,
                     kv_cache_bytes=4 << 30)
        n_params = c.get_status().num_parameters
        weight_bytes = 4 * n_params

        def eng(batch, new):
            return lambda: c.sample(ids[:batch * a.context], [a.context] * batch,
                                    max_tokens=new, seed=3)

        for b in batches:
            t1 = median_time(eng(b, 1), a.rounds)
            ts = median_time(eng(b, 1 + a.steps), a.rounds)
            out[("engined", b)] = (ts - t1) / a.steps
            bws.append(copy_bandwidth(torch))
        pre_ids = ids[:a.prompt]
        t_pre = median_time(lambda: c.sample(pre_ids, [a.prompt], max_tokens=1), a.rounds)
        t_fwd = median_time(lambda: c.forward_backward(pre_ids, [a.prompt], forward_only=True,
                                                       return_log_probs=True), a.rounds)
        c.close()
    finally:
        d.stop()

    bw = max(bws)   # measured before and after each engined batch size
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.Qwen2Config(**{k: v for k, v in cfg.items()
                                    if k not in ("architectures", "model_type")}),
        dtype=torch.float32).eval()

    def hf(batch, new):
        x = torch.as_tensor(ids[:batch * a.context].reshape(batch, a.context), dtype=torch.long)

        def run():
            with torch.no_grad():
                model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new,
                               min_new_tokens=new, do_sample=True, top_k=0, pad_token_id=0)
        return run

    for b in batches:
        t1 = median_time(hf(b, 1), a.rounds)
        ts = median_time(hf(b, 1 + a.steps), a.rounds)
        out[("transformers", b)] = (ts - t1) / a.steps

    print("Qwen2.5-0.5B shape, %d layers, vocab %d: %.1f M parameters (%.2f GB fp32); "
          "%d threads; copy bandwidth %.1f GB/s" % (a.layers, a.vocab, n_params / 1e6,
                                                   weight_bytes / 1e9, a.threads, bw / 1e9))
    res = {"copy_GBps": bw / 1e9}
    base = None
    for b in batches:
        step = out[("engined", b)]
        ctx = a.context + a.steps / 2.0
        limit = (weight_bytes + b * ctx * kv_per_pos) / bw
        tps, hf_tps = b / step, b / out[("transformers", b)]
        base = base or tps
        print("decode batch %2d: %8.1f tokens/s (%.1f ms a step) = %.2f of the bandwidth "
              "limit (%.1f ms), %.1fx batch 1; transformers %.1f tokens/s -> %.2fx"
              % (b, tps, step * 1e3, limit / step, limit * 1e3, tps / base, hf_tps,
                 tps / hf_tps))
        res["decode%d_tps" % b] = tps
        res["decode%d_vs_limit" % b] = limit / step
        res["decode%d_vs_transformers" % b] = tps / hf_tps
    print("prefill %d tokens: %.1f tokens/s; forward-only ForwardBackward %.1f tokens/s "
          "-> %.2fx" % (a.prompt, a.prompt / t_pre, a.prompt / t_fwd, t_fwd / t_pre))
    res["prefill_vs_forward"] = t_fwd / t_pre
    print(json.dumps(res))


if __name__ == "__main__":
    sys.exit(main())
