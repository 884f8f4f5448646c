"""test_tinker_group.py — engined-tinker over a data-parallel group (one
engine of two daemons, --engined A,B) trains as over one daemon: the SDK's
LoRA (rank 4) and full fine-tuning (rank 0) flows, two steps of
cross_entropy and ppo, give the same losses and saved weights (to the
rounding of the ranks' split batch) and the group samples. The flows run
one after another on the same engines: a session's end (the SDK's
ServiceClient closed) unloads its models, freeing the engine."""

import numpy as np
import pytest

import tinker
from tinker import types

import gateway_fixture as gf
from daemon_fixture import Daemon, make_tmp
from test_tinker_faults import weights

ADAM = types.AdamParams(learning_rate=1e-3, beta2=0.95, eps=1e-12)


@pytest.fixture(scope="module")
def env():
    single, model_dir, gw1 = gf.start(n_daemons=1)
    store = make_tmp(prefix="engined-dist-")
    group = [Daemon("--dist-store-root", store, "--model-root", single[0].model_root,
                    "--checkpoint-root", single[0].ckpt_root) for _ in range(2)]
    gw2 = gf.Gateway(group, model_dir, extra=["--engined", ",".join(d.addr for d in group)],
                     engined=False)
    try:
        yield single[0], gw1, gw2
    finally:
        gw1.stop()
        gw2.stop()
        for d in single + group:
            d.stop()


def flow(gw, rank):
    """The SDK's flow; leaving the ServiceClient's block ends its session,
    which unloads its models (the next flow needs their engine)."""
    with tinker.ServiceClient(base_url=gw.url, api_key=gf.KEY) as sc:
        return _flow(sc, rank)


def _flow(sc, rank):
    tc = sc.create_lora_training_client(base_model=gf.MODEL, rank=rank, seed=21).result()
    rng = np.random.default_rng(rank)
    losses = []
    for _ in range(2):
        data = []
        for _ in range(4):
            seq = rng.integers(3, 96, size=int(rng.integers(5, 12)))
            data.append((seq[:-1].tolist(), seq[1:].tolist()))
        ce = [types.Datum(model_input=types.ModelInput.from_ints(x),
                          loss_fn_inputs={"target_tokens": y, "weights": [1.0] * len(y)})
              for x, y in data]
        losses.append(tc.forward_backward(ce, "cross_entropy").result().metrics["loss:sum"])
        pg = [types.Datum(model_input=types.ModelInput.from_ints(x),
                          loss_fn_inputs={"target_tokens": y,
                                          "logprobs": rng.normal(-4.5, 0.2, len(y)).tolist(),
                                          "advantages": rng.normal(0, 1, len(y)).tolist()})
              for x, y in data]
        losses.append(tc.forward_backward(pg, "ppo").result().metrics["loss:sum"])
        tc.optim_step(ADAM).result()
    path = tc.save_state("end").result().path
    out = tc.save_weights_and_get_sampling_client().sample(
        types.ModelInput.from_ints([5, 6, 7]), 2,
        types.SamplingParams(max_tokens=4, seed=3, stop=[])).result()
    assert [len(s.tokens) for s in out.sequences] == [4, 4]
    return np.array(losses), path


@pytest.mark.parametrize("rank", [4, 0])
def test_group_trains_as_one_daemon(env, rank):
    daemon, gw1, gw2 = env
    l1, p1 = flow(gw1, rank)
    l2, p2 = flow(gw2, rank)
    np.testing.assert_allclose(l2, l1, rtol=1e-6)
    a, b = weights(daemon, p1), weights(daemon, p2)
    assert sorted(a) == sorted(b)
    worst = max(float(np.max(np.abs(a[k].astype(np.float64) - b[k]))) for k in a)
    assert worst < 1e-5, worst
