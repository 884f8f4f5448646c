"""engines.py — the daemons behind the gateway. Each engine is one engined
daemon or a data-parallel group (--engined A,B,...), initialized by the
gateway from the base model when a training model claims it:
  lora  the base frozen (Initialize frozen_base): any number of LoRA
        training models (adapters, up to max_adapters) and of samplers of
        the base or of adapter snapshots;
  full  one full fine-tuning model (LoRA rank 0), alone on the engine.
A free engine takes either role; an engine with nothing on it (a full
fine-tune unloaded, a LoRA engine whose adapters are all gone and that no
sampler of the base uses) takes either role again, initialized afresh."""
import asyncio

from ..aio import AsyncEngineClient
from ..group import AsyncEngineGroup
from .futures import Failed

CALL_TIMEOUT_S = 24 * 3600.0
RETRIES = 5


class NoEngine(Failed):
    """No engine can take the model (all busy, or none of the role): a
    capacity limit of this deployment, reported as a server failure."""

    def __init__(self, message):
        super().__init__(message, "server")


class Engine:
    def __init__(self, index, addresses, init, client_kwargs):
        self.index = index
        self.addresses = addresses
        self.init = dict(init)          # Initialize's model arguments
        self.client_kwargs = client_kwargs
        self.client = None
        self.role = None                # None (free), "lora", "full"
        self.models = set()             # model ids on it
        self.snapshots = 0              # snapshot adapters on it
        self.base_samplers = 0          # samplers of its base (never closed by the SDK)
        self.lock = asyncio.Lock()

    def unused(self):
        """Nothing on it: it may take any role (Initialize afresh)."""
        return not self.models and not self.snapshots and not self.base_samplers

    def open(self):
        # retries: a call whose connection to the daemon broke is sent
        # again under its request id (applied once: engine.proto).
        kw = dict(self.client_kwargs, timeout=CALL_TIMEOUT_S, retries=RETRIES)
        if len(self.addresses) == 1:
            self.client = AsyncEngineClient(self.addresses[0], **kw)
        else:
            self.client = AsyncEngineGroup(self.addresses, **kw)

    @property
    def sampler(self):
        """The client Sample goes to (a group's ranks hold the same weights)."""
        return self.client.clients[0] if len(self.addresses) > 1 else self.client

    async def become(self, role):
        """Initialize for `role` (the caller holds self.lock)."""
        await self.client.initialize(replace=True, frozen_base=(role == "lora"), **self.init)
        self.role = role

    async def close(self):
        if self.client is not None:
            await self.client.close()


class Engines:
    def __init__(self, groups, init, max_adapters, client_kwargs):
        self.all = [Engine(i, g, init, client_kwargs) for i, g in enumerate(groups)]
        self.max_adapters = max_adapters

    def open(self):
        for e in self.all:
            e.open()

    async def close(self):
        for e in self.all:
            await e.close()

    async def claim(self, role, model_id, adapters=1):
        """An engine for a new model (full: alone; lora: `adapters` more
        adapters), initialized for the role when it was free."""
        if role == "lora":
            for e in self.all:
                used = len(e.models) + e.snapshots
                if e.role == "lora" and used + adapters <= self.max_adapters:
                    e.models.add(model_id)
                    return e
        # A free engine, or an unused one of the other role (a LoRA engine
        # whose adapters are all gone becomes a full fine-tune's).
        for e in sorted(self.all, key=lambda e: e.role is not None):
            async with e.lock:
                if e.unused() and (e.role is None or e.role != role):
                    e.models.add(model_id)
                    try:
                        await e.become(role)
                    except BaseException:
                        e.models.discard(model_id)
                        e.role = None
                        raise
                    return e
        raise NoEngine("no engine can take a %s model now: %d engine(s), %s"
                       % ("LoRA" if role == "lora" else "full fine-tuning", len(self.all),
                          "; ".join("engine %d: %s with %d model(s)"
                                    % (e.index, e.role or "free", len(e.models))
                                    for e in self.all)))

    def release(self, engine, model_id):
        engine.models.discard(model_id)
        if engine.role == "full" and not engine.models:
            engine.role = None

    async def base(self):
        """A frozen-base engine, for samplers of the base model."""
        for e in self.all:
            if e.role == "lora":
                e.base_samplers += 1
                return e
        for e in self.all:
            async with e.lock:
                if e.unused():
                    await e.become("lora")
                    e.base_samplers += 1
                    return e
        raise NoEngine("no engine holds the untouched base model (each is training a full "
                       "fine-tune): start one more daemon")
