"""examples/verl/config against the real verl 0.9.1: verl's own trainer
config (ppo_trainer.yaml) composed by Hydra with the example's search path
and model_engine=engined gives actor, reference and critic configs that
verl's workers turn into engined engines (omega_conf_to_dataclass as
verl.workers.engine_workers does, including its reference-config renames),
and EngineRegistry resolves their strategy to the engined engines."""
import os

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import open_dict

import verl
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.engine import EngineRegistry

from engined_client.verl import (EnginedEngineConfig, EnginedEngineWithLMHead,
                                 EnginedEngineWithValueHead)

import verl_batches as vb

EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../examples/verl/config")


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    model = vb.model_config(str(tmp_path_factory.mktemp("critic")), value=True).path
    cdir = os.path.join(os.path.dirname(verl.__file__), "trainer/config")
    with initialize_config_dir(config_dir=cdir, version_base=None):
        return compose("ppo_trainer", overrides=[
            "hydra.searchpath=[file://%s]" % os.path.abspath(EXAMPLE), "model_engine=engined",
            "actor_rollout_ref.actor.engine.addresses=[gpu0:50051,gpu1:50051]",
            "actor_rollout_ref.actor.engine.model_path=Qwen2.5-0.5B",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
            "critic.ppo_micro_batch_size_per_gpu=2", "critic.model.path=%s" % model,
            "+critic.model.load_tokenizer=false"])


def test_actor_config(cfg):
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert actor.strategy == "engined"
    assert isinstance(actor.engine, EnginedEngineConfig)
    assert actor.engine.address_list() == ["gpu0:50051", "gpu1:50051"]
    assert actor.engine.model_path == "Qwen2.5-0.5B" and actor.engine.dtype == "bfloat16"
    assert EngineRegistry.get_engine_cls("language_model", actor.engine.strategy) \
        is EnginedEngineWithLMHead


def test_reference_config_follows_the_actor(cfg):
    ref = cfg.actor_rollout_ref.ref
    with open_dict(ref):  # verl.workers.engine_workers.init_model's renames
        ref.ppo_mini_batch_size = cfg.actor_rollout_ref.actor.ppo_mini_batch_size
        ref.ppo_micro_batch_size = ref.pop("log_prob_micro_batch_size", None)
        ref.ppo_micro_batch_size_per_gpu = ref.pop("log_prob_micro_batch_size_per_gpu", None)
        ref.use_dynamic_bsz = ref.pop("log_prob_use_dynamic_bsz", False)
        ref.ppo_max_token_len_per_gpu = ref.pop("log_prob_max_token_len_per_gpu", None)
    ref = omega_conf_to_dataclass(ref)
    assert isinstance(ref.engine, EnginedEngineConfig) and ref.engine.forward_only
    assert ref.engine.address_list() == ["gpu0:50051", "gpu1:50051"]
    assert ref.engine.model_path == "Qwen2.5-0.5B"


def test_critic_config(cfg):
    critic = omega_conf_to_dataclass(cfg.critic)
    assert critic.strategy == "engined" and isinstance(critic.engine, EnginedEngineConfig)
    assert EngineRegistry.get_engine_cls("value_model", critic.engine.strategy) \
        is EnginedEngineWithValueHead
