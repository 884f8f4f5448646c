"""test_tinker_faults.py — engined-tinker under faults and bad input, driven
by the unchanged tinker SDK 0.38.0 (issue 29):
  - connections cut in the middle of forward_backward, optim_step and
    retrieve_future (the request reached the gateway, its reply is lost):
    the SDK retries and the weights equal those of a run without faults;
  - a wrong key, an unknown model_id, a malformed protobuf body, an unknown
    loss_fn, a missing loss input: the error category the SDK expects (a
    4xx: user), and nothing changes (the model trains on as if they had
    not been sent)."""
import glob
import os
import time

import httpx
import numpy as np
import pytest

import tinker
from tinker import types

import gateway_fixture as gf
from cut_proxy import CutProxy

ADAM = types.AdamParams(learning_rate=1e-2, beta2=0.95, eps=1e-12)


@pytest.fixture(scope="module")
def env():
    with gf.running(n_daemons=1) as (daemons, _, gw):
        yield daemons[0], gw


def datums(k):
    rng = np.random.default_rng(k)
    out = []
    for _ in range(3):
        seq = rng.integers(3, 96, size=8)
        out.append(types.Datum(model_input=types.ModelInput.from_ints(seq[:-1].tolist()),
                               loss_fn_inputs={"target_tokens": seq[1:].tolist(),
                                               "weights": [1.0] * 7}))
    return out


def train(tc, steps=2):
    """Two forward_backward calls of different data a step: a call applied
    twice changes the step's direction (AdamW is blind to a gradient's scale)."""
    for k in range(steps):
        tc.forward_backward(datums(k), "cross_entropy").result()
        tc.forward_backward(datums(k + 100), "cross_entropy").result()
        tc.optim_step(ADAM).result()
    return tc.save_state("final").result().path


def weights(daemon, path):
    from safetensors.numpy import load_file
    run, _, name = path[len("tinker://"):].split("/")
    d = os.path.join(daemon.ckpt_root, "tinker", run.replace(":", "_"), "weights", name)
    files = [f for f in glob.glob(os.path.join(d, "*.safetensors")) if "optimizer" not in f]
    assert files, d
    out = {}
    for f in files:
        out.update(load_file(f))
    return out


