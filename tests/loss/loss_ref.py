#!/usr/bin/python3
"""loss_ref.py — the loss library (engines/loss) against a torch autograd
reference.

Usage: /usr/bin/python3 loss_ref.py PATH/TO/loss_driver

The reference below is written from verl's definitions
(verl-project/verl 018f23b5f83a, verl/trainer/ppo/core_algos.py: agg_loss,
compute_policy_loss_{vanilla,gspo,sapo,gpg,clip_cov,kl_cov,geo_mean,cispo},
compute_value_loss, kl_penalty; verl/workers/utils/losses.py: ppo_loss) and
Tinker's loss docs (cross_entropy, importance_sampling, dro), in verl's
padded [batch, time] layout and in float64, with gradients from autograd. The
C library works on packed sequences in a different code path; the two meet
only in this comparison.

What is checked, for every loss, policy variant, KL kind and aggregation mode
on random inputs built to hit every branch (clipped high/low, dual clip,
A = 0, a fully masked sequence, |logp - old| beyond the ±20 clamp, k3's
clamps, value clipping both ways, empty entropy/KL terms):
  - the loss and every metric, including which are present (relative 1e-9:
        both sides compute in double from the same float32 inputs);
  - d_log_probs, d_entropy, d_values per token (float32 output: relative 1e-6
    per element, plus 1e-10 of the array's largest magnitude);
  - the engine adapter: the same batch split into 1, 2, 5 micro-batches and
    into 3 separate calls with global normalizers reproduces the full-batch
    reference;
  - spec errors name the field.
Branch coverage is counted and a branch never reached fails the run, and a
set of deliberately wrong references must be rejected by the comparator
(a comparison that cannot fail is a defect).

Importable: the parity suite (tests/parity/test_ppo_parity.py) computes its
PPO loss with objective() and spec_of() on the torch reference model's
outputs, so both suites use this one copy of the formulas. Importing sets
torch's default dtype to float64, as running it does.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

try:
    import torch
except ImportError:  # not Debian's python3 with python3-torch: skip
    print("loss_ref: torch is not importable by %s; skipping" % sys.executable)
    sys.exit(77)

torch.set_default_dtype(torch.float64)

RTOL_GRAD = 1e-6
ATOL_GRAD_REL_MAX = 1e-10
RTOL_VAL = 1e-9
ATOL_VAL = 1e-12

AGGS = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean",
        "seq-mean-token-sum-norm"]
VARIANTS = ["vanilla", "gspo", "cispo", "gpg", "sapo", "clip_cov", "kl_cov",
            "geo_mean", "importance_sampling"]
KLS = ["k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl", "k1+", "abs+", "k3+"]
BATCH_ARRAYS = ["loss_mask", "old_log_probs", "ref_log_probs", "advantages",
                "returns", "old_values", "is_weights", "token_weights"]

COVER = {}


def cover(key, count):
    COVER[key] = COVER.get(key, 0) + int(count)


# --------------------------------------------------------------------------
# spec (the defaults of engines/loss/loss_spec.c, restated)

def spec_of(name, options):
    s = dict(name=name, policy_loss="vanilla", loss_agg_mode="token-mean",
             clip_ratio=0.2, clip_ratio_low=None, clip_ratio_high=None,
             clip_ratio_c=3.0, entropy_coeff=0.0, kl_coef=0.0, kl_type="k3",
             cliprange_value=0.5, loss_scale_factor=None, global_num_tokens=None,
             global_batch_size=None, dp_size=1, clip_cov_ratio=0.0002,
             clip_cov_lb=1.0, clip_cov_ub=5.0, kl_cov_ratio=0.0002,
             ppo_kl_coef=0.1, tau_pos=1.0, tau_neg=1.05, beta=0.05)
    if name in ("cross_entropy", "dro"):
        s["loss_agg_mode"] = "token-sum"
    if name == "importance_sampling":
        s["name"] = "ppo"
        s["policy_loss"] = "importance_sampling"
        s["loss_agg_mode"] = "token-sum"
    alias = {"loss_mode": "policy_loss", "kl_loss_coef": "kl_coef",
             "kl_loss_type": "kl_type"}
    for k, v in options:
        k = alias.get(k, k)
        if k in ("policy_loss", "loss_agg_mode", "kl_type"):
            s[k] = v
        elif k in ("global_num_tokens", "global_batch_size", "dp_size"):
            s[k] = int(float(v))
        else:
            s[k] = float(v)
    if s["global_num_tokens"] == 0:
        s["global_num_tokens"] = None
    if s["global_batch_size"] == 0:
        s["global_batch_size"] = None
    return s


# --------------------------------------------------------------------------
# padded layout

class Padded:
    """Packed [n] tensors to verl's padded [B, T] layout and back."""

    def __init__(self, seq_lens):
        self.lens = list(seq_lens)
        self.B = len(self.lens)
        self.T = max(self.lens) if self.lens else 1
        idx = torch.zeros(self.B, self.T, dtype=torch.long)
        valid = torch.zeros(self.B, self.T, dtype=torch.bool)
        off = 0
        for i, L in enumerate(self.lens):
            idx[i, :L] = torch.arange(off, off + L)
            valid[i, :L] = True
            off += L
        self.idx, self.valid, self.n = idx, valid, off

    def pad(self, packed):
        return torch.where(self.valid, packed[self.idx], torch.zeros(()))

    def unpad(self, padded):
        return padded[self.valid]


