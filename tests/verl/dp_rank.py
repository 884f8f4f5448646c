"""dp_rank.py — one verl data-parallel rank driving its own daemon (the
"one daemon per verl rank" mode of engined_client.verl), for
test_verl_data_parallel.py: torch.distributed (gloo, a file rendezvous) of
WORLD processes; rank r's adapter drives addresses[r], the daemons form an
engined group. Each rank trains one PPO update on its share of the batch,
once with verl's ppo_loss mapped to the server and once through the
custom-gradient path, and rank 0 saves both parameter sets (torch.save).

Usage: dp_rank.py RANK WORLD INIT_FILE ADDRESSES(comma) OUT SEED LORA(0|1)
(LORA 1: lora_rank 8, the adapter's tensors saved)
"""
import functools
import sys
import tempfile

import torch

import verl  # noqa: F401
from verl.trainer.config import CheckpointConfig
from verl.workers.engine import EngineRegistry
from verl.workers.utils.losses import ppo_loss

import verl_batches as vb


def main():
    rank, world, init, addresses, out, seed, lora = sys.argv[1:8]
    rank, world, seed = int(rank), int(world), int(seed)
    lora_kw = dict(lora_rank=8, lora_alpha=16) if lora == "1" else {}
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method="file://" + init, rank=rank,
                                         world_size=world)
    cfg = vb.actor_config(clip_ratio_high=0.28, use_kl_loss=True, kl_loss_coef=0.1)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        eng = EngineRegistry.new(
            model_type="language_model", backend="engined", model_config=vb.model_config(tmp, **lora_kw),
            engine_config=vb.engine_config(addresses.split(","), collective_timeout_s=60),
            optimizer_config=vb.optimizer_config(), checkpoint_config=CheckpointConfig())
        assert eng.get_data_parallel_size() == world and eng.get_data_parallel_rank() == rank
        for path, fn in (("server", functools.partial(ppo_loss, config=cfg)),
                         ("custom", lambda **kw: ppo_loss(cfg, **kw))):
            eng.initialize()
            data = vb.rollout_batch(seed, bsz=6, part=(rank, world))
            with eng.train_mode():
                r = eng.train_batch(data, fn)
            gen, _ = eng.get_per_tensor_param(base_sync_done=True)
            results[path] = {k: v.clone() for k, v in gen}
            results[path + "_loss"] = r["loss"][0]
            results[path + "_grad_norm"] = r["metrics"]["grad_norm"]
    if rank == 0:
        torch.save(results, out)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
