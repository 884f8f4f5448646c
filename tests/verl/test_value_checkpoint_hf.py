"""A value model's checkpoint is a transformers model directory (issue 14,
item 3): what engined saves for a value model loads with the real
transformers' AutoModelForTokenClassification (no missing, unexpected or
mismatched keys; one label) and computes engined's values; engined reads it
back as a value model with the same values, and refuses it as a language
model. The other way too: a *ForTokenClassification directory that
transformers saved (one label) initializes engined's value model with
transformers' values; one of three labels is refused. The reference is
transformers itself (float32, CPU), each sequence on its own.

engined's values are target-aligned: values[t] = V(h[t-1]) inside each
packed sequence and entry 0 is 0; transformers' logits[0, t, 0] = V(h[t]),
so values[off + t] is compared with logits[t - 1].

Needs torch and transformers: meson runs it with BUILD/venv-verl's python
(tests/verl/setup_venv.sh); by hand:
  ENGINED_BIN=build/daemon/engined PYTHONPATH=client/python:build/client/python \\
    build/venv-verl/bin/python -m pytest -c tests/integration/pytest.ini \\
    tests/verl/test_value_checkpoint_hf.py
"""
import json
import os
import shutil
import sys

import grpc
import numpy as np
import pytest

import torch
import transformers
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                "integration"))
from rpc_expect import expect  # noqa: E402

SC = grpc.StatusCode
TOL = 1e-5
LENS = [12, 7, 20]
N = sum(LENS)

BASE = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
            rms_norm_eps=1e-6, initializer_range=0.02, tie_word_embeddings=False)

# name: (Initialize's source, the class a value checkpoint must name)
CASES = {
    "llama_tiny_preset": (dict(preset="tiny"), "LlamaForTokenClassification"),
    "llama_attention_bias": (dict(hf_config_json=dict(
        BASE, model_type="llama", architectures=["LlamaForCausalLM"], attention_bias=True,
        rope_theta=500000.0)), "LlamaForTokenClassification"),
    "qwen2_qkv_bias": (dict(hf_config_json=dict(
        BASE, model_type="qwen2", architectures=["Qwen2ForCausalLM"], rope_theta=1000000.0,
        use_sliding_window=False)), "Qwen2ForTokenClassification"),
    "qwen3_qk_norm": (dict(hf_config_json=dict(
        BASE, model_type="qwen3", head_dim=32, rope_theta=1000000.0)),
        "Qwen3ForTokenClassification"),
    "mistral_gqa": (dict(hf_config_json=dict(
        BASE, model_type="mistral", num_key_value_heads=1, sliding_window=None)),
        "MistralForTokenClassification"),
}


def batch(vocab, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, vocab, N).astype(np.int32)


def values(client, ids):
    v = client.forward_backward(ids, LENS, forward_only=True, return_values=True)["values"]
    return np.asarray(v, np.float64)


def load_hf(path):
    """transformers' AutoModelForTokenClassification from path, asserting
    that every key loaded as it is."""
    model, info = transformers.AutoModelForTokenClassification.from_pretrained(
        path, dtype=torch.float32, output_loading_info=True)
    for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        assert not info.get(k), "%s: %s" % (k, info[k])
    return model.eval()


def hf_values(model, ids):
    """Target-aligned values from transformers, sequence by sequence."""
    out = np.zeros(N)
    off = 0
    with torch.no_grad():
        for n in LENS:
            x = torch.as_tensor(ids[off:off + n], dtype=torch.long)[None]
            logits = model(input_ids=x).logits
            assert logits.shape == (1, n, 1)
            out[off + 1:off + n] = logits[0, :n - 1, 0].double().numpy()
            off += n
    return out


def check_against_hf(v, model, ids, what):
    ref = hf_values(model, ids)
    starts = np.cumsum([0] + LENS[:-1])
    assert np.all(v[starts] == 0.0), "entry 0 of each sequence must be 0: %s" % v[starts]
    diff = float(np.max(np.abs(v - ref)))
    print("%s: max |engined - transformers| %.3g over %d values (|v| up to %.3g)"
          % (what, diff, N - len(LENS), float(np.max(np.abs(ref)))))
    assert diff <= TOL, "%s: engined vs transformers %.3g" % (what, diff)


