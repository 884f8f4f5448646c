"""engined_client.verl — engined as a verl training-engine backend.

Importing this package registers the engined engines in verl's
EngineRegistry, backend "engined", for model_type "language_model"
(EnginedEngineWithLMHead) and "value_model" (EnginedEngineWithValueHead),
on every device verl may run its workers on (the daemons' own device is
EnginedEngineConfig.device). verl imports it by itself through the
`verl.plugins` entry point of this package (client/python/pyproject.toml;
VERL_USE_EXTERNAL_PLUGINS=auto, verl's default), or with
VERL_USE_EXTERNAL_MODULES=engined_client.verl. Select it with an engine
config of strategy "engined" (examples/verl/). Needs verl (0.9.1), torch
2.x and tensordict.
"""
from verl.workers.engine.base import EngineRegistry

from .config import STRATEGY, EnginedEngineConfig
from .engine import EnginedEngine, EnginedEngineWithLMHead, EnginedEngineWithValueHead
from .layout import Packed, pack

DEVICES = ["cuda", "cpu", "npu"]


def register():
    """Register the engines once (verl asserts on a second registration)."""
    for model_type, cls in (("language_model", EnginedEngineWithLMHead),
                            ("value_model", EnginedEngineWithValueHead)):
        if STRATEGY not in EngineRegistry._engines.get(model_type, {}):
            EngineRegistry.register(model_type=model_type, backend=STRATEGY,
                                    device=DEVICES)(cls)


register()

__all__ = ["EnginedEngineConfig", "EnginedEngine", "EnginedEngineWithLMHead",
           "EnginedEngineWithValueHead", "Packed", "pack", "register", "STRATEGY"]
