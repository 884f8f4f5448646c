"""bench_tinker.py — the Tinker gateway's cost (issue 29), in one run
(docs/PERF.md): one training step (forward_backward with cross_entropy,
then optim_step) through the unchanged tinker SDK and engined-tinker,
against the same step through engined's own Python client on the same
daemon, at two batch sizes. Reports the median step time of each path,
the overhead per step (SDK - client) and per MB of the forward_backward
body (the slope between the two sizes). The model is tiny (one layer,
hidden 16) so that the engine's compute does not hide the cost.

Run with the verl venv's python (the SDK, starlette, uvicorn):
  ENGINED_BIN=build/daemon/engined PYTHONPATH=tests/integration:tests/tinker \\
    build/venv-verl/bin/python tests/bench/bench_tinker.py [--rounds R]
Last line: JSON."""
import argparse
import json
import statistics
import time
import warnings

import numpy as np

warnings.simplefilter("ignore", FutureWarning)
import tinker  # noqa: E402
from tinker import types  # noqa: E402

import gateway_fixture as gf  # noqa: E402
from engined_client import EngineClient  # noqa: E402

ADAM = dict(learning_rate=1e-4, beta1=0.9, beta2=0.95, eps=1e-12, weight_decay=0.0,
            grad_clip_norm=0.0)


def batch(n_datums, length, seed=0):
    rng = np.random.default_rng(seed)
    seqs = rng.integers(3, 96, size=(n_datums, length + 1))
    return seqs[:, :-1].astype(np.int32), seqs[:, 1:].astype(np.int32)


def body_mb(tokens, targets):
    """The forward_backward body's size: int32 tokens, int64 targets,
    float32 weights (the SDK's encoding), in MB."""
    return tokens.size * (4 + 8 + 4) / 1e6


def sdk_step(tc, tokens, targets):
    data = [types.Datum(model_input=types.ModelInput.from_ints(t.tolist()),
                        loss_fn_inputs={"target_tokens": y.astype(np.int64),
                                        "weights": np.ones(len(t), np.float32)})
            for t, y in zip(tokens, targets)]
    t0 = time.perf_counter()
    fb = tc.forward_backward(data, "cross_entropy")
    st = tc.optim_step(types.AdamParams(**ADAM))
    fb.result()
    st.result()
    return time.perf_counter() - t0


def client_step(c, adapter, tokens, targets):
    n, L = tokens.shape
    ids = np.concatenate([tokens, targets[:, -1:]], axis=1).reshape(-1)
    tgt = np.concatenate([np.zeros((n, 1), np.int32), targets], axis=1).reshape(-1)
    w = np.concatenate([np.zeros((n, 1), np.float32), np.ones((n, L), np.float32)],
                       axis=1).reshape(-1)
    t0 = time.perf_counter()
    c.forward_backward(ids, [L + 1] * n, loss="cross_entropy", target_ids=tgt,
                       token_weights=w, return_log_probs=True, adapter=adapter)
    c.optimizer_step(adapter=adapter, lr=1e-4, beta1=0.9, beta2=0.95, eps=1e-12,
                     weight_decay=0.0, clip_grad=0.0)
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=21)
    args = ap.parse_args()
    daemons, _, gw = gf.start(n_daemons=1, extra=["--log-level", "warning"], hidden=16,
                              layers=1, max_positions=1024)
    out = {}
    try:
        sc = tinker.ServiceClient(base_url=gw.url, api_key=gf.KEY)
        tc = sc.create_lora_training_client(base_model=gf.MODEL, rank=8, seed=1).result()
        c = EngineClient(daemons[0].addr, timeout=600)
        c.create_adapter("bench", rank=8, alpha=32.0, seed=1,
                         target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                         "gate_proj", "up_proj", "down_proj"])
        sizes = [(8, 64), (64, 512)]
        for n, L in sizes:
            tokens, targets = batch(n, L)
            sdk_step(tc, tokens, targets)  # warm-up
            client_step(c, "bench", tokens, targets)
            s, d = [], []
            for _ in range(args.rounds):  # interleaved: both see the same machine
                s.append(sdk_step(tc, tokens, targets))
                d.append(client_step(c, "bench", tokens, targets))
            ms, md = statistics.median(s), statistics.median(d)
            mb = body_mb(tokens, targets)
            out["%dx%d" % (n, L)] = {"sdk_s": ms, "client_s": md, "ratio": ms / md,
                                      "overhead_s": ms - md, "body_mb": mb}
            print("batch %3d x %4d tokens (%.2f MB): SDK+gateway %.1f ms, engined client "
                  "%.1f ms: ratio %.2fx, overhead %.1f ms a step"
                  % (n, L, mb, ms * 1e3, md * 1e3, ms / md, (ms - md) * 1e3), flush=True)
        a, b = (out["%dx%d" % s] for s in sizes)
        per_mb = (b["overhead_s"] - a["overhead_s"]) / (b["body_mb"] - a["body_mb"])
        out["overhead_per_mb_s"] = per_mb
        out["overhead_fixed_s"] = a["overhead_s"] - per_mb * a["body_mb"]
        print("gateway overhead: %.1f ms a step + %.1f ms per MB of forward_backward body"
              % (out["overhead_fixed_s"] * 1e3, per_mb * 1e3))
        c.close()
    finally:
        gw.stop()
        for d in daemons:
            d.stop()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
