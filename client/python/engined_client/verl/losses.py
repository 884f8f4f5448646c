"""losses.py — verl's loss functions as engined's server-side losses.

verl hands its engines a loss as functools.partial(fn, config=cfg) with fn
one of verl.workers.utils.losses.{sft_loss, ppo_loss, value_loss}.
server_loss() turns such a partial, for one batch, into the daemon's loss
(name, options, per-token arrays) with verl's semantics: every policy-loss
variant engined has (vanilla with dual clip, gspo, sapo, gpg, clip_cov,
kl_cov, geo_mean, cispo), clip ratios, clip_ratio_c, loss_agg_mode,
entropy_coeff (when the batch computes entropy, as verl adds the term
only then), the KL loss (type, coefficient), rollout IS weights, and the
global normalizers (batch_num_tokens, global_batch_size, dp_size,
loss_scale_factor). It returns None for anything else (another callable,
a variant engined lacks, a rollout correction verl applies inside its
policy loss): those take the client-side custom-gradient path, which is
exact for any loss of the model's outputs.
"""
import functools

import numpy as np

# verl's loss_mode -> engined's policy_loss (engines/loss/loss.h).
POLICY_LOSSES = {"vanilla": "vanilla", "gspo": "gspo", "sapo": "sapo", "gpg": "gpg",
                 "clip_cov": "clip_cov", "kl_cov": "kl_cov", "geo_mean": "geo_mean",
                 "cispo": "cispo"}


def _verl_losses():
    from verl.workers.utils import losses
    return losses


def unwrap(loss_function):
    """(verl loss name, its config) of a verl partial; (None, None) else."""
    if not isinstance(loss_function, functools.partial) or loss_function.args:
        return None, None
    if set(loss_function.keywords) - {"config"}:
        return None, None
    L = _verl_losses()
    for name in ("sft_loss", "ppo_loss", "value_loss"):
        if loss_function.func is getattr(L, name):
            return name, loss_function.keywords.get("config")
    return None, None


def _default_rollout_correction(policy_loss):
    rc = getattr(policy_loss, "rollout_correction", None)
    return rc is None or rc == type(rc)()


def _norms(data, packed, loss_scale_factor, dp_size):
    """The global normalizers verl's losses read from the batch."""
    import verl.utils.tensordict_utils as tu
    opts = {"global_num_tokens": int(data["batch_num_tokens"])}
    gbs = tu.get_non_tensor_data(data, "global_batch_size", None)
    if gbs is not None:
        opts["global_batch_size"] = int(gbs)
    if loss_scale_factor is None and packed.resp_index is not None:
        # agg_loss's default horizon: the padded response width.
        loss_scale_factor = tu.get_non_tensor_data(data, "max_response_len", -1)
        if loss_scale_factor is None or loss_scale_factor < 0:
            loss_scale_factor = packed.resp_index.shape[1]
    if loss_scale_factor:
        opts["loss_scale_factor"] = int(loss_scale_factor)
    if dp_size is not None:
        opts["dp_size"] = int(dp_size)
    return opts


def server_loss(loss_function, data, packed, *, calculate_entropy, dp_size):
    """(loss name, options, per-token arrays) for the daemon, or None.
    dp_size: the dp_size option to send (None: the EngineGroup's own)."""
    name, cfg = unwrap(loss_function)
    if name == "sft_loss":
        return "sft", _norms(data, packed, None, dp_size), {
            "loss_mask": packed.sequence_mask(data["loss_mask"])}
    if name == "value_loss":
        opts = _norms(data, packed, cfg.loss_scale_factor, dp_size)
        opts.update(cliprange_value=float(cfg.cliprange_value),
                    loss_agg_mode=cfg.loss_agg_mode)
        return "value", opts, {
            "loss_mask": packed.response_to_tokens(data["response_mask"]),
            "old_values": packed.response_to_tokens(data["values"]),
            "returns": packed.response_to_tokens(data["returns"])}
    if name != "ppo_loss":
        return None
    pl = cfg.policy_loss
    mode = pl.get("loss_mode", "vanilla")
    if mode not in POLICY_LOSSES or not _default_rollout_correction(pl):
        return None
    opts = _norms(data, packed, cfg.loss_scale_factor, dp_size)
    opts.update(policy_loss=POLICY_LOSSES[mode], loss_agg_mode=cfg.loss_agg_mode,
                clip_ratio=float(cfg.clip_ratio), clip_ratio_c=float(cfg.clip_ratio_c),
                clip_ratio_low=float(cfg.clip_ratio_low if cfg.clip_ratio_low is not None
                                     else cfg.clip_ratio),
                clip_ratio_high=float(cfg.clip_ratio_high if cfg.clip_ratio_high is not None
                                      else cfg.clip_ratio),
                clip_cov_ratio=float(pl.get("clip_cov_ratio", 0.0002)),
                clip_cov_lb=float(pl.get("clip_cov_lb", 1.0)),
                clip_cov_ub=float(pl.get("clip_cov_ub", 5.0)),
                kl_cov_ratio=float(pl.get("kl_cov_ratio", 0.0002)),
                ppo_kl_coef=float(pl.get("ppo_kl_coef", 0.1)),
                tau_pos=float(cfg.tau_pos), tau_neg=float(cfg.tau_neg))
    per_token = {"loss_mask": packed.response_to_tokens(data["response_mask"]),
                 "old_log_probs": packed.response_to_tokens(data["old_log_probs"]),
                 "advantages": packed.response_to_tokens(data["advantages"])}
    if "rollout_is_weights" in data.keys():
        per_token["is_weights"] = packed.response_to_tokens(data["rollout_is_weights"])
    if calculate_entropy:
        opts["entropy_coeff"] = float(cfg.entropy_coeff)
    if cfg.use_kl_loss:
        opts.update(kl_coef=float(cfg.kl_loss_coef), kl_type=cfg.kl_loss_type)
        per_token["ref_log_probs"] = packed.response_to_tokens(data["ref_log_prob"])
    return "ppo", opts, per_token


# engined's metric -> (verl's name, aggregation): contributions add up
# (SUM, as verl's losses report them with global normalizers), means over
# tokens average (MEAN).
_METRICS = {
    "ppo": {"pg_loss": ("actor/pg_loss", "sum"), "pg_clipfrac": ("actor/pg_clipfrac", "mean"),
            "ppo_kl": ("actor/ppo_kl", "mean"),
            "pg_clipfrac_lower": ("actor/pg_clipfrac_lower", "mean"),
            "entropy": ("actor/entropy_loss", "sum"), "kl_loss": ("kl_loss", "sum")},
    "value": {"vf_loss": ("critic/vf_loss", "sum"), "vf_clipfrac": ("critic/vf_clipfrac", None)},
    "sft": {},
}


def verl_metrics(name, options, metrics, values=None, packed=None, response_mask=None):
    """The daemon's metrics of loss `name` under verl's names, as verl's
    loss functions return them (Metric objects where verl uses them)."""
    from verl.utils.metric import Metric
    out = {}
    for k, (vk, agg) in _METRICS[name].items():
        if k in metrics:
            out[vk] = Metric(value=float(metrics[k]), aggregation=agg) if agg else float(metrics[k])
    if name == "ppo" and "kl_coef" in options:
        out["kl_coef"] = options["kl_coef"]
    if name == "value" and values is not None:
        m = packed.response_to_tokens(response_mask)
        v = np.asarray(values, dtype=np.float64)
        out["critic/vpred_mean"] = float((v * m).sum() / max(m.sum(), 1.0))
    return out
