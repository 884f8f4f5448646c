"""ref_model.py — an independent torch reference of the Llama family.

Written from the Hugging Face modeling code's equations (not from the
engine): llama, mistral (no sliding window), qwen2 (q/k/v bias), qwen3
(q_norm / k_norm RMSNorm over head_dim before RoPE, explicit head_dim);
tie_word_embeddings, rope_theta, llama3 rope_scaling
(transformers' _compute_llama3_parameters), rms_norm_eps, grouped-query
attention (kv head of query head h is h // (H / KV), as HF's repeat_kv).

Run with the system interpreter (/usr/bin/python3: Debian python3-torch
1.13); it uses torch.set_num_threads(2). The parity suite computes the
reference in float64 from the same fp32 weights the engine loads, so the
differences it measures are the fp32 engine's own error.

Input: a packed batch, input_ids [N] and seq_lens [S] (sum = N). Each
sequence is processed on its own, so positions restart at 0 in every
sequence and attention (causal) never crosses sequences.

Outputs, per token, in packed order (docs/DESIGN.md section 3, target-aligned);
for token t of a sequence (t = 0 is its first token), with logits[t] the
LM-head output at position t and T the temperature:

  logp[t]    = log_softmax(logits[t-1] / T)[ids[t]]     for t >= 1
             = 0                                        for t = 0 (no prediction)
  entropy[t] = -sum_v p_v log p_v, p = softmax(logits[t-1] / T)   for t >= 1
             = 0                                        for t = 0
  values[t]  = h_final[t-1] . score.weight[0] + score.bias[0]      for t >= 1
             = 0                                        for t = 0

  h_final is the output of the final RMSNorm. values are target-aligned like
  the log-probs: the value attached to token t is that of the state before
  token t (the prefix ending at t-1). This is verl's critic convention:
  dp_critic takes values[:, -response_length - 1 : -1], the same slice the
  actor takes of the logits, so response token p gets V(h[p-1]).

The value model is the same backbone with the HF token-classification head
score = Linear(C, 1) (transformers' *ForTokenClassification: weight [1, C]
and a bias [1]) and no lm_head; it has neither log-probs nor entropy.

Backward: from given upstream per-token gradients g_logp, g_ent, g_val,
    loss = sum_t (g_logp[t] * logp[t] + g_ent[t] * entropy[t] + g_val[t] * values[t])
and torch autograd gives every parameter's gradient. Entries at t = 0 are
constants, so g_logp[0] and g_ent[0] contribute nothing.

Parameter names are the Hugging Face ones:
  model.embed_tokens.weight                    [V, C]
  model.layers.{i}.input_layernorm.weight      [C]
  model.layers.{i}.self_attn.q_proj.weight     [H*D, C]   (.bias [H*D] qwen2)
  model.layers.{i}.self_attn.k_proj.weight     [KV*D, C]  (.bias [KV*D] qwen2)
  model.layers.{i}.self_attn.v_proj.weight     [KV*D, C]  (.bias [KV*D] qwen2)
  model.layers.{i}.self_attn.o_proj.weight     [C, H*D]   (.bias [C] llama/qwen3 attention_bias)
  model.layers.{i}.self_attn.q_norm.weight     [D]        (qwen3)
  model.layers.{i}.self_attn.k_norm.weight     [D]        (qwen3)
  model.layers.{i}.post_attention_layernorm.weight [C]
  model.layers.{i}.mlp.gate_proj.weight        [F, C]
  model.layers.{i}.mlp.up_proj.weight          [F, C]
  model.layers.{i}.mlp.down_proj.weight        [C, F]
  model.norm.weight                            [C]
  lm_head.weight                               [V, C]    (absent when tied or value model)
  score.weight                                 [1, C]    (value model only)
  score.bias                                   [1]       (value model only)
"""
import math
from collections import OrderedDict

import numpy as np
import torch

torch.set_num_threads(2)

ARCHS = ("llama", "mistral", "qwen2", "qwen3")