def masked_mean(x, m):
    d = m.sum()
    return (x * m).sum() / d if d > 0 else torch.zeros(())


def agg(mat, m, mode, g):
    """verl agg_loss with explicit normalizers g (see loss.h)."""
    dp = g["dp"]
    if mode == "token-mean":
        return (mat * m).sum() / g["ntok"] * dp if g["ntok"] > 0 else torch.zeros(())
    if mode == "token-sum":
        return (mat * m).sum() * dp
    if mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm"):
        seq = (mat * m).sum(-1)
        smask = (m.sum(-1) > 0).double()
        if g["nseq"] <= 0:
            return torch.zeros(())
        loss = (seq * smask).sum() / g["nseq"] * dp
        if mode == "seq-mean-token-sum-norm":
            loss = loss / g["horizon"]
        return loss
    if mode == "seq-mean-token-mean":
        cnt = m.sum(-1)
        seq = (mat * m).sum(-1) / (cnt + 1e-8)
        smask = (cnt > 0).double()
        if g["nseq"] <= 0:
            return torch.zeros(())
        return (seq * smask).sum() / g["nseq"] * dp
    raise ValueError(mode)


def kl_penalty(lp, ref, kind):
    st = kind.endswith("+")
    base = kind[:-1] if st else kind
    d = lp - ref
    if base in ("k1", "kl"):
        v = d
    elif base == "abs":
        v = d.abs()
    elif base in ("k2", "mse"):
        v = 0.5 * d.square()
    elif base in ("k3", "low_var_kl"):
        kl = torch.clamp(ref - lp, min=-20, max=20)
        v = torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)
    else:
        raise ValueError(kind)
    if st and base not in ("k2", "mse"):
        back = 0.5 * d.square()
        v = back - back.detach() + v.detach()
    return v


# --------------------------------------------------------------------------
# the reference

def objective(seq_lens, packed, spec, norm=None, selected=None):
    """The loss of `spec` and its metrics on a packed batch.

    seq_lens: [S]; packed: {array name: float64 tensor [n]} with the model
    outputs (log_probs, entropy, values) and the request arrays present;
    outputs may carry autograd graphs (the parity suite passes ref_model's),
    so the returned loss backpropagates into whatever produced them.
    norm: {"tokens", "seqs", "horizon"} explicit normalizers (loss.h), absent
    or 0 = the batch's own counts. Returns (loss: 0-dim tensor, metrics:
    {name: float}); counts branches into COVER."""
    P = Padded(seq_lens)
    pad = {k: P.pad(v) for k, v in packed.items()}
    if "loss_mask" in pad:
        m = pad["loss_mask"]
    else:
        m = P.valid.double().clone()
        m[:, 0] = 0.0
    m = m * P.valid.double()
    norm = norm or {}
    own_tok = float(m.sum())
    own_seq = float((m.sum(-1) > 0).sum())
    g = dict(dp=spec["dp_size"],
             ntok=spec["global_num_tokens"] or (norm.get("tokens") or 0) or own_tok,
             nseq=spec["global_batch_size"] or (norm.get("seqs") or 0) or own_seq,
             horizon=spec["loss_scale_factor"] or (norm.get("horizon") or 0) or P.T)
    mode = spec["loss_agg_mode"]
    metrics = {}
    name = spec["name"]
    lo = spec["clip_ratio_low"] if spec["clip_ratio_low"] is not None else spec["clip_ratio"]
    hi = spec["clip_ratio_high"] if spec["clip_ratio_high"] is not None else spec["clip_ratio"]
    mb = m.bool()

    if name in ("sft", "cross_entropy"):
        w = pad.get("token_weights", torch.ones_like(m))
        loss = agg(-w * pad["log_probs"], m, mode, g)
    elif name == "dro":
        lp, old, A = pad["log_probs"], pad["old_log_probs"], pad["advantages"]
        obj = lp * A - 0.5 * spec["beta"] * (lp - old) ** 2
        loss = agg(-obj, m, mode, g)
    elif name == "value":
        v, R, ov = pad["values"], pad["returns"], pad["old_values"]
        e = spec["cliprange_value"]
        vc = torch.max(torch.min(v, ov + e), ov - e)
        vf1 = (v - R) ** 2
        vf2 = (vc - R) ** 2
        loss = 0.5 * agg(torch.max(vf1, vf2), m, mode, g)
        metrics["vf_loss"] = loss.item()
        metrics["vf_clipfrac"] = masked_mean((vf2 > vf1).double(), m).item()
        cover("value: clipped above", ((v > ov + e) & mb).sum())
        cover("value: clipped below", ((v < ov - e) & mb).sum())
        cover("value: clip wins", ((vf2 > vf1) & mb).sum())
    else:
        loss, pm = policy_reference(pad, m, spec, g, lo, hi, selected)
        metrics.update(pm)
        metrics["pg_loss"] = loss.item()
        if "entropy" in pad:
            ent = agg(pad["entropy"], m, mode, g)
            loss = loss - spec["entropy_coeff"] * ent
            metrics["entropy"] = ent.item()
        if "ref_log_probs" in pad:
            kl = agg(kl_penalty(pad["log_probs"], pad["ref_log_probs"], spec["kl_type"]),
                     m, mode, g)
            loss = loss + spec["kl_coef"] * kl
            metrics["kl_loss"] = kl.item()
            y = (pad["ref_log_probs"] - pad["log_probs"])
            cover("k3: |ref - logp| > 20", ((y.abs() > 20) & mb).sum())
            cover("k3: kld clamped at 10",
                  ((torch.exp(y.clamp(-20, 20)) - y.clamp(-20, 20) - 1 > 10) & mb).sum())
    metrics["loss"] = loss.item()
    metrics["num_tokens"] = own_tok
    metrics["num_sequences"] = float(P.B)
    cover("fully masked sequence", ((m.sum(-1) == 0) & (P.valid.sum(-1) > 0)).sum())
    return loss, metrics


