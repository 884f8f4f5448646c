"""engined_client — Python client of engined (see client.py)."""
from .client import EngineClient, EngineError, pb  # noqa: F401

__all__ = ["EngineClient", "EngineError", "pb"]
__version__ = "0.1.0"
