"""verl_batches.py — what the verl backend's tests share: a small Llama
config as verl's HFModelConfig sees it, verl's configs for the engined
backend, and rollout batches built the way verl's trainer builds them
(a left/right-padded DataProto-like TensorDict through verl's own
left_right_2_no_padding)."""
import json
import os

import numpy as np
import torch
from tensordict import TensorDict

import verl.utils.tensordict_utils as tu
from verl.workers.config import ActorConfig, CriticConfig, FSDPOptimizerConfig, HFModelConfig
from verl.workers.utils.padding import left_right_2_no_padding

from engined_client.verl import EnginedEngineConfig

VOCAB = 128
HF_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": VOCAB,
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
    "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "tie_word_embeddings": False, "hidden_act": "silu", "initializer_range": 0.02,
    "attention_bias": False, "torch_dtype": "float32",
}


# A mixture of experts of the same size (routing replay's tests).
MIXTRAL_CONFIG = dict(HF_CONFIG, architectures=["MixtralForCausalLM"], model_type="mixtral",
                      num_local_experts=8, num_experts_per_tok=2, intermediate_size=24)


def model_config(tmp, value=False, hf=None, **kw):
    """verl's HFModelConfig of HF_CONFIG, or of hf (no tokenizer: token
    ids only); kw: more of its fields (lora_rank, ...)."""
    d = os.path.join(tmp, "hf-value" if value else "hf-model")
    os.makedirs(d, exist_ok=True)
    cfg = dict(hf or HF_CONFIG)
    if value:
        cfg.update(architectures=["LlamaForTokenClassification"], id2label={"0": "LABEL_0"},
                   label2id={"LABEL_0": 0})
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    return HFModelConfig(path=d, load_tokenizer=False,
                         override_config={"attn_implementation": "eager"}, **kw)


def engine_config(addresses, ckpt_root=None, **kw):
    kw.setdefault("dtype", "float32")
    kw.setdefault("weight_dtype", "float32")
    kw.setdefault("seed", 7)
    kw.setdefault("replace", True)
    return EnginedEngineConfig(addresses=list(addresses), checkpoint_local_root=ckpt_root, **kw)


def optimizer_config(**kw):
    kw.setdefault("lr", 1e-3)
    kw.setdefault("weight_decay", 0.01)
    kw.setdefault("clip_grad", 1.0)
    kw.setdefault("total_training_steps", 10)
    return FSDPOptimizerConfig(**kw)


def actor_config(**kw):
    kw.setdefault("strategy", "engined")
    kw.setdefault("rollout_n", 1)
    kw.setdefault("ppo_micro_batch_size_per_gpu", 2)
    return ActorConfig(**kw)


def critic_config(**kw):
    kw.setdefault("strategy", "engined")
    kw.setdefault("ppo_micro_batch_size_per_gpu", 2)
    return CriticConfig(**kw)


def rollout_batch(seed, bsz=4, prompt_width=5, response_width=6, old_log_probs=None,
                  part=None):
    """A PPO mini-batch as verl's trainer hands it to update_actor: prompts
    left-padded to prompt_width, responses right-padded to response_width,
    then left_right_2_no_padding. Prompt and response lengths vary.
    part=(rank, world): that data-parallel rank's contiguous share of the
    rows, as verl's dispatch splits a batch (global_batch_size stays bsz)."""
    g = np.random.default_rng(seed)
    plen = g.integers(2, prompt_width + 1, size=bsz)
    rlen = g.integers(2, response_width + 1, size=bsz)
    rlen[0] = response_width
    width = prompt_width + response_width
    ids = np.zeros((bsz, width), dtype=np.int64)
    am = np.zeros((bsz, width), dtype=np.int64)
    for i in range(bsz):
        ids[i, prompt_width - plen[i]:prompt_width] = g.integers(1, VOCAB, size=plen[i])
        ids[i, prompt_width:prompt_width + rlen[i]] = g.integers(1, VOCAB, size=rlen[i])
        am[i, prompt_width - plen[i]:prompt_width + rlen[i]] = 1
    pos = np.clip(np.cumsum(am, axis=1) - 1, 0, None)
    rmask = am[:, prompt_width:].astype(np.float32)
    adv = (g.standard_normal((bsz, 1)) * np.ones((1, response_width))).astype(np.float32) * rmask
    td = TensorDict({
        "input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(am),
        "position_ids": torch.from_numpy(pos), "prompts": torch.from_numpy(ids[:, :prompt_width]),
        "responses": torch.from_numpy(ids[:, prompt_width:]),
        "response_mask": torch.from_numpy(rmask),
        "advantages": torch.from_numpy(adv),
        "ref_log_prob": torch.from_numpy(
            (g.standard_normal((bsz, response_width)) * 0.3 - 4.5).astype(np.float32)),
        "old_log_probs": torch.from_numpy(
            (g.standard_normal((bsz, response_width)) * 0.3 - 4.8).astype(np.float32)
            if old_log_probs is None else old_log_probs),
        "values": torch.from_numpy((g.standard_normal((bsz, response_width)) * 0.1)
                                   .astype(np.float32)),
        "returns": torch.from_numpy(g.standard_normal((bsz, response_width))
                                    .astype(np.float32)),
    }, batch_size=[bsz])
    if part is not None:
        rank, world = part
        td = td[rank * bsz // world:(rank + 1) * bsz // world]
    td = left_right_2_no_padding(td)
    tu.assign_non_tensor(td, temperature=1.0, global_batch_size=bsz)
    return td


def sft_batch(seed, bsz=3, max_len=9):
    """An SFT batch as verl's SFT trainer makes it (NO_PADDING): nested
    input_ids and a loss mask over the whole sequence (the response)."""
    g = np.random.default_rng(seed)
    ids, masks = [], []
    for _ in range(bsz):
        n = int(g.integers(4, max_len + 1))
        p = int(g.integers(1, n - 1))
        ids.append(torch.from_numpy(g.integers(1, VOCAB, size=n)))
        m = np.zeros(n, dtype=np.int64)
        m[p:] = 1
        masks.append(torch.from_numpy(m))
    nest = lambda xs: torch.nested.as_nested_tensor(xs, layout=torch.jagged)  # noqa: E731
    pos = [torch.arange(len(x)) for x in ids]
    td = TensorDict({"input_ids": nest(ids), "loss_mask": nest(masks),
                     "position_ids": nest(pos)}, batch_size=[bsz])
    tu.assign_non_tensor(td, temperature=1.0)
    return td
