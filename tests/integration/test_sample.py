"""Sample (issue 28) on a real daemon, against engined's own ForwardBackward
and hand-computed statistics (tests/verl/test_sample_transformers.py checks
it against transformers):
  - each sampled token's log-prob equals ForwardBackward's forward-only
    log-prob of the same full sequence within 1e-5, at temperatures 1 and
    0.7, prefilled whole or in chunks that split prompts, one sample or
    many forked from a prompt's cache blocks; prompt_logprobs equal
    ForwardBackward's;
  - a completion's tokens depend on (seed, prompt, sample) alone: the same
    alone and in a busy batch, and when the cache budget makes the call run
    its prompts in waves;
  - the draws follow the distribution (chi-square over 20000 draws), top_k
    and top_p never let a token outside their set through;
  - stop tokens, stop sequences and max_tokens end completions as defined;
  - sampling changes no training state; a Sample queued behind an
    OptimizerStep sees the update and reports the version; a cancelled
    Sample frees its cache;
  - bad input gets a precise status naming the field, and the engine
    stays usable.
"""
import json
import threading

import grpc
import numpy as np
import pytest

from daemon_fixture import Daemon, wait_for
from engined_client import EngineClient
from rpc_expect import expect

V = 256


def config(initializer_range):
    return json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V,
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
        "initializer_range": initializer_range})


# A wide spread by default: peaked distributions, so that the statistics
# mean something (logits up to ~30, so fp32 rounding alone moves a log-prob
# by ~1e-5 between two summation orders); transformers' own 0.02 for the
# log-prob parity (the size of a trained model's logits).
WIDE, HF_INIT = 0.3, 0.02
LENS = [1, 16, 17, 33, 5]   # across the 16-position cache blocks


def init(client, initializer_range=WIDE, **kw):
    client.initialize(replace=True, hf_config_json=config(initializer_range), seed=3, **kw)


def prompts(seed, lens=LENS):
    rng = np.random.default_rng(seed)
    ps = [rng.integers(0, V, n).astype(np.int32) for n in lens]
    return ps, np.concatenate(ps), [len(p) for p in ps]


def fb_logprobs(client, seq, temperature):
    r = client.forward_backward(np.asarray(seq, np.int32), [len(seq)], forward_only=True,
                                return_log_probs=True, temperature=temperature)
    return np.asarray(r.log_probs, np.float64)


def by_key(res):
    return {(c.prompt_index, c.sample_index): c for c in res.completions}


@pytest.mark.parametrize("temperature,chunk,samples", [(1.0, 0, 1), (0.7, 0, 3),
                                                       (1.0, 8, 2), (0.7, 13, 1)])
def test_logprobs_equal_forward_backward(client, temperature, chunk, samples):
    init(client, HF_INIT)
    ps, ids, lens = prompts(1)
    res = client.sample(ids, lens, max_tokens=24, num_samples=samples, temperature=temperature,
                        seed=9, prompt_logprobs=True, max_tokens_per_micro_batch=chunk)
    assert sorted(by_key(res)) == [(i, k) for i in range(len(ps)) for k in range(samples)]
    assert res.weights_version == 0
    worst = 0.0
    for c in res.completions:
        p = ps[c.prompt_index]
        assert c.finish_reason == "length" and len(c.token_ids) == 24
        ref = fb_logprobs(client, np.concatenate([p, c.token_ids]), temperature)
        worst = max(worst, float(np.max(np.abs(ref[len(p):] - c.logprobs))))
        if c.sample_index == 0:
            assert len(c.prompt_logprobs) == len(p)
            np.testing.assert_allclose(c.prompt_logprobs, ref[:len(p)], atol=1e-5, rtol=0)
        else:
            assert c.prompt_logprobs is None or len(c.prompt_logprobs) == 0
    print("t=%g chunk=%d samples=%d: max |log-prob - ForwardBackward's| = %.3g"
          % (temperature, chunk, samples, worst))
    assert worst <= 1e-5


