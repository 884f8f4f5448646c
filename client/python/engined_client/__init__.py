"""engined_client — Python client of engined.

EngineClient (client.py) and AsyncEngineClient (aio.py, asyncio) have one
method per RPC of engined.v1.TrainingEngine and return the typed results
of results.py; tensors.py holds the numpy / bfloat16 / torch helpers;
EngineGroup / AsyncEngineGroup (group.py) drive N daemons as one
data-parallel engine; shared.py picks up same-host shares (share_weights).
"""
from ._pb import pb  # noqa: F401
from ._rpc import REQUEST_ID_KEY, EngineError  # noqa: F401
from .aio import AsyncEngineClient  # noqa: F401
from .client import EngineClient  # noqa: F401
from .custom import forward_backward_custom  # noqa: F401
from .group import (AsyncEngineGroup, EngineGroup, ForwardBackwardPlan,  # noqa: F401
                    GroupError, GroupForwardBackwardResult, GroupMismatchError,
                    global_loss_options, split_sequences)
from .results import (Completion, ForwardBackwardResult, InitializeResult,  # noqa: F401
                      LoadResult, LrResult, Memory, Mode, Placement, SampleResult,
                      SaveResult, SetModeResult, SharedTensor, ShareTicket, Status,
                      StepResult)
from .shared import SharedWeights, open_share  # noqa: F401
from .tensors import HAVE_ML_DTYPES, tensor, to_numpy, to_torch  # noqa: F401

__all__ = ["EngineClient", "AsyncEngineClient", "EngineError", "pb", "REQUEST_ID_KEY",
           "forward_backward_custom", "EngineGroup", "AsyncEngineGroup", "GroupError",
           "GroupMismatchError", "GroupForwardBackwardResult", "ForwardBackwardPlan",
           "global_loss_options", "split_sequences",
           "ForwardBackwardResult", "InitializeResult", "LoadResult", "LrResult",
           "Memory", "Mode", "Placement", "SaveResult", "SetModeResult", "Status",
           "StepResult", "SampleResult", "Completion", "HAVE_ML_DTYPES", "tensor",
           "to_numpy", "to_torch",
           "SharedTensor", "ShareTicket", "SharedWeights", "open_share"]
__version__ = "0.2.0"
