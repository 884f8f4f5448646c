"""test_tinker_rest.py — the REST the SDK's RestClient and `tinker` CLI use
for training runs and checkpoints, against engined-tinker (issue 29):
listing runs and checkpoints, weights_info, TTLs (kept and enforced),
deleting, and `tinker checkpoint download` (the real CLI: a client from the
checkpoint, save_weights_external, signed URLs fetched without the key,
the temporary export deleted) giving the checkpoint's tensors."""
import glob
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import tinker
from tinker import types

import gateway_fixture as gf
from test_tinker_faults import datums, weights


@pytest.fixture(scope="module")
def env():
    # Two engines: a full fine-tune's download needs a second one (the CLI
    # makes a training client from the checkpoint).
    with gf.running(n_daemons=2) as (daemons, _, gw):
        yield daemons[0], gw


def trained(sc, rank):
    tc = sc.create_lora_training_client(base_model=gf.MODEL, rank=rank, seed=2).result()
    tc.forward_backward(datums(0), "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    return tc


def ckpt_dir(daemon, path):
    run, kind, name = path[len("tinker://"):].split("/")
    return os.path.join(daemon.ckpt_root, "tinker", run.replace(":", "_"), kind, name)


@pytest.mark.parametrize("rank", [4, 0])
def test_runs_checkpoints_and_download(env, rank, tmp_path):
    daemon, gw = env
    with tinker.ServiceClient(base_url=gw.url, api_key=gf.KEY) as sc:
        rc = sc.create_rest_client()
        tc = trained(sc, rank)
        keep = tc.save_state("keep").result().path
        short = tc.save_state("short", ttl_seconds=3600).result().path
        sampler = tc.save_weights_for_sampler("s1").result().path
        run = rc.get_training_run(tc.model_id).result()
        assert run.training_run_id == tc.model_id and run.is_lora is (rank > 0)
        assert run.lora_rank == (rank or None)
        assert rc.get_training_run_by_tinker_path(keep).result().training_run_id == tc.model_id
        assert tc.model_id in [r.training_run_id for r in rc.list_training_runs().result()
                               .training_runs]
        listed = {c.tinker_path: c for c in rc.list_checkpoints(tc.model_id).result().checkpoints}
        assert set(listed) == {keep, short, sampler}
        assert listed[sampler].checkpoint_type == "sampler"
        assert listed[keep].expires_at is None and listed[short].expires_at is not None
        info = rc.get_weights_info_by_tinker_path(keep).result()
        assert info.base_model == gf.MODEL and info.is_lora is (rank > 0)
        # TTLs: a new one is kept; one that passes deletes the checkpoint
        # (the gateway expires checkpoints every 30 s and before a listing).
        rc.set_checkpoint_ttl_from_tinker_path(short, 1).result()
        time.sleep(1.5)
        assert short not in {c.tinker_path
                             for c in rc.list_checkpoints(tc.model_id).result().checkpoints}
        assert not os.path.exists(ckpt_dir(daemon, short))
        # Delete.
        rc.delete_checkpoint_from_tinker_path(sampler).result()
        assert not os.path.exists(ckpt_dir(daemon, sampler))
        assert {c.tinker_path for c in rc.list_checkpoints(tc.model_id).result().checkpoints} \
            == {keep}
    # The CLI downloads the training checkpoint's weights.
    env_vars = dict(os.environ, TINKER_BASE_URL=gw.url, TINKER_API_KEY=gf.KEY,
                    TINKER_TELEMETRY="0")
    cli = os.path.join(os.path.dirname(sys.executable), "tinker")
    p = subprocess.run([cli, "checkpoint", "download", keep, "--output", str(tmp_path)],
                       env=env_vars, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    got_dir, = glob.glob(os.path.join(str(tmp_path), "*"))
    from safetensors.numpy import load_file
    got = {}
    for f in glob.glob(os.path.join(got_dir, "*.safetensors")):
        got.update(load_file(f))
    want = weights(daemon, keep)
    assert sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    config = "adapter_config.json" if rank else "config.json"
    assert os.path.exists(os.path.join(got_dir, config))
    # The temporary export is gone.
    assert not glob.glob(os.path.join(daemon.ckpt_root, "tinker", "*", "external_weights", "*"))


def test_signed_urls_need_their_token(env):
    daemon, gw = env
    import httpx
    with tinker.ServiceClient(base_url=gw.url, api_key=gf.KEY) as sc:
        tc = trained(sc, 4)
        path = tc.save_weights_external("x").result().path
        urls = sc.create_rest_client().get_external_weights_urls(path).result().urls
        assert urls
        name, url = next(iter(urls.items()))
        r = httpx.get(url)  # no key: the URL is the authorization
        assert r.status_code == 200 and r.content == open(
            os.path.join(ckpt_dir(daemon, path), name), "rb").read()
        bad = url.rsplit("/", 2)
        assert httpx.get(bad[0] + "/not-a-token/" + bad[2]).status_code == 404
        assert httpx.get(bad[0] + "/" + bad[1] + "/..%2Fadapter_config.json").status_code == 404


def test_remaining_endpoints(env):
    """healthz (no key needed), get_server_capabilities, a sampler made from
    a named sampler path (create_sampling_session with model_path), load_state
    without the optimizer on a live client, unload_model."""
    import httpx
    from engined_client import EngineClient
    daemon, gw = env
    assert httpx.get(gw.url + "/api/v1/healthz").json() == {"status": "ok"}
    with tinker.ServiceClient(base_url=gw.url, api_key=gf.KEY) as sc:
        caps = sc.create_rest_client().get_server_capabilities().result()
        assert [(m.model_name, m.max_context_length) for m in caps.supported_models] == \
            [(gf.MODEL, 256)]
        tc = trained(sc, 4)
        named = tc.save_weights_for_sampler("named").result().path
        state = tc.save_state("state").result().path
        prompt = types.ModelInput.from_ints([5, 6, 7])
        greedy = types.SamplingParams(max_tokens=6, temperature=0.0, stop=[])
        live = tc.save_weights_and_get_sampling_client().sample(prompt, 1, greedy).result()
        by_path = sc.create_sampling_client(model_path=named).sample(prompt, 1, greedy).result()
        assert by_path.sequences[0].tokens == live.sequences[0].tokens
        # Another step, then load_state (weights only): the weights are the saved ones.
        tc.forward_backward(datums(1), "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        tc.load_state(state).result()
        np_equal(weights(daemon, tc.save_state("reloaded").result().path),
                 weights(daemon, state))
        # unload_model (the SDK 0.38 never sends it): the adapter goes.
        c = EngineClient(daemon.addr, timeout=60)
        before = len(c.get_status().adapters)
        h = {"X-API-Key": gf.KEY}
        rid = httpx.post(gw.url + "/api/v1/unload_model", headers=h,
                         json={"model_id": tc.model_id, "type": "unload_model"}).json()
        r = httpx.post(gw.url + "/api/v1/retrieve_future", headers=h,
                       json={"request_id": rid["request_id"]}, timeout=60)
        assert r.json() == {"model_id": tc.model_id, "type": "unload_model"}
        assert len(c.get_status().adapters) < before
        assert httpx.post(gw.url + "/api/v1/get_info", headers=h,
                          json={"model_id": tc.model_id}).status_code == 404
        c.close()


def np_equal(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