def assert_equal_weights(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_cut_connections_are_retried_exactly_once(env):
    daemon, gw = env
    with tinker.ServiceClient(base_url=gw.url, api_key=gf.KEY) as clean:
        want = weights(daemon, train(clean.create_lora_training_client(
            base_model=gf.MODEL, rank=4, seed=5).result()))
    proxy = CutProxy(gw.port, {b"POST /api/v1/forward_backward": 2,
                               b"POST /api/v1/optim_step": 2,
                               b"POST /api/v1/retrieve_future": 1})
    try:
        with tinker.ServiceClient(base_url=proxy.url, api_key=gf.KEY) as sc:
            tc = sc.create_lora_training_client(base_model=gf.MODEL, rank=4, seed=5).result()
            got = weights(daemon, train(tc))
        assert sorted(proxy.cut) == sorted(["POST /api/v1/forward_backward"] * 2 +
                                           ["POST /api/v1/optim_step"] * 2 +
                                           ["POST /api/v1/retrieve_future"]), proxy.cut
    finally:
        proxy.close()
    assert_equal_weights(got, want)


def test_bad_input_is_a_user_error_and_changes_nothing(env):
    daemon, gw = env
    # A wrong key: the SDK's AuthenticationError at its first call.
    with pytest.raises(tinker.AuthenticationError):
        tinker.ServiceClient(base_url=gw.url, api_key="tml-not-a-key") \
            .create_lora_training_client(base_model=gf.MODEL, rank=4).result()
    with tinker.ServiceClient(base_url=gw.url, api_key=gf.KEY) as sc:
        bad_input_session(daemon, gw, sc)


def bad_input_session(daemon, gw, sc):
    clean = weights(daemon, train(sc.create_lora_training_client(
        base_model=gf.MODEL, rank=4, seed=9).result()))
    tc = sc.create_lora_training_client(base_model=gf.MODEL, rank=4, seed=9).result()
    # An unknown loss_fn and a missing loss input: 400, a user error.
    with pytest.raises(tinker.BadRequestError, match="loss_fn 'nope' is unknown"):
        tc.forward_backward(datums(0), "nope").result()
    bad = datums(0)
    del bad[1].loss_fn_inputs["weights"]
    with pytest.raises(tinker.BadRequestError, match=r"data\[1\].*missing weights"):
        tc.forward_backward(bad, "cross_entropy").result()
    # What the SDK cannot send: an unknown model, a malformed body.
    headers = {"X-API-Key": gf.KEY}
    r = httpx.post(gw.url + "/api/v1/get_info", json={"model_id": "nope:train:0"},
                   headers=headers)
    assert r.status_code == 404 and "unknown to this gateway" in r.json()["detail"]
    r = httpx.post(gw.url + "/api/v1/forward_backward", content=b"\x0a\xff\xff",
                   headers=dict(headers, **{"Content-Type": "application/x-protobuf"}))
    assert r.status_code == 400 and "not a ForwardBackwardRequest" in r.json()["detail"]
    r = httpx.post(gw.url + "/api/v1/optim_step", headers=headers,
                   json={"model_id": "nope:train:0", "seq_id": 1, "adam_params": {}})
    assert r.status_code == 404
    r = httpx.post(gw.url + "/api/v1/retrieve_future", headers=headers,
                   json={"request_id": "unknown-1"})
    assert r.status_code == 410
    # JSON fields of the wrong type or size: 400 naming them (not a 500,
    # which the SDK would retry for minutes), before any work is done.
    sid = tc.model_id.split(":")[0]
    r = httpx.post(gw.url + "/api/v1/create_model", headers=headers,
                   json={"session_id": sid, "model_seq_id": 99, "base_model": gf.MODEL,
                         "lora_config": {"rank": "four"}})
    assert r.status_code == 400 and "lora_config.rank" in r.json()["detail"]
    r = httpx.post(gw.url + "/api/v1/create_sampling_session", headers=headers,
                   json={"session_id": sid, "sampling_session_seq_id": 99,
                         "base_model": gf.MODEL})
    sampler = r.json()["sampling_session_id"]
    for bad, field in (({"num_samples": 10 ** 9}, "num_samples"),
                       ({"num_samples": "2"}, "num_samples"),
                       ({"prompt": {"chunks": [{"tokens": ["a"], "type": "encoded_text"}]}},
                        "prompt.chunks[0].tokens"),
                       ({"sampling_params": {"max_tokens": 1.5}}, "max_tokens"),
                       ({"sampling_params": {"stop": {"x": 1}}}, "stop")):
        body = dict({"sampling_session_id": sampler, "seq_id": 0, "num_samples": 1,
                     "prompt": {"chunks": [{"tokens": [5, 6], "type": "encoded_text"}]}},
                    **bad)
        r = httpx.post(gw.url + "/api/v1/asample", headers=headers, json=body)
        assert r.status_code == 400 and field in r.json()["detail"], (bad, r.text)
    # The same client trains on, exactly as the clean one did, and no seq_id
    # was waited for (the refused ones count as used).
    assert_equal_weights(weights(daemon, train(tc)), clean)
    assert "never arrived" not in gw.log()


def test_training_clients_at_once_are_independent(env):
    """Three LoRA training clients of one session train at the same time
    (threads; their requests interleave on one engine): each ends with the
    weights it gets training alone."""
    import threading
    daemon, gw = env
    with tinker.ServiceClient(base_url=gw.url, api_key=gf.KEY) as sc:
        alone = [weights(daemon, train(sc.create_lora_training_client(
            base_model=gf.MODEL, rank=4, seed=40 + i).result(), steps=2)) for i in range(3)]
        clients = [sc.create_lora_training_client(base_model=gf.MODEL, rank=4,
                                                  seed=40 + i).result() for i in range(3)]
        paths = [None] * 3

        def run(i):
            paths[i] = train(clients[i], steps=2)
        threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        for i in range(3):
            assert_equal_weights(weights(daemon, paths[i]), alone[i])


def test_gateway_restart_loses_futures_precisely(env):
    """A gateway restarted under a pending future: the SDK's retrieve gets
    410 and the caller an error (never another call's result); the model is
    unknown to the new gateway (404); its checkpoints are known (with their
    TTLs), so a script resumes from them; new clients work."""
    daemon, gw = env
    import httpx
    headers = {"X-API-Key": gf.KEY}
    sc = tinker.ServiceClient(base_url=gw.url, api_key=gf.KEY)
    tc = sc.create_lora_training_client(base_model=gf.MODEL, rank=4, seed=1).result()
    saved = train(tc, 1)
    short = tc.save_state("short", ttl_seconds=7200).result().path
    r = httpx.post(gw.url + "/api/v1/optim_step", headers=headers,
                   json={"model_id": tc.model_id, "seq_id": 6, "type": "optim_step",
                         "adam_params": {"learning_rate": 1e-3}})
    rid = r.json()["request_id"]
    gw.restart()
    r = httpx.post(gw.url + "/api/v1/retrieve_future", headers=headers,
                   json={"request_id": rid})
    assert r.status_code == 410 and "unknown to this gateway" in r.json()["detail"]
    with pytest.raises(tinker.NotFoundError):
        tc.forward_backward(datums(0), "cross_entropy").result()
    with tinker.ServiceClient(base_url=gw.url, api_key=gf.KEY) as sc2:
        train(sc2.create_lora_training_client(base_model=gf.MODEL, rank=4, seed=1).result(), 1)
        listed = {c.tinker_path: c for c in sc2.create_rest_client().list_checkpoints(
            tc.model_id).result().checkpoints}
        assert set(listed) == {saved, short} and listed[short].expires_at is not None
        resumed = sc2.create_training_client_from_state_with_optimizer(saved).result()
        again = resumed.save_state("again").result().path
        assert_equal_weights(weights(daemon, again), weights(daemon, saved))


def test_a_silent_session_is_ended():
    """A session not heard from for --session-timeout (its script died: no
    heartbeat, no request) is ended: its models are unloaded (their
    adapters deleted in the daemon) and a late heartbeat gets 410, which
    stops the SDK's heartbeat loop."""
    import httpx
    from engined_client import EngineClient
    with gf.running(n_daemons=1, extra=["--session-timeout", "2"]) as (daemons, _, gw):
        h = {"X-API-Key": gf.KEY}

        def post(path, body):
            return httpx.post(gw.url + "/api/v1/" + path, json=body, headers=h)
        sid = post("create_session", {"tags": [], "type": "create_session"}).json()["session_id"]
        rid = post("create_model", {"session_id": sid, "model_seq_id": 0,
                                    "base_model": gf.MODEL, "lora_config": {"rank": 4},
                                    "type": "create_model"}).json()["request_id"]
        r = post("retrieve_future", {"request_id": rid})
        model_id = r.json()["model_id"]
        c = EngineClient(daemons[0].addr, timeout=60)
        assert len(c.get_status().adapters) == 1
        deadline = time.time() + 30  # (asking the gateway would keep it alive)
        while c.get_status().adapters:
            assert time.time() < deadline, "the session was not ended"
            time.sleep(0.5)
        assert post("get_info", {"model_id": model_id}).status_code == 404
        assert post("session_heartbeat", {"session_id": sid}).status_code == 410
        c.close()