def reference(case, spec, selected=None):
    """Loss, metrics and per-token gradients of a JSON case (lists of
    float32 values), the outputs being autograd leaves."""
    arr = {k: torch.tensor(v) for k, v in case["arrays"].items()}
    leaves = {}
    for k in ("log_probs", "entropy", "values"):
        if k in arr:
            leaves[k] = arr[k].clone().requires_grad_(True)
    packed = dict(arr)
    packed.update(leaves)
    loss, metrics = objective(case["seq_lens"], packed, spec, case.get("norm"), selected)
    if loss.requires_grad:
        loss.backward()
    out = {"loss": loss.item(), "metrics": metrics}
    n = sum(case["seq_lens"])
    for k, ok in (("log_probs", "d_log_probs"), ("entropy", "d_entropy"),
                  ("values", "d_values")):
        if k in leaves and leaves[k].grad is not None:
            out[ok] = leaves[k].grad.tolist()
        else:
            out[ok] = [0.0] * n
    return out


def policy_reference(pad, m, spec, g, lo, hi, selected):
    variant = spec["policy_loss"]
    lp, A = pad["log_probs"], pad["advantages"]
    old = pad.get("old_log_probs")
    isw = pad.get("is_weights")
    mode = spec["loss_agg_mode"]
    mb = m.bool()
    pm = {}
    if variant == "vanilla":
        nak = torch.clamp(lp - old, min=-20.0, max=20.0)
        ratio = torch.exp(nak)
        l1 = -A * ratio
        l2 = -A * torch.clamp(ratio, 1 - lo, 1 + hi)
        c1 = torch.maximum(l1, l2)
        l3 = -A * spec["clip_ratio_c"]
        c2 = torch.min(l3, c1)
        pg = torch.where(A < 0, c2, c1)
        pm["pg_clipfrac"] = masked_mean((l2 > l1).double(), m).item()
        pm["pg_clipfrac_lower"] = masked_mean(((c1 > l3) & (A < 0)).double(), m).item()
        pm["ppo_kl"] = masked_mean(-nak, m).item()
        x = lp - old
        cover("vanilla: clipped high (A > 0)", ((A > 0) & (ratio > 1 + hi) & mb).sum())
        cover("vanilla: clipped low (A < 0)", ((A < 0) & (ratio < 1 - lo) & mb).sum())
        cover("vanilla: dual clip", ((A < 0) & (c1 > l3) & mb).sum())
        cover("vanilla: A = 0", ((A == 0) & mb).sum())
        cover("vanilla: x > 20", ((x > 20) & mb).sum())
        cover("vanilla: x < -20", ((x < -20) & mb).sum())
        cover("vanilla: unclipped", ((l1 > l2) & mb).sum())
    elif variant == "gspo":
        nak = lp - old
        seq_len = m.sum(-1).clamp(min=1)
        nak_seq = (nak * m).sum(-1) / seq_len
        lsr = lp - lp.detach() + nak_seq.detach().unsqueeze(-1)
        lsr = torch.clamp(lsr, max=10.0)
        sr = torch.exp(lsr)
        l1 = -A * sr
        l2 = -A * torch.clamp(sr, 1 - lo, 1 + hi)
        pg = torch.maximum(l1, l2)
        mode = "seq-mean-token-mean"
        pm["pg_clipfrac"] = masked_mean((l2 > l1).double(), m).item()
        pm["pg_clipfrac_lower"] = 0.0
        pm["ppo_kl"] = masked_mean(-nak, m).item()
        cover("gspo: sequence log-ratio > 10", ((nak_seq > 10) & (m.sum(-1) > 0)).sum())
        cover("gspo: clipped", ((l2 > l1) & mb).sum())
    elif variant == "sapo":
        nak = torch.clamp(lp - old, min=-20.0, max=20.0)
        ratio = torch.exp(nak)
        taus = torch.where(A > 0, torch.tensor(spec["tau_pos"]), torch.tensor(spec["tau_neg"]))
        gates = torch.sigmoid(taus * (ratio - 1.0)) * (4.0 / taus)
        pg = -gates * A
        mode = "seq-mean-token-mean"
        pm["pg_clipfrac"] = 0.0
        pm["pg_clipfrac_lower"] = 0.0
        pm["ppo_kl"] = masked_mean(-nak, m).item()
        cover("sapo: A > 0", ((A > 0) & mb).sum())
        cover("sapo: A <= 0", ((A <= 0) & mb).sum())
    elif variant == "gpg":
        pg = -lp * A
    elif variant == "cispo":
        nak = torch.clamp(lp - old, min=-20.0, max=20.0)
        ratio = torch.exp(nak)
        cr = torch.clamp(ratio, 1 - lo, 1 + hi).detach()
        pg = -cr * A * lp
        pm["pg_clipfrac"] = masked_mean((ratio != cr).double(), m).item()
        pm["pg_clipfrac_lower"] = 0.0
        pm["ppo_kl"] = masked_mean(-nak, m).item()
        cover("cispo: clipped", ((ratio != cr) & mb).sum())
    elif variant == "importance_sampling":
        nak = torch.clamp(lp - old, min=-20.0, max=20.0)
        pg = -torch.exp(nak) * A
        pm["ppo_kl"] = masked_mean(-nak, m).item()
    elif variant == "clip_cov":
        nak = lp - old
        ratio = torch.exp(nak)
        l1 = -A * ratio
        l2 = -A * torch.clamp(ratio, 1 - lo, 1 + hi)
        clip_by_origin = (l2 > l1) & mb
        cov = (A - masked_mean(A, m)) * (lp - masked_mean(lp.detach(), m))
        cov = cov.detach().clone()
        cov[~mb] = -float("inf")
        cov[clip_by_origin] = -float("inf")
        clip_num = max(int(spec["clip_cov_ratio"] * m.sum().item()), 1)
        cand = (cov < spec["clip_cov_ub"]) & (cov > spec["clip_cov_lb"]) & mb
        sel = selected.bool()
        if bool((sel & ~cand).any()):
            raise RefError("clip_cov chose a token that is not a candidate")
        if int(sel.sum()) != min(clip_num, int(cand.sum())):
            raise RefError("clip_cov chose %d tokens, expected min(%d, %d)"
                           % (int(sel.sum()), clip_num, int(cand.sum())))
        cover("clip_cov: tokens chosen", sel.sum())
        cover("clip_cov: random choice (candidates > clip_num)", int(cand.sum()) > clip_num)
        corr = (~sel).double()
        pg = torch.maximum(l1, l2) * corr
        pm["pg_clipfrac"] = masked_mean((corr == 0).double(), m).item()
        pm["ppo_kl"] = masked_mean(-nak, m).item()
    elif variant == "kl_cov":
        nak = lp - old
        ratio = torch.exp(nak)
        pg = -A * ratio
        pg_kl = -A * ratio + spec["ppo_kl_coef"] * nak.abs()
        vA, vL = A[mb].detach(), lp[mb].detach()
        sel = torch.zeros_like(m, dtype=torch.bool)
        if vA.numel() > 0:
            cov = (vA - vA.mean()) * (vL - vL.mean())
            k = max(1, int(vA.numel() * spec["kl_cov_ratio"]))
            top = torch.topk(cov, k, largest=True).indices
            flat = torch.nonzero(mb.reshape(-1), as_tuple=True)[0][top]
            sel.view(-1)[flat] = True
        pg = torch.where(sel, pg_kl, pg)
        pm["ppo_kl"] = masked_mean(nak.abs(), m).item()
        cover("kl_cov: tokens penalized", sel.sum())
        if selected is not None and not torch.equal(selected.bool(), sel):
            raise RefError("kl_cov chose other tokens than torch.topk")
    elif variant == "geo_mean":
        nak = lp - old
        sgn = torch.sign(A)
        clamp = torch.clamp(nak, -lo, hi)
        kmin = sgn * torch.min(sgn * nak, sgn * clamp)
        msum = m.sum(-1)
        ratio = torch.exp((kmin * m).sum(-1) / (msum + 1e-8))
        abar = (A * m).sum(-1) / (msum + 1e-8)
        pgs = -abar * ratio
        if isw is not None:
            pgs = pgs * torch.exp((torch.log(isw + 1e-10) * m).sum(-1) / (msum + 1e-8))
        # verl: torch.mean(pgs). engined: sum / N_seq * dp_size (equal when no
        # sequence is fully masked; adds up over micro-batches).
        loss = pgs.sum() / g["nseq"] * g["dp"] if g["nseq"] > 0 else torch.zeros(())
        clipped = nak != clamp
        pm["pg_clipfrac"] = masked_mean((clipped & (A > 0)).double(), m).item()
        pm["pg_clipfrac_lower"] = masked_mean((clipped & (A < 0)).double(), m).item()
        pm["ppo_kl"] = masked_mean(-nak, m).item()
        cover("geo_mean: clipped (A > 0)", (clipped & (A > 0) & mb).sum())
        cover("geo_mean: clipped (A < 0)", (clipped & (A < 0) & mb).sum())
        cover("geo_mean: A = 0", ((A == 0) & mb).sum())
        return loss, pm
    else:
        raise ValueError(variant)
    if isw is not None:
        pg = pg * isw
    return agg(pg, m, mode, g), pm


