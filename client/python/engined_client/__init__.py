"""engined_client — Python client of engined (see client.py)."""
from .client import EngineClient, EngineError, pb  # noqa: F401
from .custom import forward_backward_custom  # noqa: F401

__all__ = ["EngineClient", "EngineError", "pb", "forward_backward_custom"]
__version__ = "0.1.0"
