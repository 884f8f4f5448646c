"""test_parity.py — the native engine against the torch reference.

Usage: build/venv-pypi/bin/python test_parity.py PATH/TO/parity_driver [--keep DIR] [--only NAME]
       build/venv-pypi/bin/python test_parity.py --floor     (torch fp32 vs fp64 only, no engine)
       /usr/bin/python3 test_parity.py --selftest  (the comparison flags injected defects)
The runs that write and read safetensors files need the PyPI `safetensors`
package (build/venv-pypi, made by tests/integration/setup_venv.sh with
--system-site-packages, so Debian's torch and numpy are the ones used);
--selftest needs only torch and numpy.

For each case below it writes a model directory (HF config.json + fp32
model.safetensors, seeded weights from ref_model.init_params), a packed batch
with upstream gradients, and case.json; runs parity_driver (the engine, fp32,
CPU) on it; and compares with ref_model.py run in float64 from the same fp32
weights. Cases: llama (untied, GQA 4/2), llama with llama3 rope_scaling
(tied, MHA), qwen2 (q/k/v bias, tied, GQA 4/2), qwen3 (q/k norm,
head_dim 32 != C/H = 16), a value model on qwen2, mistral (GQA 4/1).
Every case packs sequences of lengths 130, 1, 37 and 64 (130 crosses
attention tiles of 64 or 128 keys; 1 has no prediction at all) in a shuffled
order, at temperature 0.7, with a micro-batch budget of 160 tokens (so at
least two micro-batches), and then takes 3 AdamW steps with gradient
clipping at half the initial gradient norm (so every step clips).

Tolerances (fp32 engine vs float64 reference):
  log_probs, entropy, values   max abs error <= 1e-4
  loss (sum g*output)          abs error / sum |g*output| <= 1e-5
  each parameter gradient      max abs error / max abs of the reference
                               gradient of that tensor <= 1e-4
  grad_norm of each step       relative error <= 1e-5
  parameters after 3 steps     max abs error <= 1e-5   (lr 1e-3)
The column "floor" is the same metric for the reference run in torch
float32 (what a correct fp32 implementation achieves); it is printed for
context and is not a pass criterion.

Adam and the parameter tolerance: the first Adam update of an element is
lr * g / (|g| + eps), which turns the sign of a near-zero gradient into a
full lr-sized step; an fp32 gradient error can flip that sign for elements
whose gradient is at fp32 noise level (with eps 1e-4 the torch-fp32 floor
alone is 1.5e-5). eps is therefore 1e-2, against gradient elements of
typical size ~1 (max ~20): updates stay Adam-normalized, noise-level
elements move smoothly (floor ~6e-7), and because eps is not negligible
the parameters also show whether clipping was applied (leaving it out moves
them by 5e-4, weight decay left out by 1.3e-3).

The table of every compared quantity is always printed (worst element);
the exit status is 1 on any mismatch.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ref_model  # noqa: E402


# --- safetensors files, through the PyPI `safetensors` package -------------
# The reference implementation, independent of the engine's reader and
# writer (engines/io). Imported in the functions, so that --selftest and the
# modules importing this one run without it.

def save_st(path, tensors, metadata=None):
    """Write {name: ndarray} to path with safetensors.numpy.save_file (the
    reference order: by dtype, then name). Arrays are made C-contiguous
    first: save_file writes a non-contiguous array (a transpose) in its
    memory order, not its logical one (safetensors 0.8.0)."""
    from safetensors.numpy import save_file
    meta = {str(k): str(v) for k, v in (metadata or {}).items()}
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, path,
              metadata=meta or None)


def load_st(path):
    """({name: ndarray}, __metadata__ dict) of a safetensors file.

    bf16: numpy has no bfloat16 dtype, so safetensors.numpy's load_file and
    safe_open(framework="numpy").get_tensor raise TypeError on a BF16
    tensor. Those tensors (found by their dtype in the header, get_slice)
    are read with framework="pt" instead, which works with Debian's torch
    1.13 and PyPI safetensors 0.8.0 (checked), and come back as their raw
    bits (uint16 ndarray), as the Python client returns bf16 without
    ml_dtypes. Everything else is read with framework="numpy". The engine's
    results files hold only F32 today."""
    from safetensors import safe_open
    out, bf16 = {}, []
    with safe_open(path, framework="numpy") as f:
        meta = dict(f.metadata() or {})
        for k in f.keys():
            if f.get_slice(k).get_dtype() == "BF16":
                bf16.append(k)
            else:
                out[k] = np.array(f.get_tensor(k))
    if bf16:
        with safe_open(path, framework="pt") as f:
            for k in bf16:
                out[k] = f.get_tensor(k).view(torch.int16).numpy().view(np.uint16).copy()
    return out, meta

SEQ_LENS = [130, 1, 37, 64]
TEMPERATURE = 0.7
MICRO_BATCH_TOKENS = 160
STEPS = 3
OPTIM = dict(lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-2, weight_decay=0.1)

TOL_OUT = 1e-4
TOL_LOSS = 1e-5
TOL_GRAD = 1e-4
TOL_NORM = 1e-5
TOL_PARAM = 1e-5

BASE = dict(vocab_size=300, hidden_size=64, intermediate_size=128,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=2048, hidden_act="silu", torch_dtype="float32",
            initializer_range=0.02)

CASES = [
    ("llama_untied_gqa", "language_model",
     dict(BASE, model_type="llama", architectures=["LlamaForCausalLM"],
          rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False)),
    ("llama3_rope_tied_mha", "language_model",
     dict(BASE, model_type="llama", architectures=["LlamaForCausalLM"],
          num_key_value_heads=4, rms_norm_eps=1e-5, rope_theta=500000.0,
          tie_word_embeddings=True,
          rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                            high_freq_factor=4.0, original_max_position_embeddings=256))),
    ("qwen2_bias_tied", "language_model",
     dict(BASE, model_type="qwen2", architectures=["Qwen2ForCausalLM"],
          rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
          use_sliding_window=False)),
    ("qwen3_qknorm_headdim_bias", "language_model",
     dict(BASE, model_type="qwen3", architectures=["Qwen3ForCausalLM"],
          head_dim=32, attention_bias=True, rms_norm_eps=1e-6,
          rope_theta=1000000.0, tie_word_embeddings=False)),
    ("qwen2_value_model", "value_model",
     dict(BASE, model_type="qwen2", architectures=["Qwen2ForTokenClassification"],
          num_labels=1, rms_norm_eps=1e-6, rope_theta=1000000.0,
          tie_word_embeddings=True, use_sliding_window=False)),
    ("mistral_gqa4to1", "language_model",
     dict(BASE, model_type="mistral", architectures=["MistralForCausalLM"],
          num_key_value_heads=1, rms_norm_eps=1e-5, rope_theta=10000.0,
          tie_word_embeddings=False, sliding_window=None)),
]


def make_batch(cfg, seed):
    g = np.random.default_rng(seed)
    lens = list(SEQ_LENS)
    g.shuffle(lens)
    n = sum(lens)
    return dict(input_ids=g.integers(0, cfg.V, size=n), seq_lens=lens,
                g_logp=g.standard_normal(n).astype(np.float32),
                g_ent=(0.5 * g.standard_normal(n)).astype(np.float32),
                g_val=g.standard_normal(n).astype(np.float32))


CLIP_FACTOR = 0.5


def reference_run(cfg, params, vm, batch, clip, dtype):
    """Outputs and grads at the initial weights, then STEPS AdamW steps.
    clip: the max grad norm; "auto" = CLIP_FACTOR times the first step's
    norm (recorded in r["clip"]); None = no clipping. Returns a dict of
    numpy float64 arrays / lists."""
    m = ref_model.RefModel(cfg, params, vm, dtype)
    opt = torch.optim.AdamW(m.parameters(), lr=OPTIM["lr"],
                            betas=(OPTIM["beta1"], OPTIM["beta2"]),
                            eps=OPTIM["eps"], weight_decay=OPTIM["weight_decay"])
    r = {"grad_norms": []}
    for i in range(STEPS):
        m.zero_grad()
        lp, ent, val = m.forward(batch["input_ids"], batch["seq_lens"], TEMPERATURE)
        gt = lambda a: torch.as_tensor(a).to(dtype)
        if vm:
            loss = (gt(batch["g_val"]) * val).sum()
        else:
            loss = (gt(batch["g_logp"]) * lp).sum() + (gt(batch["g_ent"]) * ent).sum()
        loss.backward()
        if i == 0:
            r["loss"] = loss.item()
            # Scale for the loss comparison: the sum cancels, so compare
            # against sum |g * out| rather than |sum|.
            with torch.no_grad():
                if vm:
                    r["loss_scale"] = (gt(batch["g_val"]) * val).abs().sum().item()
                else:
                    r["loss_scale"] = ((gt(batch["g_logp"]) * lp).abs().sum() +
                                       (gt(batch["g_ent"]) * ent).abs().sum()).item()
            if vm:
                r["values"] = val.detach().double().numpy()
            else:
                r["log_probs"] = lp.detach().double().numpy()
                r["entropy"] = ent.detach().double().numpy()
            r["grad"] = {k: v.grad.detach().double().numpy().copy() for k, v in m.p.items()}
        if clip == "auto":
            with torch.no_grad():
                clip = CLIP_FACTOR * float(torch.sqrt(sum((q.grad ** 2).sum()
                                                          for q in m.parameters())))
        norm = torch.nn.utils.clip_grad_norm_(m.parameters(), clip if clip else float("inf"))
        r["grad_norms"].append(float(norm))
        opt.step()
    r["clip"] = clip
    r["param"] = {k: v.detach().double().numpy().copy() for k, v in m.p.items()}
    return r


def make_case(model_type, hf, seed):
    cfg = ref_model.Config(hf)
    vm = model_type == "value_model"
    params = ref_model.init_params(cfg, vm, seed)
    batch = make_batch(cfg, seed + 1000)
    return cfg, params, vm, batch


def write_case(d, name, model_type, hf, seed):
    cfg, params, vm, batch = make_case(model_type, hf, seed)
    os.makedirs(os.path.join(d, "model"), exist_ok=True)
    with open(os.path.join(d, "model", "config.json"), "w") as f:
        json.dump(hf, f, indent=2)
    save_st(os.path.join(d, "model", "model.safetensors"), params,
            metadata={"format": "pt"})
    save_st(os.path.join(d, "batch.safetensors"), {
        "input_ids": np.asarray(batch["input_ids"], dtype=np.float32),
        "seq_lens": np.asarray(batch["seq_lens"], dtype=np.float32),
        "g_logp": batch["g_logp"], "g_ent": batch["g_ent"], "g_val": batch["g_val"]})
    return cfg, params, vm, batch


# Cases run with a tiny LM-head logits tile: 256 floats give one row per
# tile and two vocabulary chunks (300 = 256 + 44), so the online softmax
# across chunks and the per-chunk backward are compared with torch too.
LM_TILE_FLOATS = {"llama_untied_gqa": 256, "qwen3_qknorm_headdim_bias": 700}
# The training forward keeps the tiles for the backward (the engine's
# default, every other case); this case recomputes them there instead.
LM_CACHE_FLOATS = {"qwen3_qknorm_headdim_bias": -1}


def write_case_json(d, name, model_type, clip):
    case = dict(model_type=model_type, temperature=TEMPERATURE, clip_grad=clip,
                max_tokens_per_micro_batch=MICRO_BATCH_TOKENS, steps=STEPS,
                threads=2, **OPTIM)
    if name in LM_TILE_FLOATS:
        case["lm_tile_floats"] = LM_TILE_FLOATS[name]
    if name in LM_CACHE_FLOATS:
        case["lm_cache_floats"] = LM_CACHE_FLOATS[name]
    with open(os.path.join(d, "case.json"), "w") as f:
        json.dump(case, f, indent=2)


class Table:
    def __init__(self):
        self.rows = []
        self.failed = []

    def add(self, case, qty, where, err, metric, tol, floor=None, ok=None):
        if ok is None:
            ok = bool(err <= tol)
        self.rows.append((case, qty, where, err, metric, tol, floor, ok))
        if not ok:
            self.failed.append((case, qty, where))

    def show(self):
        hdr = "%-22s %-12s %-48s %10s %-10s %8s %10s  %s" % (
            "case", "quantity", "worst at", "error", "metric", "tol", "floor", "")
        print(hdr)
        print("-" * len(hdr))
        for case, qty, where, err, metric, tol, floor, ok in self.rows:
            fl = "%10.2e" % floor if floor is not None else "%10s" % "-"
            print("%-22s %-12s %-48s %10.2e %-10s %8.0e %s  %s" % (
                case, qty, where[:48], err, metric, tol, fl, "ok" if ok else "FAIL"))


def max_abs(a, b):
    d = np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64))
    i = int(np.argmax(d)) if d.size else 0
    return (float(d.max()) if d.size else 0.0), i


def add_failing(tab, name, qty, bad, metric, tol, show=6):
    """Rows for the worst failing tensors (the rest are counted)."""
    bad.sort(key=lambda x: -x[0])
    for err, where, fl in bad[:show]:
        tab.add(name, qty, where, err, metric, tol, fl)
    if len(bad) > show:
        tab.add(name, qty, "... and %d more tensors" % (len(bad) - show), bad[show][0],
                metric, tol, ok=False)


def compare(tab, name, vm, batch, ref, eng, floor_run):
    """eng: {tensor name: array} from results.safetensors plus 'meta'.
    ref: a reference_run result; the number of steps is that of
    ref["grad_norms"], and ref["loss_scale"] None leaves the loss to the
    caller (the PPO cases compare it with the loss library's metrics)."""
    steps = len(ref["grad_norms"])
    seq_of = []
    for s, n in enumerate(batch["seq_lens"]):
        seq_of += [(s, t) for t in range(n)]
    outs = ["values"] if vm else ["log_probs", "entropy"]
    for q in outs:
        if q not in eng:
            tab.add(name, q, "missing from results", float("inf"), "abs", TOL_OUT, ok=False)
            continue
        err, i = max_abs(eng[q], ref[q])
        fl = max_abs(floor_run[q], ref[q])[0] if floor_run else None
        s, t = seq_of[i]
        tab.add(name, q, "token %d (seq %d len %d, pos %d)" % (i, s, batch["seq_lens"][s], t),
                err, "abs", TOL_OUT, fl)
    meta = eng["meta"]
    loss = float(meta.get("loss", "nan"))
    if ref.get("loss_scale") is not None:
        tab.add(name, "loss", "sum g*out = %.6g (sum |g*out| = %.4g)"
                % (ref["loss"], ref["loss_scale"]),
                abs(loss - ref["loss"]) / ref["loss_scale"], "rel", TOL_LOSS)
    mbs = [int(x) for x in meta.get("num_micro_batches", "0").split(",") if x]
    tab.add(name, "micro_batch", "num_micro_batches %s" % mbs, 0.0, "-", 0,
            ok=bool(mbs) and min(mbs) >= 2)
    # Parameter names
    enames = set(k[5:] for k in eng if k.startswith("grad/"))
    rnames = set(ref["grad"])
    if enames != rnames:
        tab.add(name, "names", "missing %s extra %s" % (sorted(rnames - enames)[:2],
                                                        sorted(enames - rnames)[:2]),
                float("inf"), "-", 0, ok=False)
    # Gradients: worst tensor by relative max-abs error.
    worst = (-1.0, "", None)
    bad = []
    for k in sorted(rnames & enames):
        r = ref["grad"][k]
        e = eng["grad/" + k].reshape(r.shape)
        err, i = max_abs(e, r)
        scale = float(np.abs(r).max())
        rel = err / scale if scale > 0 else err
        fl = None
        if floor_run:
            fe = max_abs(floor_run["grad"][k], r)[0]
            fl = fe / scale if scale > 0 else fe
        if rel > TOL_GRAD:
            bad.append((rel, "%s%s" % (k, list(np.unravel_index(i, r.shape))), fl))
        if rel > worst[0]:
            worst = (rel, "%s %s" % (k, list(np.unravel_index(i, r.shape))), fl)
    add_failing(tab, name, "grad", bad, "rel-max", TOL_GRAD)
    tab.add(name, "grad(worst)", worst[1], worst[0], "rel-max", TOL_GRAD, worst[2],
            ok=0 <= worst[0] <= TOL_GRAD)
    norms = [float(x) for x in meta.get("grad_norms", "").split(",") if x]
    if len(norms) != len(ref["grad_norms"]):
        tab.add(name, "grad_norm", "got %d norms" % len(norms), float("inf"), "rel", TOL_NORM,
                ok=False)
    else:
        errs = [abs(a - b) / b for a, b in zip(norms, ref["grad_norms"])]
        j = int(np.argmax(errs))
        tab.add(name, "grad_norm", "step %d: %.6g" % (j + 1, ref["grad_norms"][j]),
                errs[j], "rel", TOL_NORM)
    skipped = [int(x) for x in meta.get("skipped", "").split(",") if x]
    lrs = [float(x) for x in meta.get("lrs", "").split(",") if x]
    tab.add(name, "steps", "skipped %s lrs %s" % (skipped, ["%g" % x for x in lrs]), 0.0, "-", 0,
            ok=(skipped == [0] * steps and len(lrs) == steps and
                all(abs(x - OPTIM["lr"]) <= 1e-12 for x in lrs)))
    worst = (-1.0, "", None)
    bad = []
    for k in sorted(rnames & set(k[6:] for k in eng if k.startswith("param/"))):
        r = ref["param"][k]
        e = eng["param/" + k].reshape(r.shape)
        err, i = max_abs(e, r)
        fl = max_abs(floor_run["param"][k], r)[0] if floor_run else None
        if err > TOL_PARAM:
            bad.append((err, "%s%s" % (k, list(np.unravel_index(i, r.shape))), fl))
        if err > worst[0]:
            worst = (err, "%s %s" % (k, list(np.unravel_index(i, r.shape))), fl)
    add_failing(tab, name, "param", bad, "abs", TOL_PARAM)
    tab.add(name, "param(worst)", worst[1], worst[0], "abs", TOL_PARAM, worst[2],
            ok=0 <= worst[0] <= TOL_PARAM)


def as_results(run):
    """A reference run dressed as parity_driver's results (for --floor and
    --selftest)."""
    out = {k: run[k] for k in ("log_probs", "entropy", "values") if k in run}
    out["meta"] = {"loss": repr(run["loss"]), "num_micro_batches": "2,2,2",
                   "grad_norms": ",".join(repr(x) for x in run["grad_norms"]),
                   "skipped": ",".join("0" for _ in range(STEPS)),
                   "lrs": ",".join(repr(OPTIM["lr"]) for _ in range(STEPS))}
    for k in run["grad"]:
        out["grad/" + k] = run["grad"][k]
        out["param/" + k] = run["param"][k]
    return out


def selftest(root):
    """The comparison must pass torch-fp32 results and fail each of a few
    small, realistic defects injected into them."""
    name, model_type, hf = CASES[0]
    cfg, params, vm, batch = make_case(model_type, hf, 100)   # no files needed
    ref = reference_run(cfg, params, vm, batch, "auto", torch.float64)
    f32 = reference_run(cfg, params, vm, batch, ref["clip"], torch.float32)
    noclip = reference_run(cfg, params, vm, batch, None, torch.float32)
    mutants = [("fp32 torch (must pass)", lambda r: None, False)]

    def bump_logp(r):
        r["log_probs"] = r["log_probs"].copy()
        r["log_probs"][100] += 3e-4

    def scale_grad(r):
        k = "grad/model.layers.1.self_attn.k_proj.weight"
        r[k] = r[k] * (1 + 2e-4)

    def no_clip(r):
        for k in noclip["param"]:
            r["param/" + k] = noclip["param"][k]

    def entropy_at_start(r):
        r["entropy"] = r["entropy"].copy()
        r["entropy"][0] = 1e-3

    def one_micro_batch(r):
        r["meta"]["num_micro_batches"] = "1,1,1"

    mutants += [("log-prob off by 3e-4", bump_logp, True),
                ("one grad tensor scaled by 1+2e-4", scale_grad, True),
                ("steps without clipping", no_clip, True),
                ("entropy 1e-3 at a sequence start", entropy_at_start, True),
                ("single micro-batch", one_micro_batch, True)]
    bad = []
    for what, mutate, must_fail in mutants:
        r = as_results(f32)
        mutate(r)
        tab = Table()
        compare(tab, name, vm, batch, ref, r, None)
        caught = bool(tab.failed)
        print("selftest: %-36s %s" % (what, "flagged" if caught else "passed"))
        if caught != must_fail:
            bad.append(what)
            tab.show()
    if bad:
        print("SELFTEST FAILED: %s" % bad)
        return 1
    print("selftest: comparison passes fp32 torch and flags every injected defect")
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("driver", nargs="?")
    ap.add_argument("--keep", help="write cases into this directory and keep them")
    ap.add_argument("--only", help="run only cases whose name contains this")
    ap.add_argument("--floor", action="store_true",
                    help="compare torch fp32 with fp64 only (no engine)")
    ap.add_argument("--selftest", action="store_true",
                    help="check that the comparison flags injected defects (no engine)")
    a = ap.parse_args()
    if not a.driver and not (a.floor or a.selftest):
        ap.error("driver path required")
    root = a.keep or tempfile.mkdtemp(prefix="parity-")
    if a.selftest:
        try:
            return selftest(root)
        finally:
            if not a.keep:
                shutil.rmtree(root, ignore_errors=True)
    tab = Table()
    try:
        for seed, (name, model_type, hf) in enumerate(CASES):
            if a.only and a.only not in name:
                continue
            d = os.path.join(root, name)
            cfg, params, vm, batch = write_case(d, name, model_type, hf, 100 + seed)
            ref = reference_run(cfg, params, vm, batch, "auto", torch.float64)
            clip = ref["clip"]
            write_case_json(d, name, model_type, clip)
            floor = reference_run(cfg, params, vm, batch, clip, torch.float32)
            if not all(n > clip for n in ref["grad_norms"]):
                tab.add(name, "clip", "reference norms %s vs clip %g" % (ref["grad_norms"], clip),
                        0.0, "-", 0, ok=False)
            if a.floor:
                compare(tab, name, vm, batch, ref, as_results(floor), None)
                continue
            p = subprocess.run([a.driver, d], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               timeout=300)
            if p.returncode != 0:
                tab.add(name, "driver", p.stdout.decode(errors="replace").strip()[-200:],
                        float("inf"), "-", 0, ok=False)
                print(p.stdout.decode(errors="replace"))
                continue
            res, meta = load_st(os.path.join(d, "results.safetensors"))
            res["meta"] = meta
            compare(tab, name, vm, batch, ref, res, floor)
    finally:
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)
    tab.show()
    if tab.failed:
        print("\nFAILED: %d comparison(s) out of tolerance: %s" % (len(tab.failed), tab.failed))
        return 1
    print("\nparity: all quantities within tolerance")
    return 0


if __name__ == "__main__":
    sys.exit(main())