class RefError(Exception):
    pass


# --------------------------------------------------------------------------
# random batches

def f32(a):
    return [float(v) for v in np.asarray(a, dtype=np.float32)]


def make_batch(rng, nseq=8, maxlen=11, adv_scale=1.0, kinds=("policy",)):
    lens = [int(v) for v in rng.integers(1, maxlen + 1, nseq)]
    lens[0] = max(lens[0], 6)
    n = sum(lens)
    starts = np.cumsum([0] + lens[:-1])
    mask = (rng.random(n) < 0.85).astype(np.float64)
    mask[starts] = 0.0
    # one fully masked sequence
    fm = int(rng.integers(1, nseq))
    mask[starts[fm]:starts[fm] + lens[fm]] = 0.0
    live = [t for t in range(n) if mask[t] == 1.0]
    logp = -rng.exponential(1.0, n)
    x = rng.normal(0.0, 0.35, n)
    # per-sequence advantages (GRPO-like) with token noise, some exact zeros
    seq_adv = rng.normal(0.0, 1.0, nseq) * adv_scale
    adv = np.repeat(seq_adv, lens) + rng.normal(0.0, 0.3, n) * adv_scale
    pick = rng.permutation(live)
    specials = {}
    # beyond the ±20 clamp, dual clip (A < 0, r > 3), A = 0, clipped high/low
    plan = [("x+", 2), ("x-", 2), ("dual", 3), ("a0", 3), ("hi", 3), ("lo", 3)]
    i = 0
    for tag, cnt in plan:
        for _ in range(cnt):
            if i < len(pick):
                specials[int(pick[i])] = tag
                i += 1
    for t, tag in specials.items():
        if tag == "x+":
            x[t] = 25.0
        elif tag == "x-":
            x[t] = -25.0
        elif tag == "dual":
            x[t] = 1.5
            adv[t] = -abs(adv[t]) - 0.1
        elif tag == "a0":
            adv[t] = 0.0
        elif tag == "hi":
            x[t] = 0.5
            adv[t] = abs(adv[t]) + 0.1
        elif tag == "lo":
            x[t] = -0.5
            adv[t] = -abs(adv[t]) - 0.1
    old = logp - x
    ref = logp + rng.normal(0.0, 0.5, n)
    for j, t in enumerate(pick[i:i + 4]):
        ref[t] = logp[t] + [25.0, -25.0, 3.0, -13.0][j]
    ov = rng.normal(0.0, 1.0, n)
    arrays = {
        "log_probs": f32(logp),
        "entropy": f32(rng.uniform(0.0, 3.0, n)),
        "loss_mask": f32(mask),
        "old_log_probs": f32(old),
        "ref_log_probs": f32(ref),
        "advantages": f32(adv),
        "returns": f32(rng.normal(0.0, 1.0, n)),
        "old_values": f32(ov),
        "values": f32(ov + rng.normal(0.0, 0.7, n)),
        "is_weights": f32(rng.uniform(0.5, 1.5, n)),
        "token_weights": f32(rng.normal(0.5, 1.0, n)),
    }
    return lens, arrays


