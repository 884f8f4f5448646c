#!/usr/bin/env python3
"""make_corpus.py — write the seed corpus of the libFuzzer harnesses
(tests/fuzz/corpus/<harness>/), a few real inputs each. The files are
committed; run this again only to change them:

    build/venv-pypi/bin/python tests/fuzz/make_corpus.py \\
        --build build --fuzz-build build-san

Needs the protoc stubs of the main build (build/client/python/
engine_pb2.py), the PyPI safetensors package with torch (the venv), and
the fuzz build's fuzz_ckpt_state (it saves the real checkpoint whose
engine_state.json seeds its corpus). Each input's format is described at
the top of its harness.
"""
import argparse
import json
import os
import re
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# The rows of daemon/methods.c's table, in order (fuzz_request's byte 0).
ROWS = ["Initialize", "SetMode", "ForwardBackward", "OptimizerStep", "ZeroGrad", "LrSchedulerStep",
        "ToDevice", "GetPerTensorParam", "SaveCheckpoint", "LoadCheckpoint", "GetStatus", "CreateGroup",
        "Health.Check", "Health.Watch", "Reflection.v1alpha", "Reflection.v1", "ShareWeights",
        "CreateAdapter", "DeleteAdapter", "Sample"]
VALUE_MODEL = 0x80

# LOSS_REQUEST_INPUTS of engines/loss/loss.h, in order (fuzz_loss_spec's byte 0).
INPUTS = ["loss_mask", "old_log_probs", "ref_log_probs", "advantages", "returns",
          "old_values", "is_weights", "token_weights"]


def write(harness, name, data):
    d = os.path.join(HERE, "corpus", harness)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def c_strings(path, anchor_re):
    """The C string each match of anchor_re starts: its adjacent literals
    joined, escapes decoded."""
    src = open(path).read()
    lit = r'"(?:[^"\\]|\\.)*"'
    out = []
    for m in re.finditer(anchor_re + r'((?:' + lit + r'\s*)+)', src):
        parts = re.findall(lit, m.group(1))
        out.append("".join(bytes(x[1:-1], "utf-8").decode("unicode_escape") for x in parts))
    return out


# --- fuzz_model_config ----------------------------------------------------

