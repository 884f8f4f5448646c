"""Typed results of the RPCs: one small frozen dataclass per reply, its
fields named as the reply message's fields in engine.proto (so code that
read the protobuf replies, r.step or st.placement.model, reads these
unchanged). Both clients return the same types.

  initialize        -> InitializeResult
  set_mode          -> SetModeResult (mode: Mode, placement: Placement)
  forward_backward  -> ForwardBackwardResult (also a read-only mapping:
                       r["loss"] is r.loss, as when it was a dict)
  optimizer_step    -> StepResult
  zero_grad         -> None
  lr_scheduler_step -> LrResult (a float, the new lr; also .lr)
  to_device         -> Placement
  save_checkpoint   -> SaveResult
  load_checkpoint   -> LoadResult (an int, the global step; also .global_step)
  get_status        -> Status (placement: Placement, memory: Memory,
                       dist: DistStatus or None when the engine runs alone,
                       progress: JobProgress or None when idle,
                       adapters: tuple of the live adapters' names)
  create_group      -> CreateGroupResult (group_id: bytes, backend)
  create_adapter    -> CreateAdapterResult (name, num_parameters, num_tensors,
                       rank, alpha, target_modules: tuple, use_rslora)
  delete_adapter    -> None
  request_share     -> ShareTicket (handle: bytes, total_bytes, socket_path,
                       tensors: tuple of SharedTensor, expires_in_s, step)
  share_weights     -> shared.SharedWeights (a mapping of array views, not a
                       reply's fields: its .ticket is the ShareTicket)
  sample            -> SampleResult (completions: list of Completion sorted by
                       (prompt_index, sample_index), weights_version)
  sample_iter       -> Completion after Completion, as the stream delivers them

Results compare with == field by field (arrays by shape, dtype and values),
so two replies of one request id compare equal.
"""
import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Dict, List, Optional

import grpc
import numpy as np

from ._pb import pb
from ._rpc import EngineError
from .tensors import to_numpy


class Mode(enum.IntEnum):
    """engined.v1.Mode; equal to the protobuf values (Mode.TRAIN == pb.MODE_TRAIN)."""
    UNSPECIFIED = 0
    IDLE = 1
    TRAIN = 2
    EVAL = 3


def _mode(v):
    try:
        return Mode(v)
    except ValueError:  # a mode this client does not know (a newer daemon)
        return int(v)


def _from(cls, msg, **convert):
    """cls from the protobuf message msg: each field of cls is msg's field
    of that name, through convert[name] when given."""
    return cls(**{f.name: convert.get(f.name, _same)(getattr(msg, f.name))
                  for f in dataclasses.fields(cls)})


def _same(v):
    return v


@dataclass(frozen=True)
class Placement:
    """Where each state family lives: True = on the compute device."""
    model: bool
    optimizer: bool
    grad: bool

    @classmethod
    def from_proto(cls, m):
        return _from(cls, m)


@dataclass(frozen=True)
class Memory:
    device_bytes: int
    host_bytes: int
    rss_bytes: int
    activation_bytes: int
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    gathered_bytes: int

    @classmethod
    def from_proto(cls, m):
        return _from(cls, m)


@dataclass(frozen=True)
class InitializeResult:
    engine_key: str
    num_parameters: int
    num_tensors: int

    @classmethod
    def from_proto(cls, m):
        return _from(cls, m)


@dataclass(frozen=True)
class SetModeResult:
    mode: Mode
    placement: Placement

    @classmethod
    def from_proto(cls, m):
        return _from(cls, m, mode=_mode, placement=Placement.from_proto)


@dataclass(frozen=True)
class StepResult:
    """OptimizerStep: grad_norm before clipping; skipped: non-finite norm,
    no update; lr used; step: optimizer steps taken so far."""
    grad_norm: float
    skipped: bool
    lr: float
    step: int

    @classmethod
    def from_proto(cls, m):
        return _from(cls, m)


@dataclass(frozen=True)
class SaveResult:
    path: str    # relative to the daemon's checkpoint root
    bytes: int

    @classmethod
    def from_proto(cls, m):
        return _from(cls, m)


