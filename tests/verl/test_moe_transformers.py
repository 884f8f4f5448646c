"""Mixture-of-experts models against transformers itself (issue 31): tiny
random qwen3_moe, qwen2_moe, mixtral and olmoe models (hidden 64, 8
experts, top-2; qwen models with a dense layer among their sparse ones
and un-normalised top-k weights, qwen2_moe's shared expert and its sigmoid
gate, olmoe's q/k norms over the whole projections) saved by transformers
and loaded from their directories;
engined must reproduce, with transformers' model (float32, CPU) as the
reference:
  - log-probs within 1e-5;
  - every parameter's gradient within 1e-5 relative (the router's through
    the top-k weights): read through one AdamW step with lr = eps = 1e4,
    beta2 = 0 and no decay or clipping, whose update is g / (1 + |g| / 1e4);
  - the parameters after 3 AdamW steps (torch.optim.AdamW, lr 1e-3) within
    1e-6, with eps 1e-2 as tests/parity/test_parity.py explains (with eps
    1e-8 an element whose gradient is at fp32 noise level takes a full
    lr-sized step of either sign: lm_head.weight alone then differs by
    3.8e-6 from torch);
  - a checkpoint that transformers loads back (per-expert tensors, the
    names vLLM and SGLang load), reproducing engined's log-probs;
  - Sample's log-probs (decoding through the key/value cache, a token at
    a time through the router) those of transformers over the sequence;
  - activation recompute: the parameters after a step bit for bit;
  - a directory in transformers 5's packed layout loads as the per-expert
    one does, bit for bit;
  - with output_router_logits, the router's auxiliary loss
    (load_balancing_loss_func) within 1e-6, the gradients with it within
    1e-5 relative, and each experts layer's load exactly.
The routers are made decisive (their weights x10): at initializer_range
every logit is within ~0.2 of the others, so a choice fp32 noise could
flip would make the two runs train different experts (an expert then
differed by 1.2e-4 after 3 steps), which is what routing replay is for,
not this test.
transformers 5 holds each layer's experts packed (experts.gate_up_proj
[E, 2I, C], experts.down_proj [E, C, I]) and saves them per expert; the
comparison slices the packed tensors into the saved names.
The loss is sum_t w_t log p_t with fixed weights: engined gets dL/dlog_p =
w as the custom loss's gradients, torch differentiates the same sum.

Needs torch and transformers: meson runs it with BUILD/venv-verl's python
(tests/verl/setup_venv.sh); by hand:
  ENGINED_BIN=build/daemon/engined PYTHONPATH=client/python:build/client/python \\
    build/venv-verl/bin/python -m pytest -c tests/integration/pytest.ini \\
    tests/verl/test_moe_transformers.py
"""
import os

import numpy as np
import pytest

import torch
import transformers

import hf_reference

LENS = [12, 7, 20]
N = sum(LENS)
BASE = dict(vocab_size=300, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=512, rms_norm_eps=1e-6, initializer_range=0.02,
            tie_word_embeddings=False, num_experts_per_tok=2)
FAMILIES = {
    "qwen3_moe": transformers.Qwen3MoeConfig(
        **BASE, num_hidden_layers=3, head_dim=32, intermediate_size=96,
        moe_intermediate_size=48, num_experts=8, norm_topk_prob=False,
        decoder_sparse_step=1, mlp_only_layers=[1], rope_theta=1000000.0),
    "mixtral": transformers.MixtralConfig(
        **BASE, num_hidden_layers=2, intermediate_size=48, num_local_experts=8,
        rope_theta=1000000.0),
    "qwen2_moe": transformers.Qwen2MoeConfig(
        **BASE, num_hidden_layers=3, intermediate_size=96, moe_intermediate_size=48,
        shared_expert_intermediate_size=80, num_experts=8, norm_topk_prob=False,
        decoder_sparse_step=1, mlp_only_layers=[0], rope_theta=1000000.0),
    "olmoe": transformers.OlmoeConfig(
        **BASE, num_hidden_layers=2, intermediate_size=48, num_experts=8,
        norm_topk_prob=True, rope_theta=10000.0, eos_token_id=None),
}
BIG = 1e4   # lr and eps of the gradient-reading step


def batch(seed):
    return hf_reference.batch(seed, LENS, BASE["vocab_size"])