def model_configs():
    presets = c_strings(os.path.join(ROOT, "daemon/presets.c"), r'\{ "[a-z0-9.\-]+",\s*')
    assert len(presets) >= 3, presets
    for i, text in enumerate(presets):
        json.loads(text)
        write("fuzz_model_config", "preset-%d.json" % i, text.encode())
    tiny_qwen2 = c_strings(os.path.join(ROOT, "tests/unit/test_helpers.h"),
                           r'TINY_QWEN2 =\s*')[0]
    write("fuzz_model_config", "tiny-qwen2.json", tiny_qwen2.encode())
    write("fuzz_model_config", "qwen3.json", json.dumps({
        "model_type": "qwen3", "vocab_size": 151, "hidden_size": 64,
        "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "attention_bias": True,
        "rope_theta": 1000000.0, "sliding_window": None, "use_sliding_window": False,
        "tie_word_embeddings": True}).encode())
    write("fuzz_model_config", "llama3-rope.json", json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128,
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
        "num_attention_heads": 4, "num_key_value_heads": 1, "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-05, "hidden_act": "silu", "mlp_bias": False,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192}}).encode())
    write("fuzz_model_config", "mistral-params.json", json.dumps({
        "model_type": "mistral", "vocab_size": 32, "hidden_size": 32,
        "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
        "sliding_window": 131072, "initializer_range": 0.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}).encode())
    # A value model's checkpoint config (what engined writes, as
    # transformers writes it for *ForTokenClassification with one label).
    write("fuzz_model_config", "qwen2-token-cls.json", json.dumps({
        "architectures": ["Qwen2ForTokenClassification"], "id2label": {"0": "LABEL_0"},
        "label2id": {"LABEL_0": 0}, "model_type": "qwen2", "vocab_size": 64,
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 2, "use_sliding_window": False}).encode())
    # Mixtures of experts: a qwen3_moe with a dense layer among sparse ones,
    # a mixtral, a qwen2_moe with its shared expert and an olmoe (issue 31).
    write("fuzz_model_config", "qwen3-moe.json", json.dumps({
        "model_type": "qwen3_moe", "vocab_size": 64, "hidden_size": 32,
        "intermediate_size": 64, "moe_intermediate_size": 16, "num_hidden_layers": 3,
        "num_attention_heads": 2, "head_dim": 16, "num_experts": 8,
        "num_experts_per_tok": 2, "norm_topk_prob": False, "decoder_sparse_step": 1,
        "mlp_only_layers": [1], "router_aux_loss_coef": 0.001,
        "output_router_logits": False}).encode())
    write("fuzz_model_config", "mixtral.json", json.dumps({
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "vocab_size": 64,
        "hidden_size": 32, "intermediate_size": 16, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "num_local_experts": 4,
        "num_experts_per_tok": 2, "router_jitter_noise": 0.0,
        "sliding_window": None}).encode())
    write("fuzz_model_config", "qwen2-moe.json", json.dumps({
        "model_type": "qwen2_moe", "vocab_size": 64, "hidden_size": 32,
        "intermediate_size": 64, "moe_intermediate_size": 16,
        "shared_expert_intermediate_size": 24, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_experts": 4, "num_experts_per_tok": 2,
        "qkv_bias": True, "mlp_only_layers": [0], "use_sliding_window": False}).encode())
    write("fuzz_model_config", "olmoe.json", json.dumps({
        "model_type": "olmoe", "vocab_size": 64, "hidden_size": 32,
        "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
        "num_experts": 4, "num_experts_per_tok": 2, "pad_token_id": 1,
        "clip_qkv": None}).encode())


# --- fuzz_request ---------------------------------------------------------

def requests(pb):
    def req(name, msg, flags=0, tag=""):
        data = msg if isinstance(msg, bytes) else msg.SerializeToString()
        write("fuzz_request", "%s%s" % (name.lower().replace(".", "-"), tag),
              bytes([ROWS.index(name) | flags]) + data)

    def tensor(dtype, values):
        fmt = {pb.INT32: "<%di", pb.FLOAT32: "<%df"}[dtype]
        return pb.Tensor(dtype=dtype, shape=[len(values)],
                         data=struct.pack(fmt % len(values), *values))

    req("Initialize", pb.InitializeRequest(preset="tiny", seed=3))
    req("Initialize", pb.InitializeRequest(
        model_type="value_model", hf_config_json=open(os.path.join(
            HERE, "corpus/fuzz_model_config/tiny-qwen2.json")).read(),
        optimizer=pb.OptimizerConfig(lr=1e-4, beta1=0.9, beta2=0.95, eps=1e-8,
                                     weight_decay=0.1, clip_grad=1.0),
        lr_scheduler=pb.LrSchedulerConfig(type="cosine", warmup_steps=10, total_steps=100,
                                          min_lr_ratio=0.1, num_cycles=0.5),
        offload=pb.OffloadConfig(param_offload=True), max_tokens_per_micro_batch=2048,
        dist=pb.DistConfig(rank=0, world_size=1), bf16_matmul=True), tag="-full")
    req("Initialize", pb.InitializeRequest(model_path="tiny", device="cpu"), tag="-path")
    req("SetMode", pb.SetModeRequest(mode=pb.MODE_TRAIN, disable_auto_offload=True))
    ids = tensor(pb.INT32, [1, 5, 9, 2, 7, 3, 3, 8])
    n = 8
    req("ForwardBackward", pb.ForwardBackwardRequest(
        input_ids=ids, seq_lens=[3, 5], loss=pb.LossSpec(name="sft"),
        return_log_probs=True), tag="-sft")
    req("ForwardBackward", pb.ForwardBackwardRequest(
        input_ids=ids, seq_lens=[3, 5],
        loss_mask=tensor(pb.FLOAT32, [0, 1, 1, 0, 1, 1, 1, 1]),
        old_log_probs=tensor(pb.FLOAT32, [-1.5] * n),
        ref_log_probs=tensor(pb.FLOAT32, [-1.25] * n),
        advantages=tensor(pb.FLOAT32, [0.5, -0.5, 1, 2, -1, 0, 0.25, 3]),
        temperature=0.7, max_tokens_per_micro_batch=4,
        loss=pb.LossSpec(name="ppo", options={
            "policy_loss": "vanilla", "clip_ratio": "0.2", "kl_coef": "0.05",
            "kl_type": "low_var_kl", "entropy_coeff": "0.01",
            "loss_agg_mode": "seq-mean-token-mean"})), tag="-ppo")
    req("ForwardBackward", pb.ForwardBackwardRequest(
        input_ids=ids, seq_lens=[8],
        returns=tensor(pb.FLOAT32, [1.0] * n), old_values=tensor(pb.FLOAT32, [0.5] * n),
        loss=pb.LossSpec(name="value", options={"cliprange_value": "0.5"}),
        return_values=True), flags=VALUE_MODEL, tag="-value")
    req("ForwardBackward", pb.ForwardBackwardRequest(
        input_ids=ids, seq_lens=[2, 2, 4], forward_only=True, return_entropy=True),
        tag="-forward")
    req("ForwardBackward", pb.ForwardBackwardRequest(
        input_ids=ids, seq_lens=[3, 5], forward_only=True, return_routed_experts=True,
        routed_experts=pb.Tensor(dtype=pb.INT32, shape=[8, 1, 2], data=struct.pack(
            "<16i", *[(j + d) % 4 for j in range(8) for d in (0, 1)]))), tag="-routed")
    req("ForwardBackward", pb.ForwardBackwardRequest(
        input_ids=ids, seq_lens=[3, 5], loss=pb.LossSpec(name="custom"),
        grad_log_probs=tensor(pb.FLOAT32, [0.1, -0.2, 0.3, 0, 1, -1, 0.5, 2]),
        grad_entropy=tensor(pb.FLOAT32, [0.01] * n),
        target_ids=tensor(pb.INT32, [0, 4, 4, 0, 1, 2, 3, 15])), tag="-custom")
    req("OptimizerStep", pb.OptimizerStepRequest())
    req("OptimizerStep", pb.OptimizerStepRequest(lr=0.0, beta1=0.5, beta2=0.9, eps=1e-6,
                                                 weight_decay=0.0, clip_grad=0.5),
        tag="-params")
    req("ZeroGrad", pb.ZeroGradRequest())
    req("LrSchedulerStep", pb.LrSchedulerStepRequest())
    req("ToDevice", pb.ToDeviceRequest(device="cpu", model=True, optimizer=True, grad=True))
    req("GetPerTensorParam", pb.GetPerTensorParamRequest(
        dtype=pb.BFLOAT16, names=["model.norm.weight"], bucket_bytes=1 << 20))
    req("SaveCheckpoint", pb.SaveCheckpointRequest(
        path="run/step-2", global_step=2, max_to_keep=3, contents=["model", "optimizer"]))
    req("LoadCheckpoint", pb.LoadCheckpointRequest(path="run/step-1", contents=["extra"]))
    req("GetStatus", pb.GetStatusRequest())
    req("CreateGroup", pb.CreateGroupRequest(device="cpu", world_size=3))
    req("ShareWeights", pb.ShareWeightsRequest(
        dtype=pb.BFLOAT16, names=["model.norm.weight", "lm_head.weight"], uses=4))
    req("ShareWeights", pb.ShareWeightsRequest(), tag="-all")
    req("Initialize", pb.InitializeRequest(preset="tiny", frozen_base=True), tag="-frozen")
    req("CreateAdapter", pb.CreateAdapterRequest(
        name="tenant-a", rank=8, alpha=16.0, target_modules=["q_proj", "v_proj"], seed=7))
    req("CreateAdapter", pb.CreateAdapterRequest(
        name="b.2", rank=4, target_modules=["all-linear"], use_rslora=True,
        optimizer=pb.OptimizerConfig(lr=1e-3, weight_decay=0.0),
        lr_scheduler=pb.LrSchedulerConfig(type="linear", warmup_steps=2, total_steps=10)),
        tag="-full")
    req("CreateAdapter", pb.CreateAdapterRequest(
        name="from-peft", peft_dir="tiny",
        target_modules=["model.layers.0.self_attn.q_proj"]), tag="-peft")
    req("DeleteAdapter", pb.DeleteAdapterRequest(name="tenant-a"))
    req("ForwardBackward", pb.ForwardBackwardRequest(
        input_ids=ids, seq_lens=[3, 5], loss=pb.LossSpec(name="sft"), adapter="tenant-a"),
        tag="-adapter")
    req("OptimizerStep", pb.OptimizerStepRequest(lr=1e-2, adapter="tenant-a"), tag="-adapter")
    req("GetStatus", pb.GetStatusRequest(adapter="tenant-a"), tag="-adapter")
    req("GetPerTensorParam", pb.GetPerTensorParamRequest(adapter="tenant-a"), tag="-adapter")
    req("Sample", pb.SampleRequest(input_ids=ids, seq_lens=[3, 5], max_tokens=16))
    req("Sample", pb.SampleRequest(
        input_ids=ids, seq_lens=[1, 2, 5], num_samples=4, max_tokens=64, temperature=0.7,
        top_k=20, top_p=0.9, seed=11, stop_token_ids=[2, 9],
        stop_sequences=[pb.StopSequence(token_ids=[3, 3]), pb.StopSequence(token_ids=[8])],
        top_logprobs=5, prompt_logprobs=True, adapter="tenant-a",
        max_tokens_per_micro_batch=4), tag="-full")

    def s(field, text):   # a length-delimited string field
        b = text.encode()
        return bytes([field << 3 | 2, len(b)]) + b
    req("Health.Check", s(1, "engined.v1.TrainingEngine"))
    req("Health.Watch", s(1, ""))
    req("Reflection.v1", s(1, "localhost") + bytes([7 << 3 | 2, 1]) + b"*", tag="-list")
    req("Reflection.v1", s(4, "engined.v1.ForwardBackwardRequest"), tag="-symbol")
    req("Reflection.v1alpha", s(3, "engined/v1/engine.proto"), tag="-file")
    ext = s(1, "engined.v1.Tensor") + bytes([2 << 3, 100])
    req("Reflection.v1alpha", bytes([5 << 3 | 2, len(ext)]) + ext, tag="-extension")


# --- fuzz_safetensors -----------------------------------------------------

def safetensors_files():
    import torch
    from safetensors.torch import save

    def st(tensors, metadata=None):
        return save(tensors, metadata=metadata)
    write("fuzz_safetensors", "f32-bf16-f16", b"\0" + st({
        "model.embed_tokens.weight": torch.arange(12, dtype=torch.float32).reshape(3, 4),
        "model.norm.weight": torch.ones(4, dtype=torch.bfloat16),
        "lm_head.weight": torch.full((2, 2), -0.5, dtype=torch.float16)},
        metadata={"format": "pt"}))
    write("fuzz_safetensors", "other-dtypes", b"\0" + st({
        "a": torch.zeros(2, 3, dtype=torch.int64), "b": torch.ones(1, dtype=torch.float32),
        "scalar": torch.tensor(2.0), "empty": torch.zeros(0, 5)}))
    write("fuzz_safetensors", "no-tensors", b"\0" + st({}))
    shard1 = st({"a": torch.tensor([1.0, 2.0, 3.0])}, metadata={"format": "pt"})
    index = json.dumps({"metadata": {"total_size": 20}, "weight_map": {
        "a": "model-00001-of-00002.safetensors",
        "b": "model-00002-of-00002.safetensors"}}).encode()
    write("fuzz_safetensors", "sharded", b"\1" + struct.pack("<H", len(index)) + index + shard1)


# --- fuzz_ckpt_state ------------------------------------------------------

def ckpt_states(harness):
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, FUZZ_CKPT_PRINT_STATE="1", TMPDIR=tmp)
        state = subprocess.run([harness, "-runs=0", tmp], env=env, check=True,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout
    doc = json.loads(state)
    assert doc["engine_key"] == "language_model/native/cpu", doc
    for contents in (0, 1, 2, 4, 7):
        write("fuzz_ckpt_state", "state-%d" % contents, bytes([contents]) + state)
    edited = dict(doc, global_step=-3, optimizer_step=2 ** 62, lr_scheduler_step="x",
                  rng_state=["0", "0", "0", "1"])
    write("fuzz_ckpt_state", "state-edited", b"\7" + json.dumps(edited, indent=2).encode())
    other = dict(doc, engine_key="value_model/native/cpu", contents=["model"])
    write("fuzz_ckpt_state", "state-other-engine", b"\0" + json.dumps(other).encode())
    # Bit 4: the harness seals the edited state, so that the schema is reached.
    write("fuzz_ckpt_state", "state-edited-sealed",
          b"\x17" + json.dumps(dict(edited, global_step=3)).encode())
    write("fuzz_ckpt_state", "state-other-engine-sealed", b"\x10" + json.dumps(other).encode())
    for key in ("optimizer", "lr_scheduler", "rng_state", "contents"):
        write("fuzz_ckpt_state", "state-without-%s-sealed" % key,
              b"\x17" + json.dumps({k: v for k, v in doc.items() if k != key}).encode())
    write("fuzz_ckpt_state", "latest", b"\x08ck\n")
    write("fuzz_ckpt_state", "latest-escape", b"\x0f../ck")


# --- fuzz_loss_spec -------------------------------------------------------

def loss_specs():
    def spec(name, inputs, text, value_model=False, seed=0):
        mask = sum(1 << INPUTS.index(i) for i in inputs)
        write("fuzz_loss_spec", name, bytes([mask, (seed << 2) | int(value_model)]) +
              text.encode())
    ppo_in = ["loss_mask", "old_log_probs", "advantages"]
    spec("sft", ["loss_mask"], "sft\n")
    spec("cross-entropy", ["token_weights"], "cross_entropy\nloss_agg_mode=token-sum\n")
    spec("ppo", ppo_in, "ppo\npolicy_loss=vanilla\nclip_ratio=0.2\nclip_ratio_c=3\n"
         "loss_agg_mode=token-mean\n", seed=1)
    spec("ppo-kl", ppo_in + ["ref_log_probs"], "ppo\nkl_coef=0.1\nkl_type=low_var_kl+\n"
         "entropy_coeff=0.01\nclip_ratio_low=0.2\nclip_ratio_high=0.28\n", seed=2)
    for i, pl in enumerate(["gspo", "cispo", "gpg", "sapo", "clip_cov", "kl_cov",
                            "geo_mean"]):
        spec("ppo-" + pl, ppo_in + ["is_weights"], "ppo\nloss_mode=%s\n"
             "loss_agg_mode=seq-mean-token-sum-norm\nloss_scale_factor=16\n" % pl, seed=3 + i)
    spec("ppo-cov-ratios", ppo_in, "ppo\npolicy_loss=kl_cov\nkl_cov_ratio=0.5\n"
         "clip_cov_ratio=0.1\nclip_cov_lb=0.5\nclip_cov_ub=4\nppo_kl_coef=0.2\nseed=42\n")
    spec("importance-sampling", ppo_in, "importance_sampling\n")
    spec("value", ["returns", "old_values", "loss_mask"], "value\ncliprange_value=0.5\n",
         value_model=True)
    spec("dro", ["old_log_probs", "advantages"], "dro\nbeta=0.05\n")
    spec("global-norms", ppo_in, "ppo\nglobal_num_tokens=4096\nglobal_batch_size=32.0\n"
         "dp_size=4\nkl_loss_coef=0.001\nkl_loss_type=k2\ntau_pos=1\ntau_neg=1.05\n")


# --- fuzz_planner ---------------------------------------------------------

def planner_inputs():
    def plan(name, budget, lens):
        write("fuzz_planner", name, struct.pack("<q%di" % len(lens), budget, *lens))
    plan("even", 16, [4, 4, 4, 4, 4, 4, 4, 4])
    plan("mixed", 4096, [1000, 3000, 17, 4096, 2048, 2047, 1, 1, 900])
    plan("thirds", 99, [34] * 20)
    plan("one-too-long", 10, [3, 11, 2])
    plan("single", 1, [1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build", help="the main build (engine_pb2.py)")
    ap.add_argument("--fuzz-build", default="build-san", help="the -Dfuzz=true build")
    a = ap.parse_args()
    sys.path.insert(0, os.path.join(a.build, "client/python"))
    import engine_pb2
    model_configs()
    requests(engine_pb2)
    safetensors_files()
    ckpt_states(os.path.join(a.fuzz_build, "tests/fuzz/fuzz_ckpt_state"))
    loss_specs()
    planner_inputs()


if __name__ == "__main__":
    main()