@dataclass(frozen=True)
class DistStatus:
    """This rank's place in its data-parallel group (GetStatus.dist)."""
    rank: int
    world_size: int
    backend: str
    optimizer_shard_parameters: int
    optimizer_bytes: int
    broken: bool
    bucket_bytes: int
    # The last forward_backward with reduce_gradients (docs/DISTRIBUTED.md).
    reduce_buckets: int
    reduce_bytes: int
    reduce_s: float
    reduce_wait_s: float
    zero_stage: int   # what the group shards: 1, 2 or 3 (DistConfig.zero_stage)

    @classmethod
    def from_proto(cls, m):
        return _from(cls, m)


@dataclass(frozen=True)
class JobProgress:
    """The running job's progress (GetStatus.progress): done of total
    unit in phase, elapsed_s since it started."""
    phase: str
    done: int
    total: int
    unit: str
    elapsed_s: float

    @classmethod
    def from_proto(cls, m):
        return _from(cls, m)


@dataclass(frozen=True)
class CreateGroupResult:
    """CreateGroup: the group id (a secret) to pass to every rank's
    Initialize as dist group_id, and the backend that will run it."""
    group_id: bytes
    backend: str

    @classmethod
    def from_proto(cls, m):
        return _from(cls, m)


@dataclass(frozen=True)
class CreateAdapterResult:
    """CreateAdapter: what the adapter was made with (its PEFT directory's
    values when it came from one) and its own parameters (A and B)."""
    name: str
    num_parameters: int
    num_tensors: int
    rank: int
    alpha: float
    target_modules: tuple
    use_rslora: bool

    @classmethod
    def from_proto(cls, m):
        return _from(cls, m, target_modules=tuple)


@dataclass(frozen=True)
class SharedTensor:
    """One tensor of a share: `bytes` bytes at `offset` of the shared file
    (a multiple of 64); dtype a DType value, shape a tuple."""
    name: str
    dtype: int
    shape: tuple
    offset: int
    bytes: int

    @classmethod
    def from_proto(cls, m):
        return _from(cls, m, shape=tuple)


@dataclass(frozen=True)
class ShareTicket:
    """ShareWeights: what picks the share up (shared.open_share), from any
    process of the daemon's host: the handle (a secret, good for the uses
    asked for until expires_in_s after the reply), the side socket's path,
    the file's size and its index; step: the engine step the weights are
    of. Picklable, to hand it to the process that opens it."""
    handle: bytes
    total_bytes: int
    socket_path: str
    tensors: tuple
    expires_in_s: float
    step: int

    @classmethod
    def from_proto(cls, m):
        return _from(cls, m, handle=bytes,
                     tensors=lambda ts: tuple(SharedTensor.from_proto(t) for t in ts))


@dataclass(frozen=True)
class Status:
    """GetStatus: every field of GetStatusResponse."""
    engine_key: str
    mode: Mode
    placement: Placement
    step: int
    lr: float
    num_parameters: int
    memory: Memory
    version: str
    uptime: float
    busy: bool
    initialized: bool
    sched_step: int
    current_job: str
    queued_jobs: int
    accumulated_calls: int
    accumulated_tokens: int
    last_request_id: str
    dist: Optional[DistStatus]
    progress: Optional[JobProgress]
    pending_shares: int
    pending_share_bytes: int
    matmul: str
    adapters: tuple

    @classmethod
    def from_proto(cls, m):
        return _from(cls, m, mode=_mode, placement=Placement.from_proto,
                     memory=Memory.from_proto, adapters=tuple,
                     dist=lambda d: DistStatus.from_proto(d) if m.HasField("dist") else None,
                     progress=lambda p: (JobProgress.from_proto(p)
                                         if m.HasField("progress") else None))


class LrResult(float):
    """LrSchedulerStep: the new learning rate. A float (what
    lr_scheduler_step always returned) that also has .lr."""
    __slots__ = ()

    @property
    def lr(self):
        return float(self)

    def __repr__(self):
        return "LrResult(lr=%r)" % float(self)

    @classmethod
    def from_proto(cls, m):
        return cls(m.lr)