def test_greedy_picks_the_best_token(client):
    init(client)
    _, ids, lens = prompts(2)
    a = client.sample(ids, lens, max_tokens=20, temperature=0.0, top_logprobs=3)
    b = client.sample(ids, lens, max_tokens=20, temperature=0.0, seed=99, num_samples=2)
    for c in a.completions:
        assert c.top_token_ids.shape == (20, 3) and c.top_logprobs.shape == (20, 3)
        assert list(c.top_token_ids[:, 0]) == list(c.token_ids)
        np.testing.assert_array_equal(c.top_logprobs[:, 0], c.logprobs)
        assert np.all(np.diff(c.top_logprobs, axis=1) <= 0)
        for k in range(2):   # greedy ignores the seed and the sample
            assert list(by_key(b)[(c.prompt_index, k)].token_ids) == list(c.token_ids)


def test_seed_alone_or_busy(client):
    """The same (seed, prompt, sample) gives the same tokens whatever else
    shares the batch."""
    init(client)
    ps, ids, lens = prompts(3)
    busy = client.sample(ids, lens, max_tokens=30, num_samples=4, temperature=1.0, seed=5)
    for i, p in enumerate(ps[:2]):
        # prompt i alone, as prompt i of a smaller call (prompts before it kept)
        sub = np.concatenate(ps[:i + 1])
        alone = client.sample(sub, lens[:i + 1], max_tokens=30, num_samples=2,
                              temperature=1.0, seed=5)
        for k in range(2):
            a, b = by_key(alone)[(i, k)], by_key(busy)[(i, k)]
            assert list(a.token_ids) == list(b.token_ids)
            # a decode step's products of another size may round otherwise
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4, rtol=0)
    other = client.sample(ids, lens, max_tokens=30, num_samples=4, temperature=1.0, seed=6)
    assert any(list(by_key(other)[k].token_ids) != list(c.token_ids)
               for k, c in by_key(busy).items())


def chi2_critical(df, z=3.0902):
    """The chi-square quantile of df degrees of freedom at the normal
    quantile z (3.0902: p = 0.999), by Wilson and Hilferty's cube-root
    approximation (within 0.5% of scipy.stats.chi2.ppf for df >= 3)."""
    h = 2.0 / (9.0 * df)
    return df * (1.0 - h + z * np.sqrt(h)) ** 3


def chi2_test(counts, probs, min_expected=5.0):
    """Pearson's statistic with the categories expected fewer than
    min_expected times pooled into one; (statistic, degrees of freedom)."""
    expected = probs / probs.sum() * counts.sum()
    big = expected >= min_expected
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return float(((obs - exp) ** 2 / exp).sum()), len(obs) - 1


def first_token_probs(client, prompt, temperature):
    """p(v | prompt) for every token v, from ForwardBackward (one sequence
    per candidate, the last log-prob of each)."""
    seqs = np.concatenate([np.append(prompt, v) for v in range(V)]).astype(np.int32)
    lp = fb_logprobs_packed(client, seqs, [len(prompt) + 1] * V, temperature)
    return np.exp(lp[len(prompt)::len(prompt) + 1])


def fb_logprobs_packed(client, ids, lens, temperature):
    r = client.forward_backward(ids, lens, forward_only=True, return_log_probs=True,
                                temperature=temperature)
    return np.asarray(r.log_probs, np.float64)


N_DRAWS = 20000


def draws(client, prompt, **kw):
    res = client.sample(prompt, [len(prompt)], max_tokens=1, num_samples=N_DRAWS, **kw)
    assert len(res.completions) == N_DRAWS
    return np.bincount([c.token_ids[0] for c in res.completions], minlength=V)


def test_draws_follow_the_distribution(client):
    """20000 first tokens of one prompt at temperature 1 against the
    softmax probabilities (ForwardBackward's); then with top_k and top_p,
    the tokens drawn are exactly the set each keeps, in its proportions."""
    init(client)
    prompt = np.array([7, 100, 3], np.int32)
    p = first_token_probs(client, prompt, 1.0)
    assert abs(p.sum() - 1) < 1e-5
    counts = draws(client, prompt, temperature=1.0, seed=1)
    stat, df = chi2_test(counts, p)
    print("chi-square, t=1, %d draws: %.2f with %d dof (p = 0.001 at %.2f)"
          % (N_DRAWS, stat, df, chi2_critical(df)))
    assert df >= 10 and stat < chi2_critical(df)

    order = np.argsort(-p, kind="stable")
    # top_k 12: the 12 best tokens, renormalized
    counts = draws(client, prompt, temperature=1.0, top_k=12, seed=2)
    kept = order[:12]
    assert set(np.flatnonzero(counts)) == set(kept)
    stat, df = chi2_test(counts[kept], p[kept])
    print("chi-square, top_k=12: %.2f with %d dof" % (stat, df))
    assert stat < chi2_critical(df)
    # top_p 0.6: the smallest best-first set reaching 0.6, the crossing token in
    cut = int(np.searchsorted(np.cumsum(p[order]), 0.6) + 1)
    assert 3 <= cut < 40
    counts = draws(client, prompt, temperature=1.0, top_p=0.6, seed=3)
    kept = order[:cut]
    assert set(np.flatnonzero(counts)) == set(kept)
    stat, df = chi2_test(counts[kept], p[kept])
    print("chi-square, top_p=0.6 (%d tokens): %.2f with %d dof" % (cut, stat, df))
    assert stat < chi2_critical(max(df, 3))