def torch_logprobs(model, ids):
    return hf_reference.torch_logprobs(model, ids, LENS)


def saved_names(model, family, grad=False):
    """The model's tensors (or their gradients) under the names
    save_pretrained writes, the packed experts sliced per expert."""
    mx = family == "mixtral"
    proj = ("w1", "w3", "w2") if mx else ("gate_proj", "up_proj", "down_proj")
    out = {}
    for k, p in model.named_parameters():
        t = (p.grad if p.grad is not None else torch.zeros_like(p)) if grad else p
        t = t.detach().double().numpy()
        if mx:
            k = k.replace(".mlp.", ".block_sparse_moe.")
        if k.endswith("experts.gate_up_proj"):
            half = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[k[:-len("gate_up_proj")] + "%d.%s.weight" % (e, proj[0])] = t[e, :half]
                out[k[:-len("gate_up_proj")] + "%d.%s.weight" % (e, proj[1])] = t[e, half:]
        elif k.endswith("experts.down_proj"):
            for e in range(t.shape[0]):
                out[k[:-len("down_proj")] + "%d.%s.weight" % (e, proj[2])] = t[e]
        else:
            out[k] = t
    return out


def engined_tensors(client):
    return {k: np.asarray(v, np.float64) for k, v in client.stream_weights()}


def make(daemon, family, seed):
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(FAMILIES[family],
                                                          dtype=torch.float32).eval()
    with torch.no_grad():
        for k, p in model.named_parameters():
            if p.abs().max() == 0 and p.dim() > 1:   # zero at init: make it matter
                p.normal_(0, 0.02)
            if k.endswith(".gate.weight"):
                # a decisive router: at initializer_range its logits are
                # within ~0.2 of each other, and a choice that fp32 noise
                # can flip makes the two runs train different experts
                p.mul_(10)
    mdir = "moe-" + family
    model.save_pretrained(os.path.join(daemon.model_root, mdir))
    return model, mdir