def subset(arrays, keys):
    return {k: arrays[k] for k in keys if k in arrays}


POLICY_KEYS = ["log_probs", "entropy", "loss_mask", "old_log_probs", "ref_log_probs",
               "advantages"]


# --------------------------------------------------------------------------
# cases

def build_cases(rng):
    cases = []

    def add(cid, name, options, lens, arrays, **extra):
        c = {"id": cid, "name": name, "options": [[k, str(v)] for k, v in options],
             "seq_lens": lens, "arrays": arrays, "rng_seed": int(rng.integers(0, 2**31))}
        c.update(extra)
        cases.append(c)
        return c

    # every policy variant x every aggregation mode, entropy + KL on
    for v in VARIANTS:
        for a in AGGS:
            scale = 3.0 if v in ("clip_cov", "kl_cov") else 1.0
            lens, arrs = make_batch(rng, adv_scale=scale)
            opts = [("policy_loss", v), ("loss_agg_mode", a), ("entropy_coeff", 0.01),
                    ("kl_coef", 0.05), ("kl_type", KLS[len(cases) % len(KLS)])]
            if v == "clip_cov":
                opts.append(("clip_cov_ratio", 0.08))
            if v == "kl_cov":
                opts.append(("kl_cov_ratio", 0.1))
            if v == "gspo" and a == "token-mean":
                # sequence 0 far off-policy (x = 12 everywhere): s_0 > 10
                old = np.array(arrs["old_log_probs"])
                old[:lens[0]] = np.array(arrs["log_probs"])[:lens[0]] - 12.0
                arrs["old_log_probs"] = f32(old)
            add("pg-%s-%s" % (v, a), "ppo", opts, lens, subset(arrs, POLICY_KEYS))
    # same variants: is_weights, asymmetric clip, empty entropy/KL terms
    for v in VARIANTS:
        lens, arrs = make_batch(rng, adv_scale=3.0 if v in ("clip_cov", "kl_cov") else 1.0)
        opts = [("loss_mode", v), ("clip_ratio_low", 0.15), ("clip_ratio_high", 0.28),
                ("clip_ratio_c", 2.5), ("clip_cov_ratio", 0.05), ("kl_cov_ratio", 0.05)]
        add("pg-isw-%s" % v, "ppo", opts, lens,
            subset(arrs, ["log_probs", "loss_mask", "old_log_probs", "advantages",
                          "is_weights"]))
        lens, arrs = make_batch(rng)
        add("pg-empty-terms-%s" % v, "ppo",
            [("policy_loss", v), ("entropy_coeff", 0), ("kl_coef", 0)], lens,
            subset(arrs, ["log_probs", "entropy", "loss_mask", "old_log_probs",
                          "advantages"]))
    # every KL kind with every aggregation
    for k in KLS:
        for a in AGGS:
            lens, arrs = make_batch(rng)
            add("kl-%s-%s" % (k, a), "ppo",
                [("kl_loss_type", k), ("kl_loss_coef", 0.3), ("loss_agg_mode", a)],
                lens, subset(arrs, POLICY_KEYS))
    # kl_coef = 0 with ref given: metric only, no gradient
    lens, arrs = make_batch(rng)
    add("kl-metric-only", "ppo", [("kl_coef", 0)], lens, subset(arrs, POLICY_KEYS))
    # value, sft, cross_entropy, dro under every aggregation
    for a in AGGS:
        for e in (0.5, 0.2):
            lens, arrs = make_batch(rng)
            add("value-%s-%g" % (a, e), "value",
                [("loss_agg_mode", a), ("cliprange_value", e)], lens,
                subset(arrs, ["values", "loss_mask", "returns", "old_values"]))
        lens, arrs = make_batch(rng)
        add("sft-%s" % a, "sft", [("loss_agg_mode", a)], lens,
            subset(arrs, ["log_probs", "loss_mask"]))
        lens, arrs = make_batch(rng)
        add("ce-weights-%s" % a, "cross_entropy", [("loss_agg_mode", a)], lens,
            subset(arrs, ["log_probs", "loss_mask", "token_weights"]))
        lens, arrs = make_batch(rng)
        add("dro-%s" % a, "dro", [("loss_agg_mode", a), ("beta", 0.3)], lens,
            subset(arrs, ["log_probs", "loss_mask", "old_log_probs", "advantages"]))
    lens, arrs = make_batch(rng)
    add("is-tinker", "importance_sampling", [], lens,
        subset(arrs, ["log_probs", "loss_mask", "old_log_probs", "advantages"]))
    lens, arrs = make_batch(rng)
    add("sft-no-mask", "sft", [], lens, subset(arrs, ["log_probs"]))
    # explicit normalizers, global overrides, dp_size, loss_scale_factor
    for a in AGGS:
        lens, arrs = make_batch(rng)
        add("norm-batch-%s" % a, "ppo", [("loss_agg_mode", a)], lens,
            subset(arrs, POLICY_KEYS), norm={"tokens": 97.0, "seqs": 13.0, "horizon": 21.0})
        lens, arrs = make_batch(rng)
        add("norm-global-%s" % a, "ppo",
            [("loss_agg_mode", a), ("global_num_tokens", 333), ("global_batch_size", 40),
             ("dp_size", 4), ("loss_scale_factor", 64), ("entropy_coeff", 0.02),
             ("kl_coef", 0.1)],
            lens, subset(arrs, POLICY_KEYS), norm={"tokens": 97.0, "seqs": 13.0})
    for v in ("gspo", "sapo", "geo_mean"):
        lens, arrs = make_batch(rng)
        add("norm-global-%s" % v, "ppo",
            [("policy_loss", v), ("global_batch_size", 40), ("global_num_tokens", 300),
             ("dp_size", 2)], lens, subset(arrs, POLICY_KEYS))
    lens, arrs = make_batch(rng)
    add("value-global", "value",
        [("global_num_tokens", 500), ("dp_size", 3)], lens,
        subset(arrs, ["values", "loss_mask", "returns", "old_values"]))
    # everything masked: zero loss, zero gradients
    lens, arrs = make_batch(rng)
    arrs["loss_mask"] = [0.0] * len(arrs["loss_mask"])
    add("all-masked", "ppo", [("entropy_coeff", 0.1), ("kl_coef", 0.1)], lens,
        subset(arrs, POLICY_KEYS))
    return cases