@pytest.mark.parametrize("name", sorted(CASES))
def test_value_checkpoint_loads_in_transformers(daemon, client, name):
    source, cls = CASES[name]
    client.initialize(replace=True, model_type="value_model", seed=7,
                      optimizer={"lr": 1e-2, "weight_decay": 0.0, "clip_grad": 0.0}, **source)
    vocab = source["hf_config_json"]["vocab_size"] if "hf_config_json" in source else 1024
    ids = batch(vocab, 3)
    rng = np.random.default_rng(4)
    # One value-loss step, so that score.bias (zero at init) moves.
    client.forward_backward(ids, LENS, loss="value", returns=rng.normal(1, 0.5, N).astype(
        np.float32), old_values=np.zeros(N, np.float32))
    client.optimizer_step()
    v = values(client, ids)
    ck = "critic/" + name
    client.save_checkpoint(ck, global_step=1)
    path = os.path.join(daemon.ckpt_root, ck)

    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    assert cfg["architectures"] == [cls]
    assert cfg["id2label"] == {"0": "LABEL_0"} and cfg["label2id"] == {"LABEL_0": 0}

    model = load_hf(path)
    assert type(model).__name__ == cls
    assert model.config.num_labels == 1
    bias = float(model.score.bias.detach()[0])
    assert bias != 0.0, "the step must move score.bias"
    check_against_hf(v, model, ids, name)

    # engined reads it back: a value model with the same values (another
    # seed would draw another score head) ...
    mdir = "critic-" + name
    os.makedirs(os.path.join(daemon.model_root, mdir))
    for f in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(path, f), os.path.join(daemon.model_root, mdir, f))
    client.initialize(replace=True, model_type="value_model", seed=99, model_path=mdir)
    assert np.array_equal(values(client, ids), v)
    # ... and refuses it as a language model: it has no lm_head.
    expect(SC.INVALID_ARGUMENT, client.initialize, replace=True, model_type="language_model",
           model_path=mdir, field="architectures[0]: %s is a value model's class" % cls)


def hf_token_cls(family, num_labels, seed):
    """A randomly initialized transformers *ForTokenClassification (its
    score.bias set non-zero)."""
    conf_cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}[family]
    kw = {k: v for k, v in BASE.items()}
    if family == "qwen2":
        kw.update(rope_theta=1000000.0, use_sliding_window=False)
    torch.manual_seed(seed)
    model = transformers.AutoModelForTokenClassification.from_config(
        conf_cls(num_labels=num_labels, **kw), dtype=torch.float32)
    with torch.no_grad():
        model.score.bias.normal_(0, 0.5)
    return model.eval()


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_transformers_token_cls_directory_initializes_a_value_model(daemon, client, family):
    model = hf_token_cls(family, 1, 11)
    mdir = "hf-%s-1" % family
    model.save_pretrained(os.path.join(daemon.model_root, mdir))
    client.initialize(replace=True, model_type="value_model", model_path=mdir)
    ids = batch(BASE["vocab_size"], 5)
    check_against_hf(values(client, ids), model, ids, "transformers' %s directory" % family)


def test_more_than_one_label_is_refused(daemon, client):
    model = hf_token_cls("qwen2", 3, 12)
    mdir = "hf-qwen2-3"
    model.save_pretrained(os.path.join(daemon.model_root, mdir))
    expect(SC.INVALID_ARGUMENT, client.initialize, replace=True, model_type="value_model",
           model_path=mdir, field="id2label: 3 labels (Qwen2ForTokenClassification); "
           "engined's value head has one output (num_labels 1)")
    cfg = dict(BASE, model_type="llama", architectures=["LlamaForTokenClassification"],
               num_labels=2)
    expect(SC.INVALID_ARGUMENT, client.initialize, replace=True, model_type="value_model",
           hf_config_json=cfg, field="hf_config_json: num_labels: 2 labels")