def rel(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_moe_matches_transformers(daemon, client, family):
    model, mdir = make(daemon, family, 5)
    client.initialize(replace=True, model_path=mdir, optimizer={
        "lr": BIG, "beta1": 0.9, "beta2": 0.0, "eps": BIG, "weight_decay": 0.0,
        "clip_grad": 0.0})
    want = saved_names(model, family)
    p0 = engined_tensors(client)
    assert sorted(p0) == sorted(want), "engined's tensors are the saved ones"
    for k, v in want.items():
        assert np.array_equal(p0[k], v), k
    expert_keys = [k for k in p0 if ".experts." in k]
    assert len(expert_keys) == 2 * 8 * 3   # two experts layers in each

    ids, w = batch(7)
    lp = np.asarray(client.forward_backward(ids, LENS, forward_only=True,
                                            return_log_probs=True)["log_probs"])
    with torch.no_grad():
        ref = torch_logprobs(model, ids).double().numpy()
    d = float(np.max(np.abs(lp - ref)))
    print("%s: log-probs max |engined - transformers| %.3g" % (family, d))
    assert d <= 1e-5

    # gradients, through one step whose update is g / (1 + |g| / BIG)
    model.zero_grad()
    (torch_logprobs(model, ids) * torch.as_tensor(w)).sum().backward()
    grads = saved_names(model, family, grad=True)
    client.forward_backward(ids, LENS, loss="custom", grad_log_probs=w)
    client.optimizer_step()
    p1 = engined_tensors(client)
    worst, used = 0.0, 0
    for k, g in grads.items():
        upd = p0[k] - p1[k]
        worst = max(worst, rel(upd, g / (1 + np.abs(g) / BIG)))
        used += ".experts." in k and np.max(np.abs(g)) > 0
    print("%s: gradients, max relative difference %.3g (%d of %d expert tensors used)"
          % (family, worst, used, len(expert_keys)))
    assert worst <= 1e-5
    assert used >= len(expert_keys) // 2, "the batch must reach most experts"
    router = [k for k in grads if k.endswith(".gate.weight")]
    assert router and all(np.max(np.abs(grads[k])) > 0 for k in router)

    # 3 AdamW steps against torch's, from the same start
    opt = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-2, weight_decay=0.01)
    client.initialize(replace=True, model_path=mdir, optimizer={
        "lr": opt["lr"], "beta1": 0.9, "beta2": 0.999, "eps": opt["eps"],
        "weight_decay": 0.01, "clip_grad": 0.0})
    torch_opt = torch.optim.AdamW(list(model.parameters()), **opt)
    for step in range(3):
        ids, w = batch(20 + step)
        torch_opt.zero_grad()
        (torch_logprobs(model, ids) * torch.as_tensor(w)).sum().backward()
        torch_opt.step()
        client.forward_backward(ids, LENS, loss="custom", grad_log_probs=w)
        assert client.optimizer_step().step == step + 1
    p3 = engined_tensors(client)
    want = saved_names(model, family)
    diff = max(float(np.max(np.abs(p3[k] - v))) for k, v in want.items())
    print("%s: after 3 AdamW steps, max |engined - torch| %.3g" % (family, diff))
    assert diff <= 1e-6

    # the checkpoint: transformers loads it and scores as engined does
    ids, _ = batch(40)
    lp = np.asarray(client.forward_backward(ids, LENS, forward_only=True,
                                            return_log_probs=True)["log_probs"])
    client.save_checkpoint("moe-" + family, global_step=3, contents=["model"])
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.join(daemon.ckpt_root, "moe-" + family), dtype=torch.float32).eval()
    with torch.no_grad():
        ref = torch_logprobs(loaded, ids).double().numpy()
    d = float(np.max(np.abs(lp - ref)))
    print("%s: checkpoint loaded by transformers, log-probs %.3g" % (family, d))
    assert d <= 1e-5

    # decoding through the key/value cache routes as the full forward does:
    # Sample's log-probs are transformers' over the sampled sequence
    prompt = ids[:9]
    got = client.sample(prompt, [9], max_tokens=8, seed=3).completions[0]
    seq = torch.as_tensor(np.concatenate([prompt, got.token_ids]), dtype=torch.long)[None]
    with torch.no_grad():
        lp = torch.log_softmax(loaded(input_ids=seq).logits[0].float(), -1)
    ref = lp[8:-1].gather(1, seq[0, 9:, None])[:, 0].double().numpy()
    d = float(np.max(np.abs(np.asarray(got.logprobs, np.float64) - ref)))
    print("%s: Sample's log-probs vs transformers %.3g" % (family, d))
    assert len(got.token_ids) == 8 and d <= 1e-5

    # activation recompute: the same gradients bit for bit
    after = []
    for recompute in (False, True):
        client.initialize(replace=True, model_path=mdir, optimizer={"lr": 1e-3})
        client.forward_backward(ids, LENS, loss="custom", grad_log_probs=w,
                                activation_recompute=recompute)
        client.optimizer_step()
        after.append(engined_tensors(client))
    assert all(np.array_equal(after[0][k], after[1][k]) for k in after[0])


def test_moe_refusals(daemon, client):
    """What is not built, or wrong in a config, is refused by name: LoRA over
    experts (UNIMPLEMENTED), more experts per token than experts and
    another family's routing (INVALID_ARGUMENT naming the key); the daemon
    goes on."""
    import grpc
    import json
    import shutil
    from engined_client import EngineError
    _, mdir = make(daemon, "qwen3_moe", 6)
    client.initialize(replace=True, model_path=mdir, frozen_base=True)
    with pytest.raises(EngineError) as e:
        client.create_adapter("a", rank=4, alpha=8, target_modules="all-linear")
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED, e.value
    assert "mixture-of-experts" in e.value.details()
    src = os.path.join(daemon.model_root, mdir)
    for key, val, want in (("num_experts_per_tok", 9, "num_experts_per_tok: 9, more than"),
                           ("scoring_func", "sigmoid", "scoring_func")):
        bad = os.path.join(daemon.model_root, "bad-" + key)
        shutil.copytree(src, bad)
        with open(os.path.join(bad, "config.json")) as f:
            cfg = json.load(f)
        cfg[key] = val
        with open(os.path.join(bad, "config.json"), "w") as f:
            json.dump(cfg, f)
        with pytest.raises(EngineError) as e:
            client.initialize(replace=True, model_path="bad-" + key)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value
        assert want in e.value.details(), e.value
    client.initialize(replace=True, model_path=mdir)
    ids, w = batch(2)
    client.forward_backward(ids, LENS, loss="custom", grad_log_probs=w)
    assert client.optimizer_step().step == 1