def engine_cases(rng):
    """The same batch through the engine adapter, split several ways."""
    cases = []
    specs = [("ppo", [("policy_loss", v), ("loss_agg_mode", a), ("entropy_coeff", 0.01),
                      ("kl_coef", 0.05)])
             for v in ("vanilla", "gspo", "cispo", "gpg", "sapo", "geo_mean",
                       "importance_sampling")
             for a in AGGS]
    specs += [("value", [("loss_agg_mode", a)]) for a in AGGS]
    specs += [("sft", [("loss_agg_mode", a)]) for a in AGGS]
    specs += [("dro", [("loss_agg_mode", a)]) for a in AGGS]
    for si, (name, opts) in enumerate(specs):
        lens, arrs = make_batch(rng, nseq=10)
        keys = {"value": ["values", "loss_mask", "returns", "old_values"],
                "sft": ["log_probs", "loss_mask", "token_weights"],
                "dro": ["log_probs", "loss_mask", "old_log_probs", "advantages"]
                }.get(name, POLICY_KEYS + ["is_weights"])
        arrs = subset(arrs, keys)
        nseq = len(lens)
        order = [int(i) for i in rng.permutation(nseq)]

        def split(seqs, k):
            cuts = sorted(rng.choice(np.arange(1, len(seqs)), k - 1, replace=False))
            parts = np.split(np.array(seqs), cuts)
            return [sorted(int(s) for s in p) for p in parts]

        base = "%s-%d" % (name, si)
        for k in (1, 2, 5):
            cases.append({"id": "engine-%s-%dmb" % (base, k), "name": name,
                          "options": [[a, str(b)] for a, b in opts], "seq_lens": lens,
                          "arrays": arrs, "rng_seed": 7,
                          "calls": [split(order, k)]})
        # three calls with global normalization (horizon fixed as well)
        m = np.array(arrs["loss_mask"])
        starts = np.cumsum([0] + lens[:-1])
        ntok = int(m.sum())
        nsq = int(sum(m[s:s + L].sum() > 0 for s, L in zip(starts, lens)))
        gopts = opts + [("global_num_tokens", ntok), ("global_batch_size", nsq),
                        ("loss_scale_factor", max(lens))]
        calls = [[p] for p in split(order, 3)]
        calls[0] = split(calls[0][0], 2) if len(calls[0][0]) > 1 else calls[0]
        cases.append({"id": "engine-%s-3calls" % base, "name": name,
                      "options": [[a, str(b)] for a, b in gopts], "seq_lens": lens,
                      "arrays": arrs, "rng_seed": 7, "calls": calls})
    return cases