def test_top_k_and_top_p_exclude(client):
    init(client)
    _, ids, lens = prompts(4)
    res = client.sample(ids, lens, max_tokens=32, num_samples=3, temperature=1.3, top_k=3,
                        top_logprobs=20, seed=8)
    for c in res.completions:
        for t, row in zip(c.token_ids, c.top_token_ids):
            assert t in row[:3]
    res = client.sample(ids, lens, max_tokens=32, num_samples=3, temperature=1.0,
                        top_p=0.3, top_logprobs=20, seed=8)
    for c in res.completions:
        for t, row, lrow in zip(c.token_ids, c.top_token_ids, c.top_logprobs):
            cum = np.cumsum(np.exp(lrow.astype(np.float64)))
            cut = int(np.searchsorted(cum, 0.3) + 1)
            assert t in row[:cut]


def test_stops_and_length(client):
    init(client)
    ps, ids, lens = prompts(5)
    free = by_key(client.sample(ids, lens, max_tokens=30, temperature=0.0))
    toks = list(free[(3, 0)].token_ids)
    stop_id = toks[6]
    first = toks.index(stop_id)
    seq = toks[9:12]
    res = by_key(client.sample(ids, lens, max_tokens=30, temperature=0.0,
                               stop_token_ids=[stop_id], stop_sequences=[seq]))
    c = res[(3, 0)]
    end = min(first + 1, next(i + 3 for i in range(len(toks)) if toks[i:i + 3] == seq))
    assert list(c.token_ids) == toks[:end] and c.finish_reason == "stop"
    np.testing.assert_array_equal(c.logprobs, free[(3, 0)].logprobs[:end])
    for k, f in free.items():   # the others stop where their own tokens say
        t = list(f.token_ids)
        hits = [i + 1 for i in range(len(t)) if t[i] == stop_id]
        hits += [i + 3 for i in range(len(t) - 2) if t[i:i + 3] == seq]
        assert list(res[k].token_ids) == t[:min(hits)] if hits else t
        assert res[k].finish_reason == ("stop" if hits else "length")
    one = client.sample(ids, lens, max_tokens=1, temperature=0.0)
    assert all(len(c.token_ids) == 1 and c.finish_reason == "length" for c in one.completions)


def test_sampling_changes_no_training_state(client):
    """A ForwardBackward, then a Sample, then a step: the same weights,
    bit for bit, as without the Sample; its gradients and counters kept."""
    ps, ids, lens = prompts(6)
    after = []
    for with_sample in (False, True):
        init(client)
        client.forward_backward(ids, lens, loss="sft")
        if with_sample:
            before = client.get_status()
            client.sample(ids, lens, max_tokens=10, num_samples=2, seed=4)
            st = client.get_status()
            assert (st.accumulated_calls, st.step) == (before.accumulated_calls, before.step)
        client.optimizer_step()
        after.append({k: np.asarray(v).copy() for k, v in client.stream_weights()})
    assert sorted(after[0]) == sorted(after[1])
    for k in after[0]:
        assert np.array_equal(after[0][k], after[1][k]), k