class LoadResult(int):
    """LoadCheckpoint: the loaded checkpoint's global step. An int (what
    load_checkpoint always returned) that also has .global_step."""
    __slots__ = ()

    @property
    def global_step(self):
        return int(self)

    def __repr__(self):
        return "LoadResult(global_step=%d)" % int(self)

    @classmethod
    def from_proto(cls, m):
        return cls(m.global_step)


def _array(t):
    return to_numpy(t)


def _equal(a, b):
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
                and a.dtype == b.dtype and np.array_equal(a, b))
    return a == b


@dataclass(frozen=True, eq=False)
class ForwardBackwardResult(Mapping):
    """ForwardBackward: loss, metrics (name -> float), num_micro_batches,
    and the per-token float32 [N] outputs asked for (log_probs, entropy,
    values; None when not asked). Also a read-only mapping of those six
    keys (r["loss"], r["log_probs"], dict(r)), as the dict it replaced."""
    loss: float
    metrics: Dict[str, float]
    num_micro_batches: int
    log_probs: Optional[np.ndarray] = None
    entropy: Optional[np.ndarray] = None
    values: Optional[np.ndarray] = None
    # A mixture of experts: each experts layer's load (the most tokens an
    # expert took over the mean), float64 [layers]; None for dense models.
    expert_load: Optional[np.ndarray] = None
    # With return_routed_experts: the routing the call used, int32 [N,
    # experts layers, experts_per_tok] (what routed_experts replays).
    routed_experts: Optional[np.ndarray] = None

    @classmethod
    def from_proto(cls, m):
        return cls(loss=m.loss, metrics=dict(m.metrics), num_micro_batches=m.num_micro_batches,
                   log_probs=_array(m.log_probs) if m.HasField("log_probs") else None,
                   entropy=_array(m.entropy) if m.HasField("entropy") else None,
                   values=_array(m.values) if m.HasField("values") else None,
                   expert_load=np.asarray(m.expert_load, np.float64) if len(m.expert_load)
                   else None,
                   routed_experts=_array(m.routed_experts) if m.HasField("routed_experts")
                   else None)

    # Mapping: the fields by name.
    def __getitem__(self, key):
        if key in _FB_KEYS:
            return getattr(self, key)
        raise KeyError(key)

    def __iter__(self):
        return iter(_FB_KEYS)

    def __len__(self):
        return len(_FB_KEYS)

    def __eq__(self, other):
        if not isinstance(other, Mapping):
            return NotImplemented
        return set(other.keys()) == set(_FB_KEYS) and all(
            _equal(self[k], other[k]) for k in _FB_KEYS)

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = None

    def __repr__(self):
        def show(v):
            if isinstance(v, np.ndarray):
                return "array(%s, shape=%s)" % (v.dtype, v.shape)
            return repr(v)
        return "ForwardBackwardResult(%s)" % ", ".join(
            "%s=%s" % (k, show(getattr(self, k))) for k in _FB_KEYS)


# The mapping's keys: the six of the dict the result replaced (expert_load
# and routed_experts, later, are attributes only).
_FB_KEYS = tuple(f.name for f in dataclasses.fields(ForwardBackwardResult)
                 if f.name not in ("expert_load", "routed_experts"))

# FinishReason by value: "stop", "length" (the enum's names without their
# prefix, lowercase; "unspecified" for 0).
_FINISH = {v.number: v.name[len("FINISH_REASON_"):].lower()
           for v in pb.FinishReason.DESCRIPTOR.values}


def _finish(v):
    return _FINISH.get(v, int(v))  # a reason this client does not know: the number


def _floats(values):
    return np.array(values, dtype=np.float32)


