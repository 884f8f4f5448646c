"""LoRA adapters against PEFT itself (issue 27): tiny random llama, qwen2
and qwen3 models saved by transformers, adapters made by peft's LoraConfig
(init_lora_weights=False, so that B is not zero and the adapter is not a
no-op) and saved by peft; engined starts each adapter from that directory
over its frozen base (CreateAdapter peft_dir) and must reproduce, with
peft's model (float32, CPU) as the reference:
  - log-probs within 1e-5;
  - the adapter's gradients within 1e-5 relative: read through one AdamW
    step with lr = eps = 1e4, beta2 = 0 and no decay or clipping, whose
    update is lr g / (|g| + eps) = g / (1 + |g| / 1e4), a known function of
    the gradient, compared with the same function of peft's gradient;
  - the adapter after 3 AdamW steps (torch.optim.AdamW over peft's LoRA
    parameters, lr 1e-3) within 1e-6 (Adam divides each gradient by its own
    size, so a gradient's fp32 difference becomes a difference of its
    update in proportion to lr: at lr 1e-2 the worst case is 1.5e-6);
  - the base bit for bit unchanged, its own log-probs those of the base
    model (verl's disable_adapter());
  - the merged stream (adapter_view "merged") equal to peft's
    merge_and_unload() within 1e-6, the base stream ("base") the base
    under verl's base_layer names;
  - the adapter's checkpoint a directory that peft.PeftModel.from_pretrained
    loads, reproducing engined's log-probs within 1e-5, and that
    LoadCheckpoint restores bit for bit.
The loss is sum_t w_t log p_t with fixed weights: engined gets dL/dlog_p =
w as the custom loss's gradients, torch differentiates the same sum.

Needs torch, transformers and peft: meson runs it with BUILD/venv-verl's
python (tests/verl/setup_venv.sh); by hand:
  ENGINED_BIN=build/daemon/engined PYTHONPATH=client/python:build/client/python \\
    build/venv-verl/bin/python -m pytest -c tests/integration/pytest.ini \\
    tests/verl/test_lora_peft.py
"""
import copy
import os

import numpy as np
import pytest

import torch
import transformers
import peft

import hf_reference

LENS = [12, 7, 20]
N = sum(LENS)
BASE = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
            rms_norm_eps=1e-6, initializer_range=0.02, tie_word_embeddings=False)
FAMILIES = {
    # name: (config, LoraConfig keywords)
    "llama_all_linear": (transformers.LlamaConfig(**BASE, rope_theta=500000.0),
                         dict(r=4, lora_alpha=8, target_modules="all-linear")),
    "qwen2_listed": (transformers.Qwen2Config(**BASE, rope_theta=1000000.0,
                                              use_sliding_window=False),
                     dict(r=6, lora_alpha=16, target_modules=["q_proj", "v_proj",
                                                              "down_proj"])),
    "qwen3_rslora": (transformers.Qwen3Config(**BASE, head_dim=32, rope_theta=1000000.0),
                     dict(r=8, lora_alpha=4, target_modules="all-linear", use_rslora=True)),
}
BIG = 1e4   # lr and eps of the gradient-reading step


def batch(seed):
    return hf_reference.batch(seed, LENS, BASE["vocab_size"])


def torch_logprobs(model, ids):
    return hf_reference.torch_logprobs(model, ids, LENS)


def lora_params(pmodel):
    """peft's trainable tensors by the names peft saves them."""
    return {k.replace(".default", ""): p for k, p in pmodel.named_parameters()
            if p.requires_grad}


def engined_tensors(client, adapter):
    return {k: np.asarray(v, np.float64) for k, v in client.stream_weights(adapter=adapter)}


def make(daemon, name, seed):
    cfg, lora_kw = FAMILIES[name]
    torch.manual_seed(seed)
    base = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    mdir, adir = "base-" + name, "adapter-" + name
    base.save_pretrained(os.path.join(daemon.model_root, mdir))
    pmodel = peft.get_peft_model(base, peft.LoraConfig(lora_dropout=0.0, init_lora_weights=False,
                                                       **lora_kw))
    pmodel.save_pretrained(os.path.join(daemon.model_root, adir))
    return pmodel, mdir, adir


