"""test_tinker_sdk.py — the unchanged tinker SDK 0.38.0 drives engined through
engined-tinker (issue 29): its own flow on a tiny Llama, LoRA (rank 4) and
full fine-tuning (rank 0), checked step by step against engined's own
Python client driving a daemon of its own with the same data (the
alignment of docs/TINKER.md 8.2 built here independently), against the
loss formulas computed by hand from the returned log-probs, and against
transformers' log-probs of the base model. Weights are compared in the
saved checkpoints, read with PyPI's safetensors."""
import glob
import os

import numpy as np
import pytest
import torch

import tinker
from tinker import types  # noqa: E402

import gateway_fixture as gf  # noqa: E402
from daemon_fixture import Daemon  # noqa: E402
from engined_client import EngineClient  # noqa: E402

SEED = 1234
ALPHA = 32.0
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ADAM = dict(learning_rate=1e-3, beta1=0.9, beta2=0.95, eps=1e-12, weight_decay=0.0,
            grad_clip_norm=0.0)
ENGINED_ADAM = dict(lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-12, weight_decay=0.0, clip_grad=0.0)


@pytest.fixture(scope="module")
def env():
    # Engines: one for the LoRA models, one for each full fine-tune (the
    # rank-0 flow makes two: its client and one from its checkpoint).
    daemons, model_dir, gw = gf.start(n_daemons=3)
    ref = Daemon("--model-root", daemons[0].model_root)
    try:
        yield daemons, model_dir, gw, ref
    finally:
        gw.stop()
        for d in daemons + [ref]:
            d.stop()


def rng_data(rng, n_datums=3):
    """Datums of random lengths: (tokens, targets) with targets the
    next tokens of a longer random sequence."""
    out = []
    for _ in range(n_datums):
        seq = rng.integers(3, 96, size=int(rng.integers(4, 12))).astype(np.int64)
        out.append((seq[:-1], seq[1:]))
    return out


def tinker_datum(tokens, targets, **inputs):
    return types.Datum(model_input=types.ModelInput.from_ints([int(t) for t in tokens]),
                       loss_fn_inputs=dict({"target_tokens": targets.tolist()},
                                           **{k: v.tolist() for k, v in inputs.items()}))


def engined_batch(data, per_position):
    """The same datums as engined's packed batch, built here: N+1 tokens a
    datum (its input and its last target), entry i+1 = Tinker position i."""
    ids, tgt, lens = [], [], []
    arrays = {k: [] for k in per_position}
    for i, (tokens, targets) in enumerate(data):
        ids += list(tokens) + [targets[-1]]
        tgt += [0] + list(targets)
        lens.append(len(tokens) + 1)
        for k, v in per_position.items():
            arrays[k] += [0.0] + list(v[i])
    out = dict(input_ids=np.array(ids, np.int32), seq_lens=lens,
               target_ids=np.array(tgt, np.int32), return_log_probs=True)
    out.update({k: np.array(v, np.float32) for k, v in arrays.items()})
    return out


def split_logprobs(lp, data):
    out, at = [], 0
    for tokens, _ in data:
        out.append(lp[at + 1:at + len(tokens) + 1])
        at += len(tokens) + 1
    return out


def transformers_logprobs(model_dir, data):
    import transformers
    m = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64)
    out = []
    with torch.no_grad():
        for tokens, targets in data:
            logits = m(torch.tensor([tokens])).logits[0].log_softmax(-1)
            out.append(logits[torch.arange(len(targets)), torch.tensor(targets)].numpy())
    return out


def read_tensors(directory):
    from safetensors.numpy import load_file
    out = {}
    for f in sorted(glob.glob(os.path.join(directory, "*.safetensors"))):
        if "optimizer" in os.path.basename(f):
            continue
        out.update(load_file(f))
    return out


def assert_same_weights(a_dir, b_dir, tol=1e-6):
    a, b = read_tensors(a_dir), read_tensors(b_dir)
    assert a and sorted(a) == sorted(b), (sorted(a)[:4], sorted(b)[:4])
    worst = max(float(np.max(np.abs(a[k].astype(np.float64) - b[k]))) for k in a)
    assert worst <= tol, worst


def close(a, b, tol=1e-6):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape and np.all(np.abs(a - b) <= tol * np.maximum(1.0, np.abs(b))), \
        (a, b)