def _per_token(values, dtype, n, field):
    """A [len(token_ids), k] array of a completion's top_* field (k
    entries per new token), or None when the field is empty (k = 0)."""
    if not len(values):
        return None
    if n == 0 or len(values) % n:
        raise EngineError(grpc.StatusCode.DATA_LOSS,
                          "Completion.%s: %d entries for %d tokens" % (field, len(values), n))
    return np.array(values, dtype=dtype).reshape(n, len(values) // n)


@dataclass(frozen=True, eq=False)
class Completion:
    """One completion of Sample (engine.proto Completion): prompt_index
    (in seq_lens), sample_index (0 .. num_samples - 1), token_ids (the new
    tokens), logprobs (float32 [n], each new token's log-prob at the
    call's temperature), finish_reason ("stop": a stop token or sequence,
    the last tokens; "length": max_tokens reached), top_token_ids (int32
    [n, top_logprobs]) and top_logprobs (float32 [n, top_logprobs]), best
    first, None when top_logprobs was 0; prompt_logprobs (float32
    [prompt length], entry 0 is 0) on each prompt's sample 0 when asked,
    else None. Compares with == field by field (arrays by dtype, shape and
    values)."""
    prompt_index: int
    sample_index: int
    token_ids: List[int]
    logprobs: np.ndarray
    finish_reason: str
    top_token_ids: Optional[np.ndarray] = None
    top_logprobs: Optional[np.ndarray] = None
    prompt_logprobs: Optional[np.ndarray] = None

    @classmethod
    def from_proto(cls, m):
        n = len(m.token_ids)
        return cls(prompt_index=m.prompt_index, sample_index=m.sample_index,
                   token_ids=list(m.token_ids), logprobs=_floats(m.logprobs),
                   finish_reason=_finish(m.finish_reason),
                   top_token_ids=_per_token(m.top_token_ids, np.int32, n, "top_token_ids"),
                   top_logprobs=_per_token(m.top_logprobs, np.float32, n, "top_logprobs"),
                   prompt_logprobs=(_floats(m.prompt_logprobs) if len(m.prompt_logprobs)
                                    else None))

    @classmethod
    def of_reply(cls, m):
        """The completions of one SampleResponse, in its order."""
        return [cls.from_proto(c) for c in m.completions]

    def __eq__(self, other):
        if not isinstance(other, Completion):
            return NotImplemented
        return all(_equal(getattr(self, f.name), getattr(other, f.name))
                   for f in dataclasses.fields(self))

    __hash__ = None


@dataclass(frozen=True)
class SampleResult:
    """Sample, the whole stream: every completion, sorted by
    (prompt_index, sample_index), and weights_version (the optimizer steps
    behind the weights sampled)."""
    completions: List[Completion]
    weights_version: int

    @classmethod
    def from_proto(cls, m):
        return cls.from_replies([m])

    @classmethod
    def from_replies(cls, replies):
        """From all the SampleResponse messages of one call (every one
        carries the same weights_version; 0 when there are none)."""
        done = [c for m in replies for c in Completion.of_reply(m)]
        done.sort(key=lambda c: (c.prompt_index, c.sample_index))
        return cls(completions=done,
                   weights_version=replies[0].weights_version if replies else 0)

# Each typed result and the reply message it stands for (tests check that
# every field of the message is there).
REPLY_TYPES = {
    InitializeResult: pb.InitializeResponse,
    SetModeResult: pb.SetModeResponse,
    ForwardBackwardResult: pb.ForwardBackwardResponse,
    StepResult: pb.OptimizerStepResponse,
    LrResult: pb.LrSchedulerStepResponse,
    Placement: pb.Placement,
    SaveResult: pb.SaveCheckpointResponse,
    LoadResult: pb.LoadCheckpointResponse,
    Status: pb.GetStatusResponse,
    Memory: pb.Memory,
    DistStatus: pb.DistStatus,
    JobProgress: pb.JobProgress,
    CreateGroupResult: pb.CreateGroupResponse,
    CreateAdapterResult: pb.CreateAdapterResponse,
    ShareTicket: pb.ShareWeightsResponse,
    SharedTensor: pb.SharedTensor,
    SampleResult: pb.SampleResponse,
    Completion: pb.Completion,
}