AUX_COEF = 0.05


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_router_aux_loss_matches_transformers(daemon, client, family):
    """output_router_logits: the router's auxiliary loss as transformers'
    load_balancing_loss_func computes it over the call's tokens (one
    micro-batch), within 1e-6; the gradients of sum w log p + coef x aux
    within 1e-5 relative (the same one-step reading as above); each experts
    layer's load (the most tokens an expert took over the mean) exactly
    what transformers' routing gives."""
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func
    cfg = FAMILIES[family].to_dict()
    cfg.update(output_router_logits=True, router_aux_loss_coef=AUX_COEF)
    FAMILIES["aux-" + family] = type(FAMILIES[family]).from_dict(cfg)
    try:
        model, mdir = make(daemon, "aux-" + family, 11)
    finally:
        del FAMILIES["aux-" + family]
    c = model.config
    E = c.num_local_experts if family == "mixtral" else c.num_experts
    k = c.num_experts_per_tok
    client.initialize(replace=True, model_path=mdir, optimizer={
        "lr": BIG, "beta1": 0.9, "beta2": 0.0, "eps": BIG, "weight_decay": 0.0,
        "clip_grad": 0.0})
    p0 = engined_tensors(client)
    ids, w = batch(8)

    # transformers: each sequence's forward, the routers' logits of every
    # experts layer gathered over the sequences, then its loss function
    model.zero_grad()
    per_layer, lps, off = None, [], 0
    for n in LENS:
        x = torch.as_tensor(ids[off:off + n], dtype=torch.long)[None]
        out = model(input_ids=x, output_router_logits=True)
        lp = torch.log_softmax(out.logits[0].float(), -1)
        lps += [torch.zeros(1), lp[:-1].gather(1, x[0, 1:, None])[:, 0]]
        per_layer = [[r] for r in out.router_logits] if per_layer is None else \
            [acc + [r] for acc, r in zip(per_layer, out.router_logits)]
        off += n
    logits = tuple(torch.cat(rs, 0) for rs in per_layer)
    aux = load_balancing_loss_func(logits, E, k, None)
    (torch.cat(lps) @ torch.as_tensor(w) + AUX_COEF * aux).backward()
    grads = saved_names(model, family, grad=True)
    chosen = [torch.topk(torch.softmax(l.float(), -1), k, -1).indices for l in logits]
    load_ref = [float(torch.bincount(ch.flatten(), minlength=E).max()) / (N * k / E)
                for ch in chosen]

    r = client.forward_backward(ids, LENS, loss="custom", grad_log_probs=w,
                                max_tokens_per_micro_batch=N)
    d_aux = abs(r.metrics["router_aux_loss"] - float(aux))
    print("%s: router_aux_loss %.6f vs transformers %.6f (%.3g); expert load %s vs %s"
          % (family, r.metrics["router_aux_loss"], float(aux), d_aux,
             np.round(r.expert_load, 4).tolist(), np.round(load_ref, 4).tolist()))
    assert d_aux <= 1e-6
    assert r.expert_load is not None and np.allclose(r.expert_load, load_ref, rtol=0, atol=1e-12)
    client.optimizer_step()
    p1 = engined_tensors(client)
    worst = max(rel(p0[key] - p1[key], g / (1 + np.abs(g) / BIG)) for key, g in grads.items())
    router = [key for key in grads if key.endswith(".gate.weight")]
    print("%s: gradients with the auxiliary loss, max relative difference %.3g"
          % (family, worst))
    assert worst <= 1e-5
    # the check can fail: without the auxiliary loss the routers' gradients
    # are another 1e-3 and more of their size away
    model.zero_grad()
    (torch_logprobs(model, ids) @ torch.as_tensor(w)).backward()
    plain = saved_names(model, family, grad=True)
    assert min(rel(plain[key], grads[key]) for key in router) > 1e-3


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_packed_experts_load_as_per_expert(daemon, client, family):
    """A directory in transformers 5's packed layout (each layer's
    mlp.experts.gate_up_proj [E, 2I, C] and down_proj [E, C, I], as the
    model holds them in memory) loads into the same engine as the
    per-expert files save_pretrained writes: every tensor bit for bit."""
    import json
    import shutil
    from safetensors.torch import save_file
    model, mdir = make(daemon, family, 13)
    packed = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    assert any(k.endswith("experts.gate_up_proj") for k in packed)
    pdir = os.path.join(daemon.model_root, "packed-" + family)
    os.makedirs(pdir)
    save_file(packed, os.path.join(pdir, "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(os.path.join(daemon.model_root, mdir, "config.json"), pdir)
    with open(os.path.join(pdir, "config.json")) as f:
        assert json.load(f)["model_type"] == family
    client.initialize(replace=True, model_path=mdir)
    want = engined_tensors(client)
    client.initialize(replace=True, model_path="packed-" + family)
    got = engined_tensors(client)
    assert sorted(got) == sorted(want)
    assert all(np.array_equal(got[k], want[k]) for k in want)


def experts_layers(family):
    c = FAMILIES[family]
    step = getattr(c, "decoder_sparse_step", 1) or 1
    dense = set(getattr(c, "mlp_only_layers", None) or [])
    return [l for l in range(c.num_hidden_layers)
            if l not in dense and (l + 1) % step == 0]


def replayed_logprobs(model, ids, forced, layers):
    """transformers' log-probs with every experts layer's router forced to
    `forced` [N, len(layers), k] (its weights the live probabilities of the
    forced experts, renormalised as the family does), one forward per
    sequence as torch_logprobs."""
    import torch.nn.functional as F
    cur = {}
    saved = []
    for i, l in enumerate(layers):
        gate = model.model.layers[l].mlp.gate

        def fwd(hidden, gate=gate, i=i):
            h = hidden.reshape(-1, gate.hidden_dim)
            logits = F.linear(h, gate.weight)
            probs = torch.softmax(logits.float(), -1)
            idx = cur["forced"][:, i]
            val = probs.gather(1, idx)
            if getattr(gate, "norm_topk_prob", True):   # mixtral: always
                val = val / val.sum(-1, keepdim=True)
            return logits, val.to(logits.dtype), idx
        saved.append((gate, gate.forward))
        gate.forward = fwd
    try:
        out, off = [], 0
        for n in LENS:
            cur["forced"] = torch.as_tensor(forced[off:off + n], dtype=torch.long)
            x = torch.as_tensor(ids[off:off + n], dtype=torch.long)[None]
            lp = torch.log_softmax(model(input_ids=x).logits[0].float(), -1)
            out += [torch.zeros(1), lp[:-1].gather(1, x[0, 1:, None])[:, 0]]
            off += n
        return torch.cat(out)
    finally:
        for gate, f in saved:
            gate.forward = f


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_routing_replay(daemon, client, family):
    """Routing replay (verl's R2/R3): a forward-only call returns the
    routing its routers chose, transformers' top-k exactly; replaying it
    gives log-probs and a step bit for bit those of the router's own
    choice (also given over all decoder layers, the dense ones' rows
    unread); replaying other experts (random, distinct) equals transformers
    with its routers forced alike, log-probs within 1e-5 and gradients
    within 1e-5 relative, the routers' included (their weights stay the
    live probabilities)."""
    model, mdir = make(daemon, family, 17)
    layers = experts_layers(family)
    c = model.config
    E = c.num_local_experts if family == "mixtral" else c.num_experts
    k = c.num_experts_per_tok
    opt = {"lr": BIG, "beta1": 0.9, "beta2": 0.0, "eps": BIG, "weight_decay": 0.0,
           "clip_grad": 0.0}
    ids, w = batch(9)

    # R2: the routing recorded, transformers' choice
    client.initialize(replace=True, model_path=mdir, optimizer=opt)
    p0 = engined_tensors(client)
    r = client.forward_backward(ids, LENS, forward_only=True, return_log_probs=True,
                                return_routed_experts=True)
    routed = r.routed_experts
    assert routed.dtype == np.int32 and routed.shape == (N, len(layers), k)
    want, off = [], 0
    for n in LENS:
        x = torch.as_tensor(ids[off:off + n], dtype=torch.long)[None]
        with torch.no_grad():
            out = model(input_ids=x, output_router_logits=True)
        want.append(np.stack([torch.topk(torch.softmax(lg.float(), -1), k, -1).indices.numpy()
                              for lg in out.router_logits], 1))
        off += n
    assert np.array_equal(routed, np.concatenate(want)), "the routers' own top-k"

    # replaying it: bit for bit the unforced call, log-probs and step
    runs = []
    for replay in (None, routed, "all-layers"):
        if isinstance(replay, str):   # every decoder layer, the dense ones' rows junk
            full = np.full((N, c.num_hidden_layers, k), -7, np.int32)
            full[:, layers] = routed
            replay = full
        client.initialize(replace=True, model_path=mdir, optimizer=opt)
        lp = client.forward_backward(ids, LENS, forward_only=True, return_log_probs=True,
                                     routed_experts=replay).log_probs
        client.forward_backward(ids, LENS, loss="custom", grad_log_probs=w,
                                routed_experts=replay)
        client.optimizer_step()
        runs.append((lp, engined_tensors(client)))
    for lp, p in runs[1:]:
        assert np.array_equal(lp, runs[0][0])
        assert all(np.array_equal(p[key], runs[0][1][key]) for key in p)

    # other experts: transformers with its routers forced the same way
    rng = np.random.default_rng(3)
    forced = np.stack([rng.permutation(E)[:k] for _ in range(N * len(layers))]).reshape(
        N, len(layers), k).astype(np.int32)
    assert np.mean(np.sort(forced, -1) != np.sort(routed, -1)) > 0.5
    client.initialize(replace=True, model_path=mdir, optimizer=opt)
    lp = client.forward_backward(ids, LENS, forward_only=True, return_log_probs=True,
                                 routed_experts=forced, return_routed_experts=True)
    assert np.array_equal(lp.routed_experts, forced), "the routing used is the one given"
    with torch.no_grad():
        ref = replayed_logprobs(model, ids, forced, layers).double().numpy()
    d = float(np.max(np.abs(lp.log_probs - ref)))
    model.zero_grad()
    (replayed_logprobs(model, ids, forced, layers) * torch.as_tensor(w)).sum().backward()
    grads = saved_names(model, family, grad=True)
    client.forward_backward(ids, LENS, loss="custom", grad_log_probs=w, routed_experts=forced)
    client.optimizer_step()
    p1 = engined_tensors(client)
    worst = max(rel(p0[key] - p1[key], g / (1 + np.abs(g) / BIG)) for key, g in grads.items())
    router = [key for key in grads if key.endswith(".gate.weight")]
    print("%s: replayed routing, log-probs vs transformers forced alike %.3g, gradients "
          "%.3g relative" % (family, d, worst))
    assert d <= 1e-5 and worst <= 1e-5
    assert all(np.max(np.abs(grads[key])) > 0 for key in router)


def test_routing_replay_refusals(daemon, client):
    """A replay the model cannot take is INVALID_ARGUMENT naming
    routed_experts (its shape, an id out of range, an expert twice in a
    row, a dense model), and the engine goes on."""
    import grpc
    from engined_client import EngineError
    _, mdir = make(daemon, "mixtral", 18)
    client.initialize(replace=True, model_path=mdir)
    ids, _ = batch(10)
    good = np.tile(np.array([0, 1], np.int32), (N, 2, 1))
    bad = {"shape": (good[:, :, :1], "experts_per_tok 2"),
           "layers": (np.concatenate([good, good], 1), "4 layers; the model has 2"),
           "tokens": (good[1:], "routed_experts: shape must be [%d," % N),
           "range": (np.where(np.arange(N)[:, None, None] == 5, 8, good),
                     "routed_experts[5][0][0]: expert 8 outside [0, num_experts 8)"),
           "twice": (np.where(np.arange(2)[None, :, None] == 1, 3, good),
                     "routed_experts[0][1]: expert 3 twice")}
    for name, (routed, want) in bad.items():
        with pytest.raises(EngineError) as e:
            client.forward_backward(ids, LENS, forward_only=True, routed_experts=routed)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (name, e.value)
        assert want in e.value.details(), (name, e.value.details())
    assert client.forward_backward(ids, LENS, forward_only=True, routed_experts=good,
                                   return_log_probs=True).log_probs.shape == (N,)
    client.initialize(replace=True, preset="tiny")   # a dense model
    with pytest.raises(EngineError) as e:
        client.forward_backward(ids[:5], [5], forward_only=True,
                                routed_experts=np.zeros((5, 1, 2), np.int32))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "routed_experts: the model has no experts layers" in e.value.details()