ERROR_CASES = [
    # (name, options, arrays, substring the message must contain)
    ("nonsense", [], ["log_probs"], "loss.name"),
    ("ppo", [("clip_ratio", "-0.1")], POLICY_KEYS, "clip_ratio"),
    ("ppo", [("clip_ratio_low", "-0.2")], POLICY_KEYS, "clip_ratio_low"),
    ("ppo", [("clip_ratio_high", "-1")], POLICY_KEYS, "clip_ratio_high"),
    ("ppo", [("clip_ratio_c", "0.9")], POLICY_KEYS, "clip_ratio_c"),
    ("ppo", [("no_such_option", "1")], POLICY_KEYS, "no_such_option"),
    ("ppo", [("clip_ratio", "abc")], POLICY_KEYS, "clip_ratio"),
    ("ppo", [("policy_loss", "reinforce")], POLICY_KEYS, "policy_loss"),
    ("ppo", [("loss_agg_mode", "token-median")], POLICY_KEYS, "loss_agg_mode"),
    ("ppo", [("kl_type", "k4")], POLICY_KEYS, "kl_type"),
    ("ppo", [], ["log_probs", "loss_mask", "old_log_probs"], "advantages"),
    ("ppo", [], ["log_probs", "loss_mask", "advantages"], "old_log_probs"),
    ("ppo", [("kl_coef", "0.1")], ["log_probs", "old_log_probs", "advantages"],
     "ref_log_probs"),
    ("ppo", [("entropy_coeff", "0.1")], ["log_probs", "old_log_probs", "advantages"],
     "entropy"),
    ("ppo", [("dp_size", "2")], POLICY_KEYS, "global_num_tokens"),
    ("ppo", [("dp_size", "2"), ("loss_agg_mode", "seq-mean-token-mean")], POLICY_KEYS,
     "global_batch_size"),
    ("ppo", [("global_num_tokens", "1.5")], POLICY_KEYS, "global_num_tokens"),
    ("ppo", [("policy_loss", "sapo"), ("tau_pos", "0")], POLICY_KEYS, "tau_pos"),
    ("ppo", [("policy_loss", "clip_cov"), ("clip_cov_ratio", "0")], POLICY_KEYS,
     "clip_cov_ratio"),
    ("ppo", [("policy_loss", "clip_cov"), ("clip_cov_ratio", "1e300")], POLICY_KEYS,
     "clip_cov_ratio"),
    ("ppo", [("policy_loss", "kl_cov"), ("kl_cov_ratio", "1.5")], POLICY_KEYS,
     "kl_cov_ratio"),
    ("value", [], ["values", "loss_mask", "old_values"], "returns"),
    ("value", [], ["loss_mask", "returns", "old_values"], "values"),
    ("value", [("cliprange_value", "-0.5")], ["values", "returns", "old_values"],
     "cliprange_value"),
    ("dro", [], ["log_probs", "old_log_probs"], "advantages"),
    ("dro", [("beta", "-1")], ["log_probs", "old_log_probs", "advantages"], "beta"),
]


# --------------------------------------------------------------------------
# comparison

def close(a, b, rtol, atol):
    return abs(a - b) <= rtol * abs(b) + atol


def compare(case, got, ref, fails, label=""):
    cid = case["id"] + label
    before = len(fails)
    if not close(got["loss"], ref["loss"], RTOL_VAL, ATOL_VAL):
        fails.append("%s: loss %.17g, reference %.17g" % (cid, got["loss"], ref["loss"]))
    gk, rk = set(got["metrics"]), set(ref["metrics"])
    if gk != rk:
        fails.append("%s: metrics %s, reference %s" % (cid, sorted(gk), sorted(rk)))
    for k in gk & rk:
        if not close(got["metrics"][k], ref["metrics"][k], RTOL_VAL, ATOL_VAL):
            fails.append("%s: metric %s %.17g, reference %.17g"
                         % (cid, k, got["metrics"][k], ref["metrics"][k]))
    for key in ("d_log_probs", "d_entropy", "d_values"):
        g = np.array(got[key], dtype=np.float64)
        r = np.array(ref[key], dtype=np.float64)
        scale = np.abs(r).max() if r.size else 0.0
        bad = np.abs(g - r) > RTOL_GRAD * np.abs(r) + ATOL_GRAD_REL_MAX * scale + 1e-30
        if bad.any():
            i = int(np.argmax(bad))
            fails.append("%s: %s[%d] = %.9g, reference %.9g (%d of %d tokens differ)"
                         % (cid, key, i, g[i], r[i], int(bad.sum()), len(r)))
    return len(fails) == before


def run_driver(driver, cases):
    with tempfile.TemporaryDirectory() as d:
        cin, cout = os.path.join(d, "cases.json"), os.path.join(d, "out.json")
        with open(cin, "w") as f:
            json.dump(cases, f)
        subprocess.run([driver, cin, cout], check=True)
        with open(cout) as f:
            return json.load(f)