@pytest.mark.parametrize("rank", [4, 0])
def test_sdk_flow_equals_engined_client(env, rank):
    daemons, model_dir, gw, ref_daemon = env
    lora = rank > 0
    rng = np.random.default_rng(rank)
    sc = tinker.ServiceClient(base_url=gw.url, api_key=gf.KEY)
    tc = sc.create_lora_training_client(base_model=gf.MODEL, rank=rank, seed=SEED).result()
    info = tc.get_info()
    assert info.is_lora is lora and info.lora_rank == (rank if lora else None)
    assert info.model_data.model_name == gf.MODEL

    ref = EngineClient(ref_daemon.addr, timeout=300)
    ref.initialize(replace=True, model_path=gf.MODEL, frozen_base=lora)
    adapter = ""
    if lora:
        adapter = "ref"
        ref.create_adapter(adapter, rank=rank, alpha=ALPHA, target_modules=TARGETS, seed=SEED)

    # cross_entropy: log-probs equal transformers' (the base: LoRA's B is 0)
    data = rng_data(rng)
    weights = [rng.uniform(-1, 2, size=len(t)).astype(np.float32) for t, _ in data]
    fb = tc.forward_backward([tinker_datum(t, y, weights=w) for (t, y), w in zip(data, weights)],
                             "cross_entropy").result()
    lps = [o["logprobs"].to_numpy() for o in fb.loss_fn_outputs]
    for got, want in zip(lps, transformers_logprobs(model_dir, data)):
        close(got, want, 1e-5)
    close(fb.metrics["loss:sum"], -sum(float(np.dot(w, lp)) for w, lp in zip(weights, lps)),
          1e-5)
    r = ref.forward_backward(loss="cross_entropy", adapter=adapter,
                             **engined_batch(data, {"token_weights": weights}))
    close(fb.metrics["loss:sum"], r.loss)
    for got, want in zip(lps, split_logprobs(r.log_probs, data)):
        close(got, want)

    # importance_sampling, ppo, cispo and dro accumulate on the same step
    for loss, cfg in (("importance_sampling", None),
                      ("ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}),
                      ("cispo", {"clip_low_threshold": 0.5, "clip_high_threshold": 1.05}),
                      ("dro", {"beta": 0.3})):
        data = rng_data(rng)
        old = [rng.normal(-4.5, 0.3, size=len(t)).astype(np.float32) for t, _ in data]
        adv = [rng.normal(0, 1, size=len(t)).astype(np.float32) for t, _ in data]
        fb = tc.forward_backward(
            [tinker_datum(t, y, logprobs=o, advantages=a)
             for (t, y), o, a in zip(data, old, adv)], loss, loss_fn_config=cfg).result()
        lps = [o["logprobs"].to_numpy().astype(np.float64) for o in fb.loss_fn_outputs]
        ratio = [np.exp(lp - o) for lp, o in zip(lps, old)]
        if loss == "ppo":
            want = -sum(np.minimum(r_ * a, np.clip(r_, 0.9, 1.1) * a).sum()
                        for r_, a in zip(ratio, adv))
            spec = {"name": "ppo", "policy_loss": "vanilla", "clip_ratio_low": 0.1,
                    "clip_ratio_high": 0.1, "clip_ratio_c": 1e30, "loss_agg_mode": "token-sum"}
        elif loss == "cispo":
            want = -sum((np.clip(r_, 0.5, 1.05) * lp * a).sum()
                        for r_, lp, a in zip(ratio, lps, adv))
            spec = {"name": "ppo", "policy_loss": "cispo", "clip_ratio_low": 0.5,
                    "clip_ratio_high": 0.05, "loss_agg_mode": "token-sum"}
        elif loss == "dro":
            want = -sum((lp * a - 0.15 * (lp - o) ** 2).sum()
                        for lp, o, a in zip(lps, old, adv))
            spec = {"name": "dro", "beta": 0.3}
        else:
            want = -sum((r_ * a).sum() for r_, a in zip(ratio, adv))
            spec = "importance_sampling"
        close(fb.metrics["loss:sum"], want, 1e-5)
        r = ref.forward_backward(loss=spec, adapter=adapter,
                                 **engined_batch(data, {"old_log_probs": old,
                                                        "advantages": adv}))
        close(fb.metrics["loss:sum"], r.loss)
    tc.optim_step(types.AdamParams(**ADAM)).result()
    ref.optimizer_step(adapter=adapter, **ENGINED_ADAM)

    # a custom loss: the SDK's forward, then cross_entropy with its gradient
    data = rng_data(rng)

    def custom(datums, logprobs):
        loss = sum((lp ** 2).sum() for lp in logprobs)
        return loss, {"custom:sum": float(loss)}
    fb = tc.forward_backward_custom([tinker_datum(t, y, weights=np.ones(len(t), np.float32))
                                     for t, y in data], custom).result()
    fwd = ref.forward_backward(loss="cross_entropy", adapter=adapter, forward_only=True,
                               **engined_batch(data, {}))
    lps = split_logprobs(fwd.log_probs, data)
    close(fb.metrics["loss:sum"], sum(float((lp.astype(np.float64) ** 2).sum()) for lp in lps),
          1e-5)
    ref.forward_backward(loss="cross_entropy", adapter=adapter,
                         **engined_batch(data, {"token_weights": [-2 * lp for lp in lps]}))
    tc.optim_step(types.AdamParams(**ADAM)).result()
    ref.optimizer_step(adapter=adapter, **ENGINED_ADAM)

    # save_state; a new client from it with the optimizer; one more step on both
    saved = tc.save_state("after-2").result().path
    assert saved == "tinker://%s/weights/after-2" % tc.model_id
    tc2 = sc.create_training_client_from_state_with_optimizer(saved).result()
    assert tc2.get_info().is_lora is lora
    data = rng_data(rng)
    weights = [np.ones(len(t), np.float32) for t, _ in data]
    fb = tc2.forward_backward([tinker_datum(t, y, weights=w) for (t, y), w in zip(data, weights)],
                              "cross_entropy").result()
    r = ref.forward_backward(loss="cross_entropy", adapter=adapter,
                             **engined_batch(data, {"token_weights": weights}))
    close(fb.metrics["loss:sum"], r.loss)
    tc2.optim_step(types.AdamParams(**ADAM)).result()
    ref.optimizer_step(adapter=adapter, **ENGINED_ADAM)
    final = tc2.save_state("after-3").result().path
    ref.save_checkpoint("ref-%d" % rank, adapter=adapter)
    run = final[len("tinker://"):].split("/")[0].replace(":", "_")
    assert_same_weights(os.path.join(daemons[0].ckpt_root, "tinker", run, "weights", "after-3"),
                        os.path.join(ref_daemon.ckpt_root, "ref-%d" % rank))

    # sampling from the trained weights, and prompt log-probs
    sampler = tc2.save_weights_and_get_sampling_client()
    prompt = [5, 17, 33, 9]
    out = sampler.sample(types.ModelInput.from_ints(prompt), num_samples=3,
                         sampling_params=types.SamplingParams(max_tokens=6, temperature=0.8,
                                                              seed=77, stop=[]),
                         include_prompt_logprobs=True).result()
    want = ref.sample(np.array(prompt, np.int32), [len(prompt)], max_tokens=6, num_samples=3,
                      temperature=0.8, seed=77, prompt_logprobs=True, adapter=adapter)
    assert len(out.sequences) == 3
    for s, c in zip(out.sequences, want.completions):
        assert s.tokens == c.token_ids and s.stop_reason == "length"
        close(s.logprobs, c.logprobs)
    assert out.prompt_logprobs[0] is None
    close(out.prompt_logprobs[1:], want.completions[0].prompt_logprobs[1:])
    lp = sampler.compute_logprobs(types.ModelInput.from_ints(prompt + [40])).result()
    fwd = ref.forward_backward(loss="cross_entropy", adapter=adapter, forward_only=True,
                               input_ids=np.array(prompt + [40], np.int32),
                               seq_lens=[len(prompt) + 1], return_log_probs=True)
    assert lp[0] is None
    close(lp[1:], fwd.log_probs[1:])
    ref.close()
    sc.close("success").result()  # the session ends: its models unload, their engines free up


@pytest.mark.parametrize("rank", [4, 0])
def test_an_old_sampler_samples_its_snapshot(env, rank):
    """A sampler keeps the weights it was made from: after the model takes a
    step, a LoRA sampler samples its snapshot (loaded from its checkpoint
    into an adapter of its own: the same greedy tokens and log-probs as
    before the step), a full fine-tune's is refused (one set of weights per
    engine), and a new sampler samples the new weights."""
    with tinker.ServiceClient(base_url=env[2].url, api_key=gf.KEY) as sc:
        tc = sc.create_lora_training_client(base_model=gf.MODEL, rank=rank, seed=3).result()
        prompt = types.ModelInput.from_ints([5, 17, 33, 9])
        greedy = types.SamplingParams(max_tokens=8, temperature=0.0, stop=[])
        old = tc.save_weights_and_get_sampling_client()
        before = old.sample(prompt, 1, greedy).result().sequences[0]
        rng = np.random.default_rng(0)
        data = rng_data(rng, 4)
        tc.forward_backward([tinker_datum(t, y, weights=np.ones(len(t), np.float32))
                             for t, y in data], "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=0.05)).result()
        new = tc.save_weights_and_get_sampling_client().sample(prompt, 1, greedy).result()
        if rank:
            again = old.sample(prompt, 1, greedy).result().sequences[0]
            assert again.tokens == before.tokens
            close(again.logprobs, before.logprobs, 1e-6)
            assert not np.allclose(new.sequences[0].logprobs, before.logprobs, atol=1e-3)
        else:
            with pytest.raises(tinker.RequestFailedError, match="sample before the next"):
                old.sample(prompt, 1, greedy).result()
