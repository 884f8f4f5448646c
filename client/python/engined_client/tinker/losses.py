"""losses.py — a Tinker forward_backward (datums, loss_fn, loss_fn_config)
as one engined ForwardBackward, and its reply as Tinker's outputs.

Alignment (docs/TINKER.md 8.2): a datum's input x_0..x_{N-1} with targets
y_0..y_{N-1} (position i predicts y_i from x_0..x_i) becomes one packed
sequence x_0..x_{N-1}, y_{N-1} of N+1 tokens with target_ids
[0, y_0, .., y_{N-1}]: engined's entry i+1 is the log-prob of y_i given
x_0..x_i, and its default loss mask (every entry but a sequence's first) is
exactly the N Tinker positions. The appended token is seen by no
prediction (causal attention). Every per-position input moves the same
way (entry i+1 = position i).

Losses (Tinker's are sums over every position of every datum; engined's
loss options in docs/DESIGN.md section 5; r = exp(logp - logprobs)):
  cross_entropy        -w logp              engined cross_entropy, token_weights = weights
  importance_sampling  -r A                 engined importance_sampling
  ppo                  -min(rA, clip(r, lo, hi) A)
                       engined ppo/vanilla, clip_ratio_low = 1 - lo, clip_ratio_high =
                       hi - 1, token-sum; engined's dual clip is kept out of the way by
                       clip_ratio_c = 1e30 (it only lowers a loss above -A c)
  cispo                -sg(clip(r, lo, hi)) A logp   engined ppo/cispo, same bounds
  dro                  -(logp A - beta/2 (logp - logprobs)^2)   engined dro
engined computes r from logp - logprobs clamped to +-20 (a ratio of e^20):
Tinker's formulas have no clamp."""
import numpy as np

from .wire import UserError

_PG = {"target_tokens", "logprobs", "advantages"}
# loss_fn -> (required inputs, config keys and defaults)
LOSSES = {
    "cross_entropy": ({"target_tokens", "weights"}, {}),
    "importance_sampling": (_PG, {}),
    "ppo": (_PG, {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}),
    "cispo": (_PG, {"clip_low_threshold": 0.0, "clip_high_threshold": 4.0}),
    "dro": (_PG, {"beta": 0.05}),
}
UNSUPPORTED = {
    "gspo": "engined's gspo takes the sequence ratio over the loss mask with "
            "seq-mean-token-mean aggregation, not Tinker's token sum over sequence_ratio_mask",
    "stable_reinforce": "it needs the sampler's recorded stability data (provenance spans)",
    "custom": "server-side custom losses are off (client/config custom_loss_server_side=false); "
              "forward_backward_custom computes them in the SDK",
}
_DTYPES = {"target_tokens": np.int64, "weights": np.float32, "logprobs": np.float32,
           "advantages": np.float32}
_PER_TOKEN = {"weights": "token_weights", "logprobs": "old_log_probs",
              "advantages": "advantages"}


def loss_spec(loss_fn, config):
    """engined's loss dict for a Tinker loss_fn and loss_fn_config."""
    if loss_fn in UNSUPPORTED:
        raise UserError("loss_fn %r is not supported by this gateway: %s"
                        % (loss_fn, UNSUPPORTED[loss_fn]))
    if loss_fn not in LOSSES:
        raise UserError("loss_fn %r is unknown (known: %s)" % (loss_fn, ", ".join(LOSSES)))
    _, defaults = LOSSES[loss_fn]
    unknown = set(config) - set(defaults)
    if unknown:
        raise UserError("loss_fn_config: %s not a setting of %s (its settings: %s)"
                        % (", ".join(sorted(unknown)), loss_fn,
                           ", ".join(defaults) or "none"))
    cfg = dict(defaults)
    for k, v in config.items():
        if not isinstance(v, (int, float)) or not np.isfinite(v):
            raise UserError("loss_fn_config[%r]: %r is not a finite number" % (k, v))
        cfg[k] = float(v)
    if loss_fn in ("cross_entropy", "importance_sampling"):
        return {"name": loss_fn}
    if loss_fn == "dro":
        return {"name": "dro", "beta": cfg["beta"]}
    lo, hi = cfg["clip_low_threshold"], cfg["clip_high_threshold"]
    if not 0.0 <= lo <= 1.0 <= hi:
        raise UserError("loss_fn_config: need 0 <= clip_low_threshold <= 1 <= "
                        "clip_high_threshold (got %g, %g)" % (lo, hi))
    spec = {"name": "ppo", "policy_loss": "vanilla" if loss_fn == "ppo" else "cispo",
            "clip_ratio_low": 1.0 - lo, "clip_ratio_high": hi - 1.0,
            "loss_agg_mode": "token-sum"}
    if loss_fn == "ppo":
        spec["clip_ratio_c"] = 1e30
    return spec


