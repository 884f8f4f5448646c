"""torch_train.py — the torch 1.13 peer of bench_train: same model shape,
same work, 2 threads, fp32.

Usage: /usr/bin/python3 tests/bench/torch_train.py [--steps N] [--tokens T]
       [--layers L] [--vocab V] [--threads K]

Model: the Qwen2.5-0.5B shape (vocab 151936, hidden 896, intermediate 4864,
24 layers, 14 heads / 2 kv heads, q/k/v bias, tied embeddings, rope_theta
1e6), random init (normal, std 0.02; norms 1), built with the parity
suite's torch reference (tests/parity/ref_model.py) in float32.

Training step: forward over 1 x T tokens, log-probs and entropy of every
position (temperature 1), loss = -mean(log-probs) (the SFT loss), backward,
torch.nn.utils.clip_grad_norm_(1.0), torch.optim.AdamW step, zero grads.
Forward-only: the same forward under torch.no_grad() (log-probs + entropy).
One warm-up of each, then N timed repetitions; prints the medians and one
JSON line.
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "parity"))
import ref_model  # noqa: E402

QWEN25_05B = dict(model_type="qwen2", vocab_size=151936, hidden_size=896,
                  intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=1000000.0,
                  tie_word_embeddings=True)


def blas_info():
    """Which BLAS this torch uses (Debian's torch goes through libblas.so.3:
    netlib's reference BLAS unless OpenBLAS is installed) and, for OpenBLAS,
    the kernel it picked: OpenBLAS 0.3.21 does not know recent Xeons and
    falls back to 'Prescott' (~3x slower) unless OPENBLAS_CORETYPE says
    otherwise. Reported so that a handicapped peer is visible; nothing is
    changed here."""
    import ctypes
    torch.mm(torch.ones(2, 2), torch.ones(2, 2))  # make sure BLAS is loaded
    libs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            p = line.split()[-1]
            if "blas" in p or "mkl" in p:
                libs.add(p)
    info = {"blas_libs": sorted(libs)}
    for p in libs:
        if "openblas" in p:
            try:
                lib = ctypes.CDLL(p)
                lib.openblas_get_corename.restype = ctypes.c_char_p
                info["openblas_core"] = lib.openblas_get_corename().decode()
            except (OSError, AttributeError):
                pass
    info["openblas_coretype_env"] = os.environ.get("OPENBLAS_CORETYPE", "")
    return info


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--layers", type=int, default=None, help="override (smoke tests)")
    ap.add_argument("--vocab", type=int, default=None, help="override (smoke tests)")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    hf = dict(QWEN25_05B)
    if a.layers:
        hf["num_hidden_layers"] = a.layers
    if a.vocab:
        hf["vocab_size"] = a.vocab
    cfg = ref_model.Config(hf)
    torch.manual_seed(0)
    params = {}
    for name, shape in ref_model.param_shapes(cfg).items():
        if name.endswith("norm.weight"):
            params[name] = torch.ones(shape)
        else:
            params[name] = torch.randn(shape) * 0.02
    m = ref_model.RefModel(cfg, params, False, torch.float32, copy=False)
    del params
    n_params = sum(p.numel() for p in m.parameters())
    opt = torch.optim.AdamW(m.parameters(), lr=1e-5, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.01)
    ids = torch.randint(0, cfg.V, (a.tokens,))
    lens = [a.tokens]

    def train_step():
        lp, ent, _ = m.forward(ids, lens, 1.0)
        loss = -lp.sum() / a.tokens
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        m.zero_grad()

    def forward_only():
        with torch.no_grad():
            m.forward(ids, lens, 1.0)

    res = {"bench": "torch_train", "threads": a.threads, "tokens": a.tokens,
           "steps": a.steps, "n_params": n_params, "torch": torch.__version__}
    res.update(blas_info())
    print("torch %s, BLAS %s, OpenBLAS core %s" % (torch.__version__, res["blas_libs"],
                                                  res.get("openblas_core", "-")), flush=True)
    for key, fn in (("train", train_step), ("fwd", forward_only)):
        fn()  # warm-up (allocates Adam state on the first step)
        ts = []
        for _ in range(a.steps):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        med = statistics.median(ts)
        res[key + "_step_s_median"] = med
        res[key + "_tokens_per_s"] = a.tokens / med
        print("torch %-5s: median %.3f s/step over %d steps, %.1f tokens/s" %
              (key, med, a.steps, a.tokens / med), flush=True)
    res["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps(res))


if __name__ == "__main__":
    main()