def main():
    if len(sys.argv) != 2:
        print("usage: loss_ref.py LOSS_DRIVER", file=sys.stderr)
        return 2
    driver = sys.argv[1]
    rng = np.random.default_rng(20240607)
    cases = build_cases(rng)
    ecases = engine_cases(rng)
    errs = []
    for i, (name, opts, keys, needle) in enumerate(ERROR_CASES):
        lens, arrs = make_batch(rng)
        errs.append({"id": "error-%d" % i, "name": name,
                     "options": [[k, v] for k, v in opts], "seq_lens": lens,
                     "arrays": subset(arrs, keys), "needle": needle})
    # clip_cov: the same seed chooses the same tokens, another seed others
    lens, arrs = make_batch(rng, nseq=12, maxlen=16, adv_scale=3.0)
    rep = [{"id": "clip_cov-seed-%d" % i, "name": "ppo",
            "options": [["policy_loss", "clip_cov"], ["clip_cov_ratio", "0.02"]],
            "seq_lens": lens, "arrays": subset(arrs, POLICY_KEYS), "rng_seed": s}
           for i, s in enumerate((11, 11, 12, 13, 14))]

    outs = run_driver(driver, cases + ecases + errs + rep)
    by_id = {o["id"]: o for o in outs}
    fails = []
    checked = 0
    for c in cases + ecases:
        o = by_id[c["id"]]
        if o["rc"] != 0:
            fails.append("%s: driver rc %d: %s" % (c["id"], o["rc"], o["err"]))
            continue
        spec = spec_of(c["name"], c["options"])
        sel = torch.tensor(o["selected"], dtype=torch.float64) if "selected" in o else None
        if sel is not None:
            sel = Padded(c["seq_lens"]).pad(sel)
        try:
            ref = reference(c, spec, sel)
        except RefError as e:
            fails.append("%s: %s" % (c["id"], e))
            continue
        compare(c, o, ref, fails)
        checked += 1
    for c in errs:
        o = by_id[c["id"]]
        if o["rc"] != -22 or c["needle"] not in o["err"]:
            fails.append("%s: expected -EINVAL naming %r, got rc %d: %r"
                         % (c["id"], c["needle"], o["rc"], o["err"]))
    sels = [tuple(by_id[c["id"]]["selected"]) for c in rep]
    if any(by_id[c["id"]]["rc"] != 0 for c in rep):
        fails.append("clip_cov-seed: driver failed")
    elif sels[0] != sels[1]:
        fails.append("clip_cov-seed: the same seed chose different tokens")
    elif len(set(sels[1:])) == 1:
        fails.append("clip_cov-seed: four seeds chose the same tokens")
    for c in rep:
        spec = spec_of(c["name"], c["options"])
        sel = Padded(c["seq_lens"]).pad(torch.tensor(by_id[c["id"]]["selected"],
                                                     dtype=torch.float64))
        try:
            compare(c, by_id[c["id"]], reference(c, spec, sel), fails)
        except RefError as e:
            fails.append("%s: %s" % (c["id"], e))

    # The comparator must reject wrong references.
    mutations = [
        ("pg-vanilla-token-mean", [("clip_ratio_c", "2.9")]),
        ("pg-vanilla-seq-mean-token-sum", [("clip_ratio", "0.21")]),
        ("pg-sapo-token-mean", [("tau_neg", "1.06")]),
        ("kl-k3-token-mean", [("kl_type", "k3+")]),
        ("kl-abs-token-sum", [("kl_loss_coef", "0.31")]),
        ("pg-empty-terms-vanilla", [("entropy_coeff", "1e-3")]),
        ("value-token-mean-0.5", [("cliprange_value", "0.45")]),
        ("norm-batch-seq-mean-token-sum-norm", [("loss_scale_factor", "22")]),
        ("ce-weights-token-mean", [("loss_agg_mode", "seq-mean-token-mean")]),
    ]
    by_case = {c["id"]: c for c in cases}
    for cid, extra in mutations:
        c = dict(by_case[cid])
        c["options"] = c["options"] + [[k, v] for k, v in extra]
        spec = spec_of(c["name"], c["options"])
        probe = []
        o = by_id[cid]
        sel = None
        if compare(c, o, reference(c, spec, sel), probe, " (mutated)"):
            fails.append("%s: a wrong reference (%s) was not detected" % (cid, extra))

    needed = ["vanilla: clipped high (A > 0)", "vanilla: clipped low (A < 0)",
              "vanilla: dual clip", "vanilla: A = 0", "vanilla: x > 20",
              "vanilla: x < -20", "vanilla: unclipped", "gspo: sequence log-ratio > 10",
              "gspo: clipped", "sapo: A > 0", "sapo: A <= 0", "cispo: clipped",
              "clip_cov: tokens chosen", "clip_cov: random choice (candidates > clip_num)",
              "kl_cov: tokens penalized", "geo_mean: clipped (A > 0)",
              "geo_mean: clipped (A < 0)", "geo_mean: A = 0",
              "k3: |ref - logp| > 20", "k3: kld clamped at 10",
              "value: clipped above", "value: clipped below", "value: clip wins",
              "fully masked sequence"]
    for k in needed:
        if COVER.get(k, 0) == 0:
            fails.append("coverage: no case reached branch %r" % k)

    print("loss_ref: %d cases against torch (%d through the engine adapter), "
          "%d error cases, %d mutations" % (checked, len(ecases), len(errs), len(mutations)))
    for k in needed:
        print("  branch %-50s %6d tokens/cases" % (k, COVER.get(k, 0)))
    if fails:
        print("loss_ref: %d FAILURES" % len(fails))
        for f in fails[:60]:
            print("  " + f)
        return 1
    print("loss_ref: all match")
    return 0


if __name__ == "__main__":
    sys.exit(main())