def pack(fb):
    """engined forward_backward keyword arguments for a parsed Tinker
    ForwardBackward, and each datum's length (to split the outputs). Token
    ids beyond the vocabulary are engined's to refuse (INVALID_ARGUMENT)."""
    if not fb.data:
        raise UserError("data: empty (at least one datum)")
    spec = loss_spec(fb.loss_fn, fb.config)
    required = LOSSES[fb.loss_fn][0]
    ids, targets, lens = [], [], []
    per = {name: [] for name in required if name in _PER_TOKEN}
    for i, d in enumerate(fb.data):
        n = len(d.tokens)
        where = "data[%d]" % i
        if n == 0:
            raise UserError("%s.model_input: no tokens" % where)
        missing = required - set(d.inputs)
        if missing:
            raise UserError("%s.loss_fn_inputs: %s needs %s (missing %s)"
                            % (where, fb.loss_fn, ", ".join(sorted(required)),
                               ", ".join(sorted(missing))))
        extra = set(d.inputs) - required
        if extra:
            raise UserError("%s.loss_fn_inputs: %s not an input of %s"
                            % (where, ", ".join(sorted(extra)), fb.loss_fn))
        for k in sorted(required):
            a = d.inputs[k]
            if a.shape != (n,):
                raise UserError("%s.loss_fn_inputs[%r]: shape %s, the model input has %d "
                                "tokens (one value per position; [N, K] targets are not "
                                "supported)" % (where, k, list(a.shape), n))
            if _DTYPES[k] == np.float32 and not np.all(np.isfinite(a)):
                raise UserError("%s.loss_fn_inputs[%r]: not all finite" % (where, k))
        tt = d.inputs["target_tokens"]
        if tt.min() < 0 or tt.max() > np.iinfo(np.int32).max:
            raise UserError("%s.loss_fn_inputs['target_tokens']: a token id outside int32's "
                            "non-negative range" % where)
        ids.append(np.append(d.tokens, np.int32(tt[-1])))
        targets.append(np.concatenate(([0], tt)).astype(np.int32))
        lens.append(n + 1)
        for k in per:
            per[k].append(np.concatenate(([0.0], d.inputs[k])).astype(np.float32))
    kwargs = dict(input_ids=np.concatenate(ids), seq_lens=lens, loss=spec,
                  forward_only=fb.forward_only, return_log_probs=True,
                  target_ids=np.concatenate(targets))
    for k, parts in per.items():
        kwargs[_PER_TOKEN[k]] = np.concatenate(parts)
    return kwargs, lens


def outputs(result, lens):
    """Each datum's "logprobs" (float32 [N]) from engined's reply, and
    Tinker's metrics (every name "<name>:<reduction>")."""
    lp = result.log_probs
    out, at = [], 0
    for n1 in lens:
        out.append(lp[at + 1:at + n1].copy())
        at += n1
    metrics = {"loss:sum": float(result.loss)}
    for k, v in result.metrics.items():
        if k == "loss":
            continue
        metrics["%s:%s" % (k, "sum" if k.startswith("num_") else "mean")] = float(v)
    return out, metrics