class Config:
    """The fields of a HF config.json the model family uses."""

    def __init__(self, d):
        self.model_type = d["model_type"]
        if self.model_type not in ARCHS:
            raise ValueError("model_type %r not in %s" % (self.model_type, ARCHS))
        self.V = int(d["vocab_size"])
        self.C = int(d["hidden_size"])
        self.F = int(d["intermediate_size"])
        self.L = int(d["num_hidden_layers"])
        self.H = int(d["num_attention_heads"])
        self.KV = int(d.get("num_key_value_heads") or self.H)
        self.D = int(d.get("head_dim") or self.C // self.H)
        self.eps = float(d.get("rms_norm_eps", 1e-6))
        self.theta = float(d.get("rope_theta", 10000.0))
        self.tie = bool(d.get("tie_word_embeddings", False))
        # transformers: qwen2 always biases q/k/v and never o_proj; llama and
        # qwen3 bias q/k/v AND o_proj when attention_bias; mistral never.
        ab = bool(d.get("attention_bias", False))
        self.bias = self.model_type == "qwen2" or (ab and self.model_type in ("llama", "qwen3"))
        self.o_bias = ab and self.model_type in ("llama", "qwen3")
        self.qk_norm = self.model_type == "qwen3"
        self.rope_scaling = d.get("rope_scaling")
        if self.H % self.KV:
            raise ValueError("num_attention_heads % num_key_value_heads != 0")


def rope_inv_freq(cfg, dtype=torch.float64):
    """inv_freq [D/2]: theta^(-2i/D), then llama3 scaling when configured."""
    D = cfg.D
    inv = 1.0 / (cfg.theta ** (torch.arange(0, D, 2, dtype=dtype) / D))
    rs = cfg.rope_scaling
    if rs:
        kind = rs.get("rope_type", rs.get("type"))
        if kind == "default":
            return inv
        if kind != "llama3":
            raise ValueError("rope_scaling type %r not supported" % kind)
        factor = rs["factor"]
        low = rs["low_freq_factor"]
        high = rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        low_wl = old / low
        high_wl = old / high
        wl = 2 * math.pi / inv
        scaled = torch.where(wl > low_wl, inv / factor, inv)
        smooth = (old / wl - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wl < high_wl) * ~(wl > low_wl)
        inv = torch.where(medium, smoothed, scaled)
    return inv


def param_shapes(cfg, value_model=False):
    """OrderedDict name -> shape, in HF names."""
    C, F, H, KV, D, V = cfg.C, cfg.F, cfg.H, cfg.KV, cfg.D, cfg.V
    s = OrderedDict()
    s["model.embed_tokens.weight"] = (V, C)
    for i in range(cfg.L):
        p = "model.layers.%d." % i
        s[p + "input_layernorm.weight"] = (C,)
        s[p + "self_attn.q_proj.weight"] = (H * D, C)
        s[p + "self_attn.k_proj.weight"] = (KV * D, C)
        s[p + "self_attn.v_proj.weight"] = (KV * D, C)
        if cfg.bias:
            s[p + "self_attn.q_proj.bias"] = (H * D,)
            s[p + "self_attn.k_proj.bias"] = (KV * D,)
            s[p + "self_attn.v_proj.bias"] = (KV * D,)
        s[p + "self_attn.o_proj.weight"] = (C, H * D)
        if cfg.o_bias:
            s[p + "self_attn.o_proj.bias"] = (C,)
        if cfg.qk_norm:
            s[p + "self_attn.q_norm.weight"] = (D,)
            s[p + "self_attn.k_norm.weight"] = (D,)
        s[p + "post_attention_layernorm.weight"] = (C,)
        s[p + "mlp.gate_proj.weight"] = (F, C)
        s[p + "mlp.up_proj.weight"] = (F, C)
        s[p + "mlp.down_proj.weight"] = (C, F)
    s["model.norm.weight"] = (C,)
    if value_model:
        s["score.weight"] = (1, C)
        s["score.bias"] = (1,)
    elif not cfg.tie:
        s["lm_head.weight"] = (V, C)
    return s


def init_params(cfg, value_model, seed, logit_scale=3.0):
    """Seeded fp32 weights scaled so that activations are O(1) and the
    logits spread over several nats (the usual 0.02 init would give a
    near-uniform softmax and a weak test). Returns {name: np.float32}."""
    g = np.random.default_rng(seed)
    out = OrderedDict()
    for name, shape in param_shapes(cfg, value_model).items():
        if name.endswith("norm.weight"):
            a = 1.0 + 0.2 * g.standard_normal(shape)
        elif name.endswith(".bias"):
            a = 0.2 * g.standard_normal(shape)
        elif name == "model.embed_tokens.weight":
            a = g.standard_normal(shape)
        elif name in ("lm_head.weight", "score.weight"):
            a = logit_scale * g.standard_normal(shape) / math.sqrt(shape[1])
        else:
            a = g.standard_normal(shape) / math.sqrt(shape[1])
        out[name] = a.astype(np.float32)
    if cfg.tie and not value_model:
        # The tied matrix is both the embedding and the LM head: keep rows
        # O(1) for the embedding; the final norm scales the logits.
        out["model.norm.weight"] = (out["model.norm.weight"] *
                                    (logit_scale / math.sqrt(cfg.C))).astype(np.float32)
    return out


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class RefModel:
    def __init__(self, cfg, params, value_model=False, dtype=torch.float64, copy=True):
        """params: {name: array-like or tensor}; copied into leaf tensors of
        `dtype` that require grad (copy=False adopts tensors that already
        have that dtype, for the benchmark's 0.5B-parameter model)."""
        self.cfg = cfg
        self.value_model = value_model
        self.dtype = dtype
        shapes = param_shapes(cfg, value_model)
        missing = set(shapes) - set(params)
        extra = set(params) - set(shapes)
        if missing or extra:
            raise ValueError("parameters: missing %s, unexpected %s" %
                             (sorted(missing), sorted(extra)))
        self.p = OrderedDict()
        for name, shape in shapes.items():
            t = params[name]
            if not torch.is_tensor(t):
                t = torch.as_tensor(np.asarray(t))
            if copy or t.dtype != dtype:
                t = t.to(dtype).clone()
            if tuple(t.shape) != tuple(shape):
                raise ValueError("%s: shape %s, expected %s" % (name, tuple(t.shape), shape))
            self.p[name] = t.requires_grad_(True)
        self.inv_freq = rope_inv_freq(cfg, dtype)

    def parameters(self):
        return list(self.p.values())

    def _attention(self, x, i, cos, sin):
        cfg, p = self.cfg, self.p
        T = x.shape[0]
        pre = "model.layers.%d.self_attn." % i
        q = x @ p[pre + "q_proj.weight"].t()
        k = x @ p[pre + "k_proj.weight"].t()
        v = x @ p[pre + "v_proj.weight"].t()
        if cfg.bias:
            q = q + p[pre + "q_proj.bias"]
            k = k + p[pre + "k_proj.bias"]
            v = v + p[pre + "v_proj.bias"]
        q = q.view(T, cfg.H, cfg.D)
        k = k.view(T, cfg.KV, cfg.D)
        v = v.view(T, cfg.KV, cfg.D)
        if cfg.qk_norm:
            q = rms_norm(q, p[pre + "q_norm.weight"], cfg.eps)
            k = rms_norm(k, p[pre + "k_norm.weight"], cfg.eps)
        q = q * cos[:, None, :] + rotate_half(q) * sin[:, None, :]
        k = k * cos[:, None, :] + rotate_half(k) * sin[:, None, :]
        rep = cfg.H // cfg.KV
        k = k.repeat_interleave(rep, dim=1)        # [T, H, D]
        v = v.repeat_interleave(rep, dim=1)
        s = torch.einsum("thd,shd->hts", q, k) / math.sqrt(cfg.D)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        s = s.masked_fill(~causal, float("-inf"))
        a = torch.softmax(s, dim=-1)
        o = torch.einsum("hts,shd->thd", a, v).reshape(T, cfg.H * cfg.D)
        o = o @ p[pre + "o_proj.weight"].t()
        if cfg.o_bias:
            o = o + p[pre + "o_proj.bias"]
        return o

    def hidden(self, ids):
        """ids: LongTensor [T] of one sequence -> h_final [T, C]."""
        cfg, p = self.cfg, self.p
        T = ids.shape[0]
        x = p["model.embed_tokens.weight"][ids]
        pos = torch.arange(T, dtype=self.dtype)
        ang = pos[:, None] * self.inv_freq[None, :]     # [T, D/2]
        ang = torch.cat((ang, ang), dim=-1)             # [T, D]
        cos, sin = ang.cos(), ang.sin()
        for i in range(cfg.L):
            pre = "model.layers.%d." % i
            h = rms_norm(x, p[pre + "input_layernorm.weight"], cfg.eps)
            x = x + self._attention(h, i, cos, sin)
            h = rms_norm(x, p[pre + "post_attention_layernorm.weight"], cfg.eps)
            g = h @ p[pre + "mlp.gate_proj.weight"].t()
            u = h @ p[pre + "mlp.up_proj.weight"].t()
            x = x + (torch.nn.functional.silu(g) * u) @ p[pre + "mlp.down_proj.weight"].t()
        return rms_norm(x, p["model.norm.weight"], cfg.eps)

    def lm_weight(self):
        if self.cfg.tie:
            return self.p["model.embed_tokens.weight"]
        return self.p["lm_head.weight"]

    def forward(self, input_ids, seq_lens, temperature=1.0):
        """Returns (logp [N], entropy [N], values [N]); the first two are
        None for the value model, values is None for the language model."""
        ids = torch.as_tensor(np.asarray(input_ids), dtype=torch.long)
        lps, ents, vals = [], [], []
        off = 0
        for n in seq_lens:
            n = int(n)
            s = ids[off:off + n]
            off += n
            h = self.hidden(s)
            zero = torch.zeros(1, dtype=self.dtype)
            if self.value_model:
                v = h[:-1] @ self.p["score.weight"][0] + self.p["score.bias"][0]
                vals.append(torch.cat((zero, v)))
                continue
            z = (h[:-1] @ self.lm_weight().t()) / temperature    # [n-1, V]
            ls = torch.log_softmax(z, dim=-1)
            lp = ls.gather(1, s[1:, None])[:, 0]
            ent = -(ls.exp() * ls).sum(-1)
            lps.append(torch.cat((zero, lp)))
            ents.append(torch.cat((zero, ent)))
        if off != ids.shape[0]:
            raise ValueError("seq_lens sum %d != %d tokens" % (off, ids.shape[0]))
        if self.value_model:
            return None, None, torch.cat(vals)
        return torch.cat(lps), torch.cat(ents), None

    def loss(self, input_ids, seq_lens, temperature, g_logp, g_ent, g_val):
        """The scalar whose gradient the engine's backward must reproduce."""
        lp, ent, val = self.forward(input_ids, seq_lens, temperature)
        t = lambda a: torch.as_tensor(np.asarray(a)).to(self.dtype)
        if self.value_model:
            return (t(g_val) * val).sum()
        return (t(g_logp) * lp).sum() + (t(g_ent) * ent).sum()

    def zero_grad(self):
        for q in self.p.values():
            q.grad = None