def test_cache_budget_waves_and_refusal(daemon, client):
    """A call whose prompts fit the cache only a few at a time runs them in
    waves, with the same tokens; one that could never fit is refused at
    once, naming kv_cache_bytes."""
    ps, ids, lens = prompts(7, [20] * 12)
    init(client)
    big = by_key(client.sample(ids, lens, max_tokens=40, num_samples=2, seed=3))
    # tiny model: 2 layers x 2 kv heads x 16 dims x 16 positions x k,v x 4 bytes
    block = 2 * 2 * 16 * 16 * 2 * 4
    init(client, kv_cache_bytes=12 * block)     # one prompt (and its 2 samples) at a time
    small = by_key(client.sample(ids, lens, max_tokens=40, num_samples=2, seed=3))
    assert sorted(small) == sorted(big)
    for k in big:
        assert list(small[k].token_ids) == list(big[k].token_ids)
    expect(grpc.StatusCode.RESOURCE_EXHAUSTED, client.sample, ids, lens, max_tokens=400,
           num_samples=2, field="kv_cache_bytes")
    assert len(client.sample(ids, lens, max_tokens=5).completions) == 12


def test_bad_input(client):
    init(client)
    _, ids, lens = prompts(8)
    IA = grpc.StatusCode.INVALID_ARGUMENT
    bad = [
        (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(temperature=-1.0),
                                                                   "temperature"),
        (dict(temperature=float("nan")), "temperature"), (dict(top_k=-1), "top_k"),
        (dict(num_samples=70000), "num_samples"), (dict(top_logprobs=21), "top_logprobs"),
        (dict(stop_token_ids=[V]), "stop_token_ids"), (dict(stop_sequences=[[]]),
                                                       "stop_sequences[0]"),
        (dict(stop_sequences=[[1, V + 3]]), "stop_sequences[0]"),
        (dict(max_tokens_per_micro_batch=-1), "max_tokens_per_micro_batch"),
    ]
    for kw, field in bad:
        args = dict(max_tokens=4)
        args.update(kw)
        expect(IA, client.sample, ids, lens, field=field, **args)
    expect(IA, client.sample, ids, lens, max_tokens=0, field="max_tokens")
    # past the model's context (1024 positions; the longest prompt has 33)
    expect(IA, client.sample, ids, lens, max_tokens=992, field="max_position_embeddings")
    assert len(client.sample(ids, lens, max_tokens=991, top_k=1).completions) == len(lens)
    # work the cache could never hold: refused at once, with the estimate
    e = expect(grpc.StatusCode.RESOURCE_EXHAUSTED, client.sample, ids, lens, max_tokens=900,
               num_samples=60000, field="kv_cache_bytes")
    assert "needs up to" in e.details() and "MiB" in e.details()
    expect(IA, client.sample, ids, lens[:-1], max_tokens=4, field="seq_lens")
    expect(IA, client.sample, ids, [0] + lens[1:], max_tokens=4, field="seq_lens")
    out = ids.copy()
    out[3] = V
    expect(IA, client.sample, out, lens, max_tokens=4, field="input_ids[3]")
    expect(grpc.StatusCode.NOT_FOUND, client.sample, ids, lens, max_tokens=4, adapter="nope")
    assert len(client.sample(ids, lens, max_tokens=4).completions) == len(lens)


def test_value_model_and_uninitialized():
    d = Daemon()
    try:
        c = EngineClient(d.addr, timeout=60)
        expect(grpc.StatusCode.FAILED_PRECONDITION, c.sample, [1, 2], [2], max_tokens=2)
        c.initialize(preset="tiny", model_type="value_model")
        expect(grpc.StatusCode.FAILED_PRECONDITION, c.sample, [1, 2], [2], max_tokens=2,
               field="value_model")
        c.close()
    finally:
        assert d.stop() == 0