def rel(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_adapter_matches_peft(daemon, client, name):
    pmodel, mdir, adir = make(daemon, name, 5)
    client.initialize(replace=True, model_path=mdir, frozen_base=True)
    base0 = {k: np.asarray(v) for k, v in client.stream_weights()}
    client.create_adapter("a", peft_dir=adir, optimizer={
        "lr": BIG, "beta1": 0.9, "beta2": 0.0, "eps": BIG, "weight_decay": 0.0,
        "clip_grad": 0.0})
    ids, w = batch(7)
    params = lora_params(pmodel)
    a0 = engined_tensors(client, "a")
    assert sorted(a0) == sorted(params), "engined's tensors are peft's"
    for k, p in params.items():
        assert np.array_equal(a0[k], p.detach().double().numpy()), k

    # log-probs with the adapter, and without it (the base alone)
    lp = np.asarray(client.forward_backward(ids, LENS, forward_only=True,
                                            return_log_probs=True, adapter="a")["log_probs"])
    with torch.no_grad():
        ref = torch_logprobs(pmodel, ids).double().numpy()
        with pmodel.disable_adapter():
            ref_base = torch_logprobs(pmodel, ids).double().numpy()
    lp_base = np.asarray(client.forward_backward(ids, LENS, forward_only=True,
                                                 return_log_probs=True)["log_probs"])
    d, db = float(np.max(np.abs(lp - ref))), float(np.max(np.abs(lp_base - ref_base)))
    print("%s: log-probs with the adapter %.3g, base alone %.3g (adapter moves them %.3g)"
          % (name, d, db, float(np.max(np.abs(ref - ref_base)))))
    assert d <= 1e-5 and db <= 1e-5
    assert float(np.max(np.abs(ref - ref_base))) > 1e-3, "the adapter must matter"

    # gradients, through one step whose update is g / (1 + |g| / BIG)
    pmodel.zero_grad()
    (torch_logprobs(pmodel, ids) * torch.as_tensor(w)).sum().backward()
    client.forward_backward(ids, LENS, loss="custom", grad_log_probs=w, adapter="a")
    client.optimizer_step(adapter="a")
    a1 = engined_tensors(client, "a")
    worst = 0.0
    for k, p in params.items():
        g = p.grad.double().numpy()
        upd = a0[k] - a1[k]
        worst = max(worst, rel(upd, g / (1 + np.abs(g) / BIG)))
    print("%s: adapter gradients, max relative difference %.3g" % (name, worst))
    assert worst <= 1e-5

    # 3 AdamW steps against torch's, from the same start
    client.delete_adapter("a")
    opt = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    client.create_adapter("a", peft_dir=adir, optimizer={
        "lr": opt["lr"], "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.01,
        "clip_grad": 0.0})
    torch_opt = torch.optim.AdamW(list(params.values()), **opt)
    for step in range(3):
        ids, w = batch(20 + step)
        torch_opt.zero_grad()
        (torch_logprobs(pmodel, ids) * torch.as_tensor(w)).sum().backward()
        torch_opt.step()
        client.forward_backward(ids, LENS, loss="custom", grad_log_probs=w, adapter="a")
        assert client.optimizer_step(adapter="a").step == step + 1
    a3 = engined_tensors(client, "a")
    diff = max(float(np.max(np.abs(a3[k] - p.detach().double().numpy())))
               for k, p in params.items())
    print("%s: adapter after 3 AdamW steps, max |engined - torch| %.3g" % (name, diff))
    assert diff <= 1e-6

    # the base: bit for bit what it was
    for k, v in client.stream_weights():
        assert np.array_equal(np.asarray(v), base0[k]), k

    # the three streams: merged against peft's merge_and_unload, the base
    # under verl's names
    merged_ref = copy.deepcopy(pmodel).merge_and_unload().state_dict()
    merged = {k: np.asarray(v, np.float64)
              for k, v in client.stream_weights(adapter="a", adapter_view="merged")}
    assert sorted(merged) == sorted(k for k in merged_ref if k in base0 or k == "lm_head.weight")
    dm = max(float(np.max(np.abs(v - merged_ref[k].double().numpy()))) for k, v in merged.items())
    print("%s: merged stream vs merge_and_unload, max difference %.3g" % (name, dm))
    assert dm <= 1e-6
    based = dict(client.stream_weights(adapter="a", adapter_view="base"))
    for k, v in base0.items():
        mod = k.rsplit(".", 1)[0]
        if mod.endswith(("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                         "down_proj")):
            k = mod + ".base_layer." + k.rsplit(".", 1)[1]
        assert np.array_equal(np.asarray(based[k]), v), k
    assert len(based) == len(base0)

    # the adapter's checkpoint: peft loads it; LoadCheckpoint restores it
    ids, _ = batch(40)
    lp = np.asarray(client.forward_backward(ids, LENS, forward_only=True,
                                            return_log_probs=True, adapter="a")["log_probs"])
    client.save_checkpoint("lora-" + name, global_step=3, adapter="a")
    path = os.path.join(daemon.ckpt_root, "lora-" + name)
    base = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.join(daemon.model_root, mdir), dtype=torch.float32)
    loaded = peft.PeftModel.from_pretrained(base, path).eval()
    with torch.no_grad():
        ref = torch_logprobs(loaded, ids).double().numpy()
    dl = float(np.max(np.abs(lp - ref)))
    print("%s: peft's model from engined's checkpoint, log-probs %.3g" % (name, dl))
    assert dl <= 1e-5
    before = engined_tensors(client, "a")
    client.forward_backward(ids, LENS, loss="custom", grad_log_probs=w, adapter="a")
    client.optimizer_step(adapter="a")
    assert int(client.load_checkpoint("lora-" + name, adapter="a")) == 3
    after = engined_tensors(client, "a")
    assert all(np.array_equal(after[k], before[k]) for k in before)
    assert client.get_status(adapter="a").step == 3
