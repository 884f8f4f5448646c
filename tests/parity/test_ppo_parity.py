"""test_ppo_parity.py — a PPO step through the engine against torch.

Usage: build/venv-pypi/bin/python test_ppo_parity.py PATH/TO/parity_driver [--keep DIR]
(safetensors files through the PyPI `safetensors` package: test_parity.py's
save_st / load_st)

End to end (issue 3): parity_driver runs the native CPU engine (fp32) with
the loss library as its loss, driven as the daemon drives it (loss spec ->
loss_engine_ctx -> loss_engine_fn per micro-batch); the reference is
ref_model.py in float64 with the same loss computed by the loss library's
own torch reference (tests/loss/loss_ref.py: objective(), imported, not
restated), backpropagated by autograd, then torch.optim.AdamW after
torch.nn.utils.clip_grad_norm_.

Each case: a language model of the parity suite (seeded fp32 weights), the
parity batch (sequences of 130, 1, 37, 64 tokens, shuffled, temperature 0.7,
micro-batch budget 160 tokens: >= 2 micro-batches; the 1-token sequence is
fully masked), and a request as an RL trainer sends it:
  loss_mask      0 on each sequence's prompt (first quarter, at least the
                 first token) and on ~5% random holes, else 1;
  old_log_probs  the model's own log-probs (float64 reference at the initial
                 weights) minus x, x drawn per token from bands around the
                 clip boundaries: |x| <= 0.07 (unclipped), beyond
                 log(1 + eps_high) or log(1 - eps_low) (clipped high / low),
                 beyond log(clip_ratio_c) (dual clip), each >= 0.02 from a
                 boundary, so that fp32 versus float64 log-probs (~1e-5
                 apart) cannot change a token's branch;
  ref_log_probs  own log-probs + N(0, 0.3);
  advantages     per sequence N(0, 1) + per token N(0, 0.5).
Loss: ppo, policy_loss vanilla, clip_ratio_low 0.1, clip_ratio_high 0.15,
clip_ratio_c 1.3, entropy_coeff 0.05, kl_coef 0.2 with kl_type low_var_kl
(k3), loss_agg_mode token-mean (llama, untied GQA) or seq-mean-token-mean
(qwen2, biases, tied). Two (STEPS) forward_backward calls, each followed by
an AdamW step with clipping at half the first gradient norm (every step
clips).

The torch reference counts, at every call, the masked tokens in each branch
of the vanilla loss (loss_ref's counters: unclipped, clipped high with
A > 0, clipped low with A < 0, dual clip) and the test fails unless each is
reached, and unless every masked token's log-ratio stays >= MIN_MARGIN from
the boundary of its branch (so that comparing clip fractions exactly is
well posed). The first Adam step moves every parameter by ~lr and the
log-ratios by O(0.1-0.5), so the second call sees other tokens in each
branch (and larger clip fractions): both calls are compared.

Compared (fp32 engine against float64 torch; worst element printed):
  log_probs, entropy           max abs error <= 1e-4   (as test_parity.py)
  each parameter gradient (call 1)  rel-max <= 1e-4    (as test_parity.py)
  grad_norm of each step       relative <= 1e-5        (as test_parity.py)
  parameters after the steps   max abs <= 1e-5         (as test_parity.py)
  loss (the reply's, loss_engine_ctx_result's ret_loss, and the "loss"
  metric) and the real-valued metrics (pg_loss, ppo_kl, entropy, kl_loss)
  of every call                abs <= TOL_METRIC = 1e-5
  pg_clipfrac, pg_clipfrac_lower, num_tokens, num_sequences of every call
                               exact (abs <= 1e-12: counts over the same
                               tokens, ratios in double on both sides)
Optimizer: lr 1e-3, betas (0.9, 0.95), weight_decay 0.1 and eps EPS_PPO
(see the comment there).

The same engine results are then compared with deliberately wrong
references (entropy bonus or KL term with the wrong sign, no dual clip,
another clip_ratio_high, the other aggregation mode, steps without gradient
clipping) and each must be flagged: a comparison that cannot fail is a
defect.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "loss"))
import ref_model  # noqa: E402
import test_parity as tp  # noqa: E402
import loss_ref  # noqa: E402

STEPS = 2
# Adam's eps against the gradient scale: the PPO loss is a token mean, so
# its gradient elements are ~100x smaller than those of the parity suite's
# sum loss (measured: median 0.004-0.008, max 0.16-0.8, against ~1 and ~20
# there, where eps is 1e-2). EPS_PPO keeps about the same ratio: updates
# stay Adam-normalized for elements of typical size, and elements at fp32
# noise level move smoothly instead of by a full lr-sized step (the
# torch-fp32 floor of the parameters is ~5e-7, as in the parity suite).
EPS_PPO = 1e-4
OPTIM = dict(tp.OPTIM, eps=EPS_PPO)
# Loss and real-valued metrics are token means (or means of sequence means)
# of per-token quantities that the engine gets to ~1e-5 (log-probs; 1e-4 is
# their tolerance) times coefficients O(1): 1e-5 abs (measured <= 3e-6).
TOL_METRIC = 1e-5
TOL_COUNT = 1e-12
# The smallest allowed distance of a token's log-ratio from its branch
# boundary at any call: 100x the engine's measured log-prob error.
MIN_MARGIN = 1e-3

CLIP_LOW, CLIP_HIGH, CLIP_C = 0.1, 0.15, 1.3
REQ_ARRAYS = ["loss_mask", "old_log_probs", "ref_log_probs", "advantages"]
EXACT_METRICS = ("pg_clipfrac", "pg_clipfrac_lower", "num_tokens", "num_sequences")
SHORT = {"pg_clipfrac_lower": "clipfrac_low", "num_sequences": "num_seqs"}


def loss_options(agg):
    return [("policy_loss", "vanilla"), ("clip_ratio_low", repr(CLIP_LOW)),
            ("clip_ratio_high", repr(CLIP_HIGH)), ("clip_ratio_c", repr(CLIP_C)),
            ("entropy_coeff", "0.05"), ("kl_coef", "0.2"), ("kl_type", "low_var_kl"),
            ("loss_agg_mode", agg)]


# (name, parity model case, aggregation mode)
CASES = [
    ("ppo_llama_token_mean", "llama_untied_gqa", "token-mean"),
    ("ppo_qwen2_seq_mean_token_mean", "qwen2_bias_tied", "seq-mean-token-mean"),
]

BRANCHES = ["vanilla: unclipped", "vanilla: clipped high (A > 0)",
            "vanilla: clipped low (A < 0)", "vanilla: dual clip"]


def make_request(cfg, params, seed):
    """The parity batch plus the PPO request arrays (float32)."""
    g = np.random.default_rng(seed)
    lens = list(tp.SEQ_LENS)
    g.shuffle(lens)
    n = sum(lens)
    ids = g.integers(0, cfg.V, size=n)
    m = ref_model.RefModel(cfg, params, False, torch.float64)
    with torch.no_grad():
        lp0 = m.forward(ids, lens, tp.TEMPERATURE)[0].numpy()
    starts = np.cumsum([0] + lens[:-1])
    mask = np.ones(n)
    for s, L in zip(starts, lens):
        mask[s:s + max(1, L // 4)] = 0.0
    mask[g.random(n) < 0.05] = 0.0
    adv = np.repeat(g.standard_normal(len(lens)), lens) + 0.5 * g.standard_normal(n)
    # x = logp - old_logp by band (see the top of the file): u < 0.5
    # unclipped; then clipped high (A > 0), clipped low (A < 0), dual clip
    # (A < 0); the sign of A is set to match the band.
    lo_b, hi_b, c_b = math.log(1 - CLIP_LOW), math.log(1 + CLIP_HIGH), math.log(CLIP_C)
    u = g.random(n)
    x = g.uniform(-0.07, 0.07, n)
    band = np.where(u < 0.5, 0, np.where(u < 0.7, 1, np.where(u < 0.85, 2, 3)))
    x = np.where(band == 1, g.uniform(hi_b + 0.02, c_b + 0.1, n), x)
    x = np.where(band == 2, g.uniform(lo_b - 0.15, lo_b - 0.02, n), x)
    x = np.where(band == 3, g.uniform(c_b + 0.02, c_b + 0.2, n), x)
    adv = np.where(band == 1, np.abs(adv) + 0.05, adv)
    adv = np.where(band >= 2, -np.abs(adv) - 0.05, adv)
    return dict(input_ids=ids, seq_lens=lens,
                loss_mask=mask.astype(np.float32),
                old_log_probs=(lp0 - x).astype(np.float32),
                ref_log_probs=(lp0 + 0.3 * g.standard_normal(n)).astype(np.float32),
                advantages=adv.astype(np.float32))


def branch_margin(lp, batch):
    """Smallest distance, over masked tokens, of x = logp - old from a
    boundary of its vanilla branch: log(1 + eps_high) for A > 0,
    log(1 - eps_low) and log(clip_ratio_c) for A < 0."""
    x = lp.detach().double().numpy() - batch["old_log_probs"].astype(np.float64)
    a = batch["advantages"]
    live = batch["loss_mask"] > 0
    d = np.full(x.shape, np.inf)
    pos, neg = live & (a > 0), live & (a < 0)
    d[pos] = np.abs(x[pos] - math.log(1 + CLIP_HIGH))
    d[neg] = np.minimum(np.abs(x[neg] - math.log(1 - CLIP_LOW)),
                        np.abs(x[neg] - math.log(CLIP_C)))
    return float(d.min())


def ppo_reference(cfg, params, batch, options, clip, dtype):
    """STEPS AdamW steps on the PPO loss. clip as tp.reference_run. Returns
    the dict tp.compare reads plus per-call "losses", "metrics",
    "branches" (loss_ref's branch counts) and "margin"."""
    m = ref_model.RefModel(cfg, params, False, dtype)
    opt = torch.optim.AdamW(m.parameters(), lr=OPTIM["lr"],
                            betas=(OPTIM["beta1"], OPTIM["beta2"]),
                            eps=OPTIM["eps"], weight_decay=OPTIM["weight_decay"])
    spec = loss_ref.spec_of("ppo", options)
    req = {k: torch.as_tensor(batch[k]).double() for k in REQ_ARRAYS}
    r = {"grad_norms": [], "losses": [], "metrics": [], "branches": [], "margin": [],
         "loss_scale": None}
    for i in range(STEPS):
        m.zero_grad()
        lp, ent, _ = m.forward(batch["input_ids"], batch["seq_lens"], tp.TEMPERATURE)
        loss_ref.COVER.clear()
        loss, met = loss_ref.objective(batch["seq_lens"], dict(req, log_probs=lp, entropy=ent),
                                       spec)
        r["branches"].append({k: loss_ref.COVER.get(k, 0) for k in BRANCHES})
        r["margin"].append(branch_margin(lp, batch))
        r["losses"].append(loss.item())
        r["metrics"].append(met)
        loss.backward()
        if i == 0:
            r["loss"] = loss.item()
            r["log_probs"] = lp.detach().double().numpy()
            r["entropy"] = ent.detach().double().numpy()
            r["grad"] = {k: v.grad.detach().double().numpy().copy() for k, v in m.p.items()}
        if clip == "auto":
            with torch.no_grad():
                clip = tp.CLIP_FACTOR * float(torch.sqrt(sum((q.grad ** 2).sum()
                                                             for q in m.parameters())))
        norm = torch.nn.utils.clip_grad_norm_(m.parameters(), clip if clip else float("inf"))
        r["grad_norms"].append(float(norm))
        opt.step()
    r["clip"] = clip
    r["param"] = {k: v.detach().double().numpy().copy() for k, v in m.p.items()}
    return r


def write_case(d, hf, params, batch, options, clip):
    os.makedirs(os.path.join(d, "model"), exist_ok=True)
    with open(os.path.join(d, "model", "config.json"), "w") as f:
        json.dump(hf, f, indent=2)
    tp.save_st(os.path.join(d, "model", "model.safetensors"), params, metadata={"format": "pt"})
    arrays = {"input_ids": np.asarray(batch["input_ids"], dtype=np.float32),
              "seq_lens": np.asarray(batch["seq_lens"], dtype=np.float32)}
    arrays.update({k: batch[k] for k in REQ_ARRAYS})
    tp.save_st(os.path.join(d, "batch.safetensors"), arrays)
    case = dict(model_type="language_model", temperature=tp.TEMPERATURE, clip_grad=clip,
                max_tokens_per_micro_batch=tp.MICRO_BATCH_TOKENS, steps=STEPS, threads=2,
                loss=dict(name="ppo", options=[[k, v] for k, v in options]), **OPTIM)
    with open(os.path.join(d, "case.json"), "w") as f:
        json.dump(case, f, indent=2)


def compare_ppo(tab, name, batch, ref, eng, floor):
    """tp.compare (outputs, gradients, norms, parameters) plus the loss
    library's loss and metrics of every call."""
    tp.compare(tab, name, False, batch, ref, eng, floor)  # its lr check: the same lr
    meta = eng["meta"]
    losses = [float(v) for v in meta.get("losses", "").split(",") if v]
    if len(losses) != STEPS:
        tab.add(name, "loss(reply)", "got %d losses" % len(losses), float("inf"), "abs",
                TOL_METRIC, ok=False)
    else:
        errs = [abs(a - b) for a, b in zip(losses, ref["losses"])]
        j = int(np.argmax(errs))
        tab.add(name, "loss(reply)", "call %d: %.6g" % (j + 1, ref["losses"][j]), errs[j],
                "abs", TOL_METRIC, floor and abs(floor["losses"][j] - ref["losses"][j]))
    keys = sorted(ref["metrics"][0])
    got = sorted(k[7:] for k in meta if k.startswith("metric/"))
    if got != keys:
        tab.add(name, "metric set", "engine %s, reference %s" % (got, keys), float("inf"),
                "-", 0, ok=False)
    for k in keys:
        tol = TOL_COUNT if k in EXACT_METRICS else TOL_METRIC
        vals = [float(v) for v in meta.get("metric/" + k, "").split(",") if v]
        if len(vals) != STEPS:
            tab.add(name, k, "got %d values" % len(vals), float("inf"), "abs", tol, ok=False)
            continue
        errs = [abs(a - r[k]) for a, r in zip(vals, ref["metrics"])]
        j = int(np.argmax(errs))
        fl = abs(floor["metrics"][j][k] - ref["metrics"][j][k]) if floor else None
        tab.add(name, SHORT.get(k, k), "call %d: %.6g" % (j + 1, ref["metrics"][j][k]), errs[j], "abs",
                tol, fl)


def check_design(tab, name, ref):
    """The case reaches every branch and no token sits on a boundary."""
    for i, b in enumerate(ref["branches"]):
        missing = [k for k in BRANCHES if b[k] == 0]
        tab.add(name, "branches", "call %d: unclipped %d high %d low %d dual %d"
                % ((i + 1,) + tuple(b[k] for k in BRANCHES)), 0.0, "-", 0, ok=not missing)
    j = int(np.argmin(ref["margin"]))
    tab.add(name, "margin", "call %d: min |x - boundary| (must be >= %g)" % (j + 1, MIN_MARGIN),
            ref["margin"][j], ">=", MIN_MARGIN, ok=ref["margin"][j] >= MIN_MARGIN)
    if not all(nm > ref["clip"] for nm in ref["grad_norms"]):
        tab.add(name, "clip", "reference norms %s vs clip %g" % (ref["grad_norms"], ref["clip"]),
                0.0, "-", 0, ok=False)


def mutants(agg):
    """Wrong references, each of which the comparison must flag: (what,
    options, clip override or None)."""
    other = "token-mean" if agg != "token-mean" else "seq-mean-token-mean"
    base = loss_options(agg)

    def with_(**kw):
        return [(k, kw.get(k, v)) for k, v in base]

    return [("entropy bonus sign flipped", with_(entropy_coeff="-0.05"), None),
            ("KL term sign flipped", with_(kl_coef="-0.2"), None),
            ("no dual clip (clip_ratio_c 100)", with_(clip_ratio_c="100"), None),
            ("clip_ratio_high 0.16", with_(clip_ratio_high="0.16"), None),
            ("aggregation %s" % other, with_(loss_agg_mode=other), None),
            ("steps without gradient clipping", base, "none")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("driver")
    ap.add_argument("--keep", help="write cases into this directory and keep them")
    ap.add_argument("--no-mutants", action="store_true", help="skip the mutant check")
    a = ap.parse_args()
    root = a.keep or tempfile.mkdtemp(prefix="parity-ppo-")
    base = {n: (t, hf) for n, t, hf in tp.CASES}
    tab = tp.Table()
    undetected = []
    try:
        for seed, (name, model_case, agg) in enumerate(CASES):
            _, hf = base[model_case]
            cfg = ref_model.Config(hf)
            params = ref_model.init_params(cfg, False, 300 + seed)
            batch = make_request(cfg, params, 400 + seed)
            opts = loss_options(agg)
            ref = ppo_reference(cfg, params, batch, opts, "auto", torch.float64)
            floor = ppo_reference(cfg, params, batch, opts, ref["clip"], torch.float32)
            check_design(tab, name, ref)
            d = os.path.join(root, name)
            write_case(d, hf, params, batch, opts, ref["clip"])
            # Passive OpenMP waits: on a shared 2-core machine, spinning
            # worker threads made the 0.06 s driver run take seconds.
            env = dict(os.environ, OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY",
                                                                  "passive"))
            p = subprocess.run([a.driver, d], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               timeout=300, env=env)
            if p.returncode != 0:
                tab.add(name, "driver", p.stdout.decode(errors="replace").strip()[-200:],
                        float("inf"), "-", 0, ok=False)
                print(p.stdout.decode(errors="replace"))
                continue
            res, meta = tp.load_st(os.path.join(d, "results.safetensors"))
            res["meta"] = meta
            compare_ppo(tab, name, batch, ref, res, floor)
            if a.no_mutants:
                continue
            for what, mopts, mclip in mutants(agg):
                mref = ppo_reference(cfg, params, batch, mopts,
                                     None if mclip == "none" else ref["clip"], torch.float64)
                probe = tp.Table()
                compare_ppo(probe, name, batch, mref, res, None)
                qty = sorted(set(q for _, q, _ in probe.failed))
                print("mutant: %-30s %-34s %s" % (name, what, "flagged by " + ", ".join(qty)
                                                  if qty else "NOT FLAGGED"))
                if not probe.failed:
                    undetected.append((name, what))
    finally:
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)
    tab.show()
    if undetected:
        print("\nFAILED: wrong references not flagged: %s" % undetected)
        return 1
    if tab.failed:
        print("\nFAILED: %d comparison(s) out of tolerance: %s" % (len(tab.failed), tab.failed))
        return 1
    print("\nppo parity: all quantities within tolerance; every mutant flagged")
    return 0


if __name__ == "__main__":
    sys.exit(main())
