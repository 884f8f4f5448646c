"""The verl backend's data-parallel methods (issue 14 item 2, with issue
13's groups): both ways of running several daemons under verl, against one
daemon on the whole batch.

  - verl alone, two addresses: the adapter drives them as one EngineGroup
    (verl sees one data-parallel rank; engined splits the batch);
  - a torch.distributed world of two verl processes (dp_rank.py), one
    daemon each, formed into an engined group by the adapter: verl's
    ranks each pass their share of the batch and verl's global
    normalizers (batch_num_tokens all-reduced over torch.distributed,
    dp_size 2), through the server-side loss and the custom path.
Both without LoRA and with it (lora_rank 8: a frozen base and one
adapter per daemon, the adapter the group's). After one PPO update
(lr 1e-3) the parameters (with LoRA: the adapter's) equal one daemon's on
the whole batch within 1e-5 (fp32 reorderings of the reduction; Adam divides
them by the gradient's size), the losses within 1e-5 and the grad norms
within 1e-6 relative.
"""
import functools
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest
import torch

from daemon_fixture import Daemon

import verl  # noqa: F401
from verl.trainer.config import CheckpointConfig
from verl.workers.engine import EngineRegistry
from verl.workers.utils.losses import ppo_loss

import verl_batches as vb

torch.set_num_threads(2)
HERE = os.path.dirname(os.path.abspath(__file__))
SEED = 11
BSZ = 6


@pytest.fixture(scope="module")
def daemons():
    ds = [Daemon() for _ in range(3)]
    yield ds
    for d in ds:
        d.stop()


def cfg():
    return vb.actor_config(clip_ratio_high=0.28, use_kl_loss=True, kl_loss_coef=0.1)


def engine(addresses, tmp, lora=False, zero_stage=None):
    lora_kw = dict(lora_rank=8, lora_alpha=16) if lora else {}
    eng = EngineRegistry.new(
        model_type="language_model", backend="engined",
        model_config=vb.model_config(tmp, **lora_kw),
        engine_config=vb.engine_config(addresses, collective_timeout_s=60,
                                       zero_stage=zero_stage),
        optimizer_config=vb.optimizer_config(), checkpoint_config=CheckpointConfig())
    eng.initialize()
    return eng


def one_update(eng, fn):
    with eng.train_mode():
        r = eng.train_batch(vb.rollout_batch(SEED, bsz=BSZ), fn)
    gen, _ = eng.get_per_tensor_param(base_sync_done=True)   # with LoRA: the adapter
    return {k: v.clone() for k, v in gen}, r["loss"][0], r["metrics"]["grad_norm"]


def max_diff(a, b):
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


@pytest.fixture(scope="module")
def references(daemons):
    """One daemon's update on the whole batch, by lora (computed once)."""
    done = {}

    def get(lora):
        if lora not in done:
            with tempfile.TemporaryDirectory() as tmp:
                done[lora] = one_update(engine([daemons[0].addr], tmp, lora),
                                        functools.partial(ppo_loss, config=cfg()))
        return done[lora]
    return get


@pytest.mark.parametrize("lora,zero_stage", [(False, None), (True, None), (False, 3)])
def test_one_verl_process_drives_an_engine_group(daemons, references, lora, zero_stage):
    """zero_stage 3: the parameters sharded across the two daemons, the
    weights streamed with every rank gathering each tensor."""
    want, loss, norm = references(lora)
    with tempfile.TemporaryDirectory() as tmp:
        eng = engine([daemons[1].addr, daemons[2].addr], tmp, lora, zero_stage)
        assert eng.get_data_parallel_size() == 1
        got, gloss, gnorm = one_update(eng, functools.partial(ppo_loss, config=cfg()))
        st = eng.daemon.get_status()
    assert [s.dist.world_size for s in st] == [2, 2]
    print("EngineGroup of 2%s: max |dparam| %.3g, loss %.9g vs %.9g, grad norm %.9g vs %.9g"
          % (" (LoRA)" if lora else "", max_diff(got, want), gloss, loss, gnorm, norm))
    assert max_diff(got, want) <= 1e-5
    assert abs(gloss - loss) <= 1e-5 * max(1.0, abs(loss))
    assert abs(gnorm - norm) <= 1e-6 * norm


@pytest.mark.parametrize("lora", [False, True])
def test_one_daemon_per_torch_distributed_rank(daemons, references, lora):
    want, loss, norm = references(lora)
    with tempfile.TemporaryDirectory() as tmp:
        init, out = os.path.join(tmp, "rendezvous"), os.path.join(tmp, "rank0.pt")
        addrs = ",".join(d.addr for d in daemons[1:])
        env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
        procs = [subprocess.Popen([sys.executable, "-W", "ignore", os.path.join(HERE, "dp_rank.py"),
                                   str(r), "2", init, addrs, out, str(SEED), str(int(lora))],
                                  env=env)
                 for r in range(2)]
        codes = [p.wait(timeout=300) for p in procs]
        assert codes == [0, 0]
        res = torch.load(out)
    for path in ("server", "custom"):
        print("2 verl ranks%s, %s path: max |dparam| %.3g, grad norm %.9g vs %.9g"
              % (" (LoRA)" if lora else "", path, max_diff(res[path], want),
                 res[path + "_grad_norm"], norm))
        assert max_diff(res[path], want) <= 1e-5, path
        # rank 0's loss is its share of the objective (dp_size 2): verl's
        # ranks' losses average to the whole batch's.
        assert np.isfinite(res[path + "_loss"])
        assert abs(res[path + "_grad_norm"] - norm) <= 1e-6 * norm, path
