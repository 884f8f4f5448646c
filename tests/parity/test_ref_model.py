"""test_ref_model.py — checks the torch reference (ref_model.py) itself.

The parity suite is only as good as its reference, so the reference is
checked against a second, deliberately naive float64 implementation written
with numpy and Python loops on the *packed* batch (explicit position ids that
restart per sequence, an explicit same-sequence causal mask, RoPE pair by
pair, llama3 inverse frequencies element by element with `math`), and its
gradients against central finite differences. Tiny sizes; a few seconds.

Run: /usr/bin/python3 tests/parity/test_ref_model.py
"""
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ref_model  # noqa: E402


def naive_inv_freq(d):
    D = d.get("head_dim") or d["hidden_size"] // d["num_attention_heads"]
    theta = d.get("rope_theta", 10000.0)
    out = []
    rs = d.get("rope_scaling")
    for i in range(D // 2):
        f = theta ** (-(2.0 * i) / D)
        if rs:
            wl = 2 * math.pi / f
            lo_wl = rs["original_max_position_embeddings"] / rs["low_freq_factor"]
            hi_wl = rs["original_max_position_embeddings"] / rs["high_freq_factor"]
            if wl < hi_wl:
                pass
            elif wl > lo_wl:
                f = f / rs["factor"]
            else:
                sm = ((rs["original_max_position_embeddings"] / wl - rs["low_freq_factor"]) /
                      (rs["high_freq_factor"] - rs["low_freq_factor"]))
                f = (1 - sm) * f / rs["factor"] + sm * f
        out.append(f)
    return out


def naive_rms(x, w, eps):
    return x / math.sqrt(float(np.mean(x * x)) + eps) * w


def naive_forward(d, P, ids, seq_lens, temp, value_model):
    """Packed batch, float64, loops. Returns (logp, ent, val) lists."""
    C = d["hidden_size"]
    H = d["num_attention_heads"]
    KV = d.get("num_key_value_heads") or H
    D = d.get("head_dim") or C // H
    L = d["num_hidden_layers"]
    eps = d["rms_norm_eps"]
    bias = d["model_type"] == "qwen2"
    qkn = d["model_type"] == "qwen3"
    P = {k: np.asarray(v, dtype=np.float64) for k, v in P.items()}
    N = len(ids)
    pos, seq = [], []
    for s, n in enumerate(seq_lens):
        pos += list(range(n))
        seq += [s] * n
    invf = naive_inv_freq(d)

    def rope(vec, p):
        out = vec.copy()
        for i in range(D // 2):
            a = p * invf[i]
            c, s = math.cos(a), math.sin(a)
            x0, x1 = vec[i], vec[i + D // 2]
            out[i] = x0 * c - x1 * s
            out[i + D // 2] = x1 * c + x0 * s
        return out

    x = np.stack([P["model.embed_tokens.weight"][t] for t in ids])
    for l in range(L):
        pre = "model.layers.%d." % l
        h = np.stack([naive_rms(x[t], P[pre + "input_layernorm.weight"], eps) for t in range(N)])
        q = h @ P[pre + "self_attn.q_proj.weight"].T
        k = h @ P[pre + "self_attn.k_proj.weight"].T
        v = h @ P[pre + "self_attn.v_proj.weight"].T
        if bias:
            q += P[pre + "self_attn.q_proj.bias"]
            k += P[pre + "self_attn.k_proj.bias"]
            v += P[pre + "self_attn.v_proj.bias"]
        q = q.reshape(N, H, D)
        k = k.reshape(N, KV, D)
        v = v.reshape(N, KV, D)
        for t in range(N):
            for hh in range(H):
                if qkn:
                    q[t, hh] = naive_rms(q[t, hh], P[pre + "self_attn.q_norm.weight"], eps)
                q[t, hh] = rope(q[t, hh], pos[t])
            for hh in range(KV):
                if qkn:
                    k[t, hh] = naive_rms(k[t, hh], P[pre + "self_attn.k_norm.weight"], eps)
                k[t, hh] = rope(k[t, hh], pos[t])
        o = np.zeros((N, H * D))
        for t in range(N):
            for hh in range(H):
                kh = hh // (H // KV)
                js = [j for j in range(N) if seq[j] == seq[t] and j <= t]
                sc = np.array([q[t, hh] @ k[j, kh] / math.sqrt(D) for j in js])
                w = np.exp(sc - sc.max())
                w /= w.sum()
                o[t, hh * D:(hh + 1) * D] = sum(w[m] * v[j, kh] for m, j in enumerate(js))
        x = x + o @ P[pre + "self_attn.o_proj.weight"].T
        h = np.stack([naive_rms(x[t], P[pre + "post_attention_layernorm.weight"], eps) for t in range(N)])
        g = h @ P[pre + "mlp.gate_proj.weight"].T
        u = h @ P[pre + "mlp.up_proj.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ P[pre + "mlp.down_proj.weight"].T
    hf = np.stack([naive_rms(x[t], P["model.norm.weight"], eps) for t in range(N)])
    if value_model:
        return None, None, [0.0 if pos[t] == 0 else
                            float(hf[t - 1] @ P["score.weight"][0] + P["score.bias"][0])
                            for t in range(N)]
    W = P["model.embed_tokens.weight"] if d.get("tie_word_embeddings") else P["lm_head.weight"]
    lp, ent = [], []
    for t in range(N):
        if pos[t] == 0:
            lp.append(0.0)
            ent.append(0.0)
            continue
        z = W @ hf[t - 1] / temp
        m = z.max()
        lse = m + math.log(float(np.sum(np.exp(z - m))))
        ls = z - lse
        lp.append(float(ls[ids[t]]))
        ent.append(float(-np.sum(np.exp(ls) * ls)))
    return lp, ent, None


CONFIGS = [
    ("llama_gqa", False, dict(model_type="llama", vocab_size=23, hidden_size=16,
                              intermediate_size=24, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2,
                              rms_norm_eps=1e-5, rope_theta=10000.0,
                              tie_word_embeddings=False)),
    ("llama3_scaling", False, dict(model_type="llama", vocab_size=23, hidden_size=32,
                                   intermediate_size=24, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2,
                                   rms_norm_eps=1e-5, rope_theta=500000.0,
                                   tie_word_embeddings=True,
                                   rope_scaling=dict(rope_type="llama3", factor=8.0,
                                                     low_freq_factor=1.0, high_freq_factor=4.0,
                                                     original_max_position_embeddings=256))),
    ("qwen2_tied", False, dict(model_type="qwen2", vocab_size=23, hidden_size=16,
                               intermediate_size=24, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=1,
                               rms_norm_eps=1e-6, rope_theta=1e6,
                               tie_word_embeddings=True)),
    ("qwen3_headdim", False, dict(model_type="qwen3", vocab_size=23, hidden_size=16,
                                  intermediate_size=24, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                  rms_norm_eps=1e-6, rope_theta=1e6,
                                  tie_word_embeddings=False)),
    ("qwen2_value", True, dict(model_type="qwen2", vocab_size=23, hidden_size=16,
                               intermediate_size=24, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2,
                               rms_norm_eps=1e-6, rope_theta=1e6,
                               tie_word_embeddings=True)),
]

FD_PARAMS = [
    "model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
    "model.layers.1.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.bias",
    "model.layers.1.self_attn.k_norm.weight", "model.layers.0.mlp.down_proj.weight",
    "model.layers.0.input_layernorm.weight", "model.norm.weight", "lm_head.weight",
    "score.weight", "score.bias",
]


def main():
    failures = []
    rng = np.random.default_rng(7)
    seq_lens = [5, 1, 7]
    N = sum(seq_lens)
    temp = 0.7
    # The llama3 case must exercise all three frequency regimes
    # (wavelength < 256/4, between, > 256/1).
    d3 = dict(CONFIGS[1][2], rope_scaling=None)
    wl = [2 * math.pi / f for f in naive_inv_freq(d3)]
    assert min(wl) < 64 and max(wl) > 256 and any(64 <= w <= 256 for w in wl), wl
    for name, vm, d in CONFIGS:
        cfg = ref_model.Config(d)
        P = ref_model.init_params(cfg, vm, seed=len(name))
        ids = rng.integers(0, cfg.V, size=N)
        m = ref_model.RefModel(cfg, P, vm)
        lp, ent, val = m.forward(ids, seq_lens, temp)
        nlp, nent, nval = naive_forward(d, P, list(ids), seq_lens, temp, vm)
        if vm:
            errs = {"values": np.abs(val.detach().numpy() - nval).max()}
        else:
            errs = {"logp": np.abs(lp.detach().numpy() - nlp).max(),
                    "entropy": np.abs(ent.detach().numpy() - nent).max()}
            assert np.abs(lp.detach().numpy()).max() > 0.5
        # torch inv_freq vs the element-wise one
        errs["inv_freq"] = np.abs(m.inv_freq.numpy() - naive_inv_freq(d)).max()
        # Packing independence: a sequence alone gives the same outputs.
        lp1, ent1, val1 = m.forward(ids[6:], [7], temp)
        a = (val if vm else lp).detach().numpy()[6:]
        b = (val1 if vm else lp1).detach().numpy()
        errs["packing"] = np.abs(a - b).max()
        for k, e in errs.items():
            ok = e < 1e-10
            print("%-16s %-9s max|ref - naive| = %.3e %s" % (name, k, e, "ok" if ok else "FAIL"))
            if not ok:
                failures.append((name, k))
        # Finite differences of the loss w.r.t. a few elements.
        g_lp = rng.standard_normal(N)
        g_en = rng.standard_normal(N)
        g_v = rng.standard_normal(N)
        m.zero_grad()
        m.loss(ids, seq_lens, temp, g_lp, g_en, g_v).backward()
        for pn in FD_PARAMS:
            if pn not in m.p:
                continue
            t = m.p[pn]
            for trial in range(2):
                idx = tuple(int(rng.integers(0, s)) for s in t.shape)
                if pn == "model.embed_tokens.weight":
                    idx = (int(ids[trial * 3]),) + idx[1:]
                h = 1e-5
                with torch.no_grad():
                    old = t[idx].item()
                    t[idx] = old + h
                    lplus = m.loss(ids, seq_lens, temp, g_lp, g_en, g_v).item()
                    t[idx] = old - h
                    lminus = m.loss(ids, seq_lens, temp, g_lp, g_en, g_v).item()
                    t[idx] = old
                fd = (lplus - lminus) / (2 * h)
                ag = t.grad[idx].item()
                err = abs(fd - ag) / max(1.0, abs(ag))
                ok = err < 1e-6
                print("%-16s grad %s%s autograd %.8f fd %.8f %s" %
                      (name, pn, list(idx), ag, fd, "ok" if ok else "FAIL"))
                if not ok:
                    failures.append((name, pn))
    if failures:
        print("FAILED:", failures)
        return 1
    print("reference model: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