def test_queue_order_version_and_cancel():
    """A Sample queued behind an OptimizerStep samples the new weights and
    says so; a Sample cancelled part-way ends CANCELLED and frees its cache."""
    d = Daemon(hold=True, safe_points=True)
    try:
        c = EngineClient(d.addr, timeout=120)
        init(c)
        _, ids, lens = prompts(9)
        c.forward_backward(ids, lens, loss="sft")
        v0 = c.sample(ids, lens, max_tokens=8, temperature=0.0)
        assert v0.weights_version == 0
        d.hold()
        out = {}
        t1 = threading.Thread(target=lambda: out.setdefault("step", c.optimizer_step()))
        t1.start()
        wait_for(lambda: c.get_status().busy, "the held step")
        t2 = threading.Thread(target=lambda: out.setdefault(
            "sample", c.sample(ids, lens, max_tokens=8, temperature=0.0)))
        t2.start()
        wait_for(lambda: c.get_status().queued_jobs >= 1, "the queued Sample")
        d.release()
        t1.join(60)
        t2.join(60)
        v1 = out["sample"]
        assert v1.weights_version == 1
        now = c.sample(ids, lens, max_tokens=8, temperature=0.0)
        for a, b, old in zip(v1.completions, now.completions, v0.completions):
            assert list(a.token_ids) == list(b.token_ids)
            np.testing.assert_array_equal(a.logprobs, b.logprobs)
            assert not np.array_equal(old.logprobs, b.logprobs)   # the step changed them

        mem0 = c.get_status().memory.device_bytes
        # Held at a safe point of its decode loop until its deadline passes.
        d.hold_safe_points(after=3)
        expect(grpc.StatusCode.DEADLINE_EXCEEDED, c.sample, ids, lens, max_tokens=200,
               num_samples=4, timeout=2)
        assert d.safe_points_held() >= 1
        d.release_safe_points()
        wait_for(lambda: not c.get_status().busy, "the cancelled Sample to end")
        assert c.get_status().memory.device_bytes == mem0     # its cache freed
        assert any("rpc Sample" in x and ("status=CANCELLED" in x or "DEADLINE" in x)
                   for x in d.log_text().splitlines())
        assert len(c.sample(ids, lens, max_tokens=3).completions) == len(lens)
        c.close()
    finally:
        assert d.stop() == 0



def test_calls_share_decode_steps():
    """Continuous batching across calls: a Sample that arrives while
    another runs joins its decode steps and ends long before it, with the
    tokens it has alone; a Sample queued behind an OptimizerStep does not
    join (the step waits for the running batch, and the Sample samples
    the update)."""
    d = Daemon(safe_points=True)
    try:
        c = EngineClient(d.addr, timeout=120)
        init(c)
        ps, ids, lens = prompts(10)
        short_alone = c.sample(ids, lens, max_tokens=6, num_samples=2, seed=21)

        order = []

        def start_long(out):
            def run():
                out["long"] = c.sample(ps[1], [len(ps[1])], max_tokens=400, seed=20)
                order.append("long")
            t = threading.Thread(target=run)
            t.start()
            return t

        def run_short(out):
            out["short"] = c.sample(ids, lens, max_tokens=6, num_samples=2, seed=21)
            order.append("short")

        # The long call runs two steps, then waits at its third.
        d.hold_safe_points(after=2)
        out = {}
        t_long = start_long(out)
        wait_for(lambda: d.safe_points_held() >= 1, "the long Sample held")
        t_short = threading.Thread(target=run_short, args=(out,))
        t_short.start()
        wait_for(lambda: c.get_status().queued_jobs >= 1, "the short Sample queued")
        d.release_safe_points()
        t_short.join(60)
        t_long.join(120)
        short, long_ = out["short"], out["long"]
        for k, x in by_key(short_alone).items():
            assert list(by_key(short)[k].token_ids) == list(x.token_ids)
        assert len(long_.completions[0].token_ids) == 400
        # It joined the running batch: it ended some 390 decode steps
        # before the long call, on the same connection.
        assert order == ["short", "long"]

        # Behind an OptimizerStep: the step waits for the batch to drain,
        # the Sample behind it does not join and sees the update.
        c.forward_backward(ids, lens, loss="sft")
        d.hold_safe_points(after=2)
        out = {}
        t_long = start_long(out)
        wait_for(lambda: d.safe_points_held() >= 2, "the long Sample held again")
        t_step = threading.Thread(target=lambda: out.setdefault("step", c.optimizer_step()))
        t_step.start()
        wait_for(lambda: c.get_status().queued_jobs >= 1, "the step queued")
        t_after = threading.Thread(target=lambda: out.setdefault("after", c.sample(
            ids, lens, max_tokens=4, seed=1)))
        t_after.start()
        wait_for(lambda: c.get_status().queued_jobs >= 2, "the Sample queued behind it")
        d.release_safe_points()
        for t in (t_long, t_step, t_after):
            t.join(120)
        assert out["long"].weights_version == 0
        assert out["after"].weights_version == 1
        c.close()
    finally:
        assert d.stop() == 0
