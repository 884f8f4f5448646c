"""The RPC methods of both clients, written once: each builds its request
and hands it to the client's _rpc(method, request, reply_class, convert,
timeout, request_id), which sends it (the request id and retries of
_rpc.Attempts) and returns convert(reply): EngineClient at once, and
AsyncEngineClient as a coroutine (aio.py wraps each method in `async def`).
A server stream goes through _rpc_stream(method, request, reply_class,
convert, timeout) (convert(every reply), the same way) or
_stream_items(method, request, reply_class, items, timeout) (a generator,
an async generator in AsyncEngineClient, of what items(reply) lists)."""
import json

import numpy as np

from . import results as R
from ._pb import pb
from .shared import open_share
from .tensors import DTYPES, tensor

_MODES = {"idle": pb.MODE_IDLE, "train": pb.MODE_TRAIN, "eval": pb.MODE_EVAL}

# The request's per-token FLOAT32 arrays (the loss library's table,
# engines/loss/loss.h LOSS_REQUEST_INPUTS): the proto's Tensor fields but the
# INT32 ones (input_ids, target_ids, routed_experts).
_PER_TOKEN = tuple(f.name for f in pb.ForwardBackwardRequest.DESCRIPTOR.fields
                   if f.message_type is not None and f.message_type.name == "Tensor"
                   and f.name not in ("input_ids", "target_ids", "routed_experts"))


def routed_experts_tensor(routed):
    """The INT32 [N, layers, experts_per_tok] Tensor of a routing replay
    (any integer array of that shape: verl's int64 or int16 included)."""
    a = np.asarray(routed)
    if a.ndim != 3 or not np.issubdtype(a.dtype, np.integer):
        raise ValueError("routed_experts: an integer array [N, layers, experts_per_tok], "
                         "got %s %s" % (a.dtype, a.shape))
    if a.size and (a.min() < -2**31 or a.max() >= 2**31):
        raise ValueError("routed_experts: ids outside int32")
    return tensor(a.astype(np.int32), pb.INT32)


def _token_ids(ids):
    """An INT32 [N] Tensor of token ids: a sequence or a numpy array of
    ints, flattened."""
    return tensor(np.asarray(ids, dtype=np.int32).reshape(-1), pb.INT32)


def _loss_spec(loss, options):
    if loss is None:
        return None
    opts = dict(options or {})
    if isinstance(loss, dict):
        loss = dict(loss)
        name = loss.pop("name")
        opts.update(loss)
    else:
        name = loss

    def text(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, float):
            return repr(v)
        return str(v)
    return pb.LossSpec(name=name, options={k: text(v) for k, v in opts.items()})


def _none(_reply):
    return None


def _placement(reply):
    return R.Placement.from_proto(reply.placement)


def _health(raw):
    status = raw[1] if len(raw) >= 2 and raw[0] == 0x08 else 0
    return {1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}.get(status, "UNKNOWN")


def _health_request(service):
    """grpc.health.v1.HealthCheckRequest{service} (field 1, a string)."""
    s = service.encode()
    if not s:
        return b""
    n, size = len(s), bytearray()
    while True:
        if n < 0x80:
            size.append(n)
            break
        size.append(n & 0x7F | 0x80)
        n >>= 7
    return b"\x0a" + bytes(size) + s


def _raw(reply):
    return reply


# GetPerTensorParam's adapter_view by name (engine.proto AdapterView).
ADAPTER_VIEWS = {"adapter": pb.ADAPTER_VIEW_ADAPTER, "base": pb.ADAPTER_VIEW_BASE,
                 "merged": pb.ADAPTER_VIEW_MERGED}


def param_request(dtype="float32", names=None, bucket_bytes=0, adapter="",
                  adapter_view="adapter", gather_only=False):
    dt = DTYPES[dtype] if isinstance(dtype, str) else dtype
    view = ADAPTER_VIEWS[adapter_view] if isinstance(adapter_view, str) else adapter_view
    return pb.GetPerTensorParamRequest(dtype=dt, names=list(names or []),
                                       bucket_bytes=bucket_bytes, adapter=adapter,
                                       adapter_view=view, gather_only=gather_only)


# PEFT LoraConfig's defaults (r, lora_alpha; target_modules for the Llama
# family), which create_adapter takes without peft_dir.
ADAPTER_DEFAULT_RANK = 8
ADAPTER_DEFAULT_TARGETS = ("q_proj", "v_proj")


def share_request(dtype="float32", names=None, uses=1, adapter="", adapter_view="adapter",
                  gather_only=False):
    dt = DTYPES[dtype] if isinstance(dtype, str) else dtype
    view = ADAPTER_VIEWS[adapter_view] if isinstance(adapter_view, str) else adapter_view
    return pb.ShareWeightsRequest(dtype=dt, names=list(names or []), uses=uses,
                                  adapter=adapter, adapter_view=view, gather_only=gather_only)


def _sample_request_of(args):
    """sample_request from a sample method's arguments (its locals())."""
    return sample_request(**{k: v for k, v in args.items() if k not in ("self", "timeout")})


def sample_request(input_ids, seq_lens, *, max_tokens, num_samples=1, temperature=None,
                   top_k=0, top_p=None, seed=0, stop_token_ids=(), stop_sequences=(),
                   top_logprobs=0, prompt_logprobs=False, adapter="",
                   max_tokens_per_micro_batch=0):
    """The SampleRequest of Api.sample's arguments (None leaves temperature
    and top_p unset: the daemon's defaults, 1 and off)."""
    req = pb.SampleRequest(
        input_ids=_token_ids(input_ids), seq_lens=[int(s) for s in seq_lens],
        num_samples=num_samples, max_tokens=max_tokens, top_k=top_k, seed=seed,
        stop_token_ids=[int(t) for t in stop_token_ids],
        stop_sequences=[pb.StopSequence(token_ids=[int(t) for t in s])
                        for s in stop_sequences],
        top_logprobs=top_logprobs, prompt_logprobs=prompt_logprobs, adapter=adapter,
        max_tokens_per_micro_batch=max_tokens_per_micro_batch)
    if temperature is not None:
        req.temperature = temperature
    if top_p is not None:
        req.top_p = top_p
    return req


class Api:
    """The methods of engined.v1.TrainingEngine (see EngineClient)."""

    # The methods aio.AsyncEngineClient turns into coroutines.
    RPC_METHODS = ("initialize", "set_mode", "forward_backward", "optimizer_step",
                   "zero_grad", "lr_scheduler_step", "to_device", "save_checkpoint",
                   "load_checkpoint", "get_status", "create_group", "health", "call_raw",
                   "share_weights", "request_share", "create_adapter", "delete_adapter",
                   "sample")

    def initialize(self, *, preset="", hf_config_json="", model_path="",
                   model_type="", backend="", device="", seed=0, optimizer=None,
                   lr_scheduler=None, offload=None, max_tokens_per_micro_batch=0,
                   dist=None, bf16_matmul=False, replace=False, frozen_base=False,
                   kv_cache_bytes=0, activation_recompute=None, timeout=None,
                   request_id=None, progress=None):
        """Build the engine. Exactly one of preset, hf_config_json (a dict or
        the JSON text), model_path. replace: required to replace an engine
        that is already initialized (else FAILED_PRECONDITION); it deletes
        the old engine's adapters. frozen_base: the model is a frozen base
        for LoRA adapters (create_adapter): it keeps no gradients or
        optimizer state and only scores (forward_only) itself.
        kv_cache_bytes: the most device bytes sample's key/value cache may
        hold (0: the daemon's default, 1 GiB). activation_recompute: the
        training calls' default (None: off): each layer's input kept, the
        layer recomputed in the backward, the same gradients bit for bit.
        optimizer / lr_scheduler /
        offload / dist: dicts of the proto fields. progress: a callable(done, total, phase)
        or a tqdm-like object (update(n)) told the tensors built while the
        call runs (_progress.py). Returns an InitializeResult (engine_key,
        num_parameters, num_tensors)."""
        if isinstance(hf_config_json, dict):
            hf_config_json = json.dumps(hf_config_json)
        req = pb.InitializeRequest(
            preset=preset, hf_config_json=hf_config_json, model_path=model_path,
            model_type=model_type, backend=backend, device=device, seed=seed,
            max_tokens_per_micro_batch=max_tokens_per_micro_batch,
            bf16_matmul=bf16_matmul, replace=replace, frozen_base=frozen_base,
            kv_cache_bytes=kv_cache_bytes)
        if activation_recompute is not None:
            req.activation_recompute = bool(activation_recompute)
        if optimizer:
            req.optimizer.CopyFrom(pb.OptimizerConfig(**optimizer))
        if lr_scheduler:
            req.lr_scheduler.CopyFrom(pb.LrSchedulerConfig(**lr_scheduler))
        if offload:
            req.offload.CopyFrom(pb.OffloadConfig(**offload))
        if dist:
            req.dist.CopyFrom(pb.DistConfig(**dist))
        return self._rpc("Initialize", req, pb.InitializeResponse,
                         R.InitializeResult.from_proto, timeout, request_id, progress)

    def set_mode(self, mode, disable_auto_offload=False, timeout=None, request_id=None,
                 adapter=""):
        """mode: "idle" | "train" | "eval" (or a Mode / pb.Mode value).
        adapter: the LoRA adapter whose mode it sets ("": the base model;
        the same for every method that takes it). Returns a SetModeResult
        (mode, placement)."""
        m = _MODES[mode] if isinstance(mode, str) else int(mode)
        return self._rpc("SetMode", pb.SetModeRequest(
            mode=m, disable_auto_offload=disable_auto_offload, adapter=adapter),
            pb.SetModeResponse, R.SetModeResult.from_proto, timeout, request_id)

    def forward_backward(self, input_ids, seq_lens, *, loss=None, loss_options=None,
                         forward_only=False, temperature=1.0,
                         return_log_probs=False, return_entropy=False,
                         return_values=False, max_tokens_per_micro_batch=0,
                         target_ids=None, reduce_gradients=False, adapter="",
                         activation_recompute=None, routed_experts=None,
                         return_routed_experts=False, timeout=None, request_id=None,
                         **per_token):
        """input_ids: int32 [N] (packed); seq_lens: sum N. loss: a name
        ("sft", "ppo", ...) or a dict {"name": ..., option: value}; options
        are stringified. Per-token float32 [N] arrays by keyword: loss_mask,
        old_log_probs, ref_log_probs, advantages, returns, old_values,
        is_weights, token_weights; grad_log_probs, grad_entropy,
        grad_values with loss="custom" (see forward_backward_custom).
        target_ids: int32 [N], the token each entry's log-prob is of
        (default: the next token). reduce_gradients: in a data-parallel
        group, the last accumulation before optimizer_step: the gradients
        are reduced across the ranks during this call's backward pass
        (every rank must set it; see engine.proto). adapter: the LoRA
        adapter that runs with the base and whose gradients accumulate
        ("": the base model alone). activation_recompute: this call's
        (None: the engine's; see initialize). routed_experts: a mixture of
        experts' routing to replay, integers [N, layers, experts_per_tok]
        (verl's routed_experts, R2/R3; see engine.proto);
        return_routed_experts: the routing the call used comes back as
        r.routed_experts (int32 [N, experts layers, experts_per_tok]).
        request_id: this call's id (default: a fresh one). Returns a
        ForwardBackwardResult: loss, metrics, num_micro_batches and the
        numpy outputs asked for (log_probs, entropy, values; None
        otherwise); r["loss"] works too."""
        unknown = set(per_token) - set(_PER_TOKEN)
        if unknown:
            raise TypeError("unknown per-token arrays: %s" % ", ".join(sorted(unknown)))
        req = pb.ForwardBackwardRequest(
            input_ids=_token_ids(input_ids),
            seq_lens=[int(s) for s in seq_lens], forward_only=forward_only,
            temperature=temperature, return_log_probs=return_log_probs,
            return_entropy=return_entropy, return_values=return_values,
            max_tokens_per_micro_batch=max_tokens_per_micro_batch,
            reduce_gradients=reduce_gradients, adapter=adapter,
            return_routed_experts=return_routed_experts)
        if target_ids is not None:
            req.target_ids.CopyFrom(_token_ids(target_ids))
        if routed_experts is not None:
            req.routed_experts.CopyFrom(routed_experts_tensor(routed_experts))
        if activation_recompute is not None:
            req.activation_recompute = bool(activation_recompute)
        spec = _loss_spec(loss, loss_options)
        if spec is not None:
            req.loss.CopyFrom(spec)
        for k, v in per_token.items():
            if v is not None:
                getattr(req, k).CopyFrom(
                    tensor(np.asarray(v, dtype=np.float32).reshape(-1), pb.FLOAT32))
        return self._rpc("ForwardBackward", req, pb.ForwardBackwardResponse,
                         R.ForwardBackwardResult.from_proto, timeout, request_id)

    def optimizer_step(self, timeout=None, request_id=None, adapter="", **params):
        """Clip, AdamW, zero the gradients (of `adapter`, "": the base).
        params: this step's lr, beta1, beta2, eps, weight_decay, clip_grad
        in place of the configured ones (0 is a value: lr=0.0 applies only
        the weight decay). Returns a StepResult (grad_norm, skipped, lr,
        step)."""
        return self._rpc("OptimizerStep", pb.OptimizerStepRequest(adapter=adapter, **params),
                         pb.OptimizerStepResponse, R.StepResult.from_proto, timeout,
                         request_id)

    def zero_grad(self, timeout=None, request_id=None, adapter=""):
        """Drop the gradients accumulated since the last step. Returns None."""
        return self._rpc("ZeroGrad", pb.ZeroGradRequest(adapter=adapter), pb.ZeroGradResponse,
                         _none, timeout, request_id)

    def lr_scheduler_step(self, timeout=None, request_id=None, adapter=""):
        """Advance the schedule. Returns the new lr: an LrResult (a float)."""
        return self._rpc("LrSchedulerStep", pb.LrSchedulerStepRequest(adapter=adapter),
                         pb.LrSchedulerStepResponse, R.LrResult.from_proto, timeout,
                         request_id)

    def to_device(self, device, model=True, optimizer=True, grad=True, timeout=None,
                  request_id=None, adapter=""):
        """device: "cpu"/"host" (offload) or "cuda"/"device". Returns the
        Placement after the move."""
        return self._rpc("ToDevice", pb.ToDeviceRequest(
            device=device, model=model, optimizer=optimizer, grad=grad, adapter=adapter),
            pb.ToDeviceResponse, _placement, timeout, request_id)

    def save_checkpoint(self, path, global_step=0, max_to_keep=0, contents=None,
                        timeout=None, request_id=None, progress=None, adapter=""):
        """path: relative to the daemon's checkpoint root. contents: any of
        "model", "optimizer", "extra" (empty: all). progress: as
        initialize's, in tensor bytes written, phase the file. adapter: a
        LoRA adapter's checkpoint (a PEFT directory with its optimizer and
        state). Returns a SaveResult (path as saved, bytes)."""
        return self._rpc("SaveCheckpoint", pb.SaveCheckpointRequest(
            path=path, global_step=global_step, max_to_keep=max_to_keep,
            contents=list(contents or []), adapter=adapter), pb.SaveCheckpointResponse,
            R.SaveResult.from_proto, timeout, request_id, progress)

    def load_checkpoint(self, path, contents=None, timeout=None, request_id=None,
                        progress=None, adapter=""):
        """progress: as initialize's, in tensor bytes read. adapter: into
        that LoRA adapter. Returns the checkpoint's global step: a
        LoadResult (an int)."""
        return self._rpc("LoadCheckpoint", pb.LoadCheckpointRequest(
            path=path, contents=list(contents or []), adapter=adapter),
            pb.LoadCheckpointResponse, R.LoadResult.from_proto, timeout, request_id,
            progress)

    def share_weights(self, dtype="float32", names=None, as_torch=False, timeout=None,
                      adapter="", adapter_view="adapter"):
        """The weights through shared memory, for a process on the daemon's
        host (README "Same-host weights"; the daemon needs [server]
        share_socket): ShareWeights, then the share picked up over its
        unix socket and mapped. Returns a SharedWeights: a mapping name ->
        read-only numpy view (bfloat16 as ml_dtypes.bfloat16, uint16 bits
        without ml_dtypes, as stream_weights), in the order asked (names:
        a subset, each once; None: all); .close() or `with` unmaps it.
        as_torch: torch tensors over the same memory; treat them as
        read-only views (an in-place op writes a private copy of the pages
        it touches, the share itself is sealed). The memory is the daemon's
        snapshot at the call: later steps do not change it. The pick-up
        blocks on the local socket (well under a millisecond), also in
        AsyncEngineClient. adapter / adapter_view: a LoRA adapter's
        tensors, as stream_weights'."""
        if as_torch:
            import torch  # noqa: F401  (fail before a share is made for nothing)
        req = share_request(dtype, names, 1, adapter, adapter_view)
        return self._rpc("ShareWeights", req, pb.ShareWeightsResponse,
                         lambda rep: open_share(R.ShareTicket.from_proto(rep), as_torch),
                         timeout)

    def request_share(self, dtype="float32", names=None, uses=1, timeout=None, adapter="",
                      adapter_view="adapter"):
        """ShareWeights alone: a ShareTicket (picklable) that
        engined_client.open_share(ticket) turns into SharedWeights in any
        process of this host, up to `uses` times (e.g. one per rollout
        worker: one copy of the weights in memory for all) until
        ticket.expires_in_s have passed."""
        return self._rpc("ShareWeights", share_request(dtype, names, uses, adapter,
                                                       adapter_view),
                         pb.ShareWeightsResponse, R.ShareTicket.from_proto, timeout)

    def gather_weights(self, dtype="float32", names=None, share=False, timeout=None,
                       adapter="", adapter_view="adapter"):
        """This daemon's part in another rank's export when the group
        shards its parameters (dist_zero_stage 3: each tensor is gathered
        from every rank's slice, so every rank makes the call at once): the
        exporting rank's stream_weights (share=False) or share_weights
        (share=True) request with gather_only. Nothing is sent or shared
        from here; returns None once every tensor was gathered.
        EngineGroup.stream_weights and share_weights send it to every rank
        but rank 0."""
        if share:
            return self._rpc("ShareWeights", share_request(dtype, names, 1, adapter,
                                                           adapter_view, True),
                             pb.ShareWeightsResponse, _none, timeout)
        return self._rpc_stream("GetPerTensorParam",
                                param_request(dtype, names, 0, adapter, adapter_view, True),
                                pb.ParamBucket, _none, timeout)

    def get_status(self, timeout=None, adapter=""):
        """Returns a Status (every GetStatusResponse field; .adapters: the
        live adapters' names). adapter: step, lr, placement, mode and the
        rest of the engine's own fields are that adapter's."""
        return self._rpc("GetStatus", pb.GetStatusRequest(adapter=adapter),
                         pb.GetStatusResponse, R.Status.from_proto, timeout)

    def create_adapter(self, name, rank=None, alpha=None, target_modules=None, seed=0,
                       peft_dir=None, use_rslora=False, optimizer=None, lr_scheduler=None,
                       timeout=None, request_id=None):
        """A LoRA adapter over the frozen base (initialize(...,
        frozen_base=True)), used by passing adapter=name to the other
        methods. Without peft_dir, PEFT LoraConfig's defaults: rank 8,
        alpha 8, target_modules ("q_proj", "v_proj"); target_modules are
        PEFT module names (q_proj ... down_proj), module paths ending in
        one, or "all-linear". peft_dir: a PEFT adapter directory under the
        daemon's model root to start from (rank, alpha, target_modules
        then default to the file's; given ones must match it).
        use_rslora: scale alpha / sqrt(rank). optimizer / lr_scheduler:
        the adapter's own (dicts of the proto fields; None: the base
        engine's). Returns a CreateAdapterResult."""
        if isinstance(target_modules, str):
            target_modules = [target_modules]
        if rank is None:
            rank = 0 if peft_dir else ADAPTER_DEFAULT_RANK
        if target_modules is None:
            target_modules = () if peft_dir else ADAPTER_DEFAULT_TARGETS
        req = pb.CreateAdapterRequest(name=name, rank=rank, target_modules=list(target_modules),
                                      seed=seed, peft_dir=peft_dir or "",
                                      use_rslora=use_rslora)
        if alpha is not None:
            req.alpha = alpha
        if optimizer is not None:
            req.optimizer.CopyFrom(pb.OptimizerConfig(**optimizer))
        if lr_scheduler is not None:
            req.lr_scheduler.CopyFrom(pb.LrSchedulerConfig(**lr_scheduler))
        return self._rpc("CreateAdapter", req, pb.CreateAdapterResponse,
                         R.CreateAdapterResult.from_proto, timeout, request_id)

    def delete_adapter(self, name, timeout=None, request_id=None):
        """Delete the adapter and free its state. Returns None."""
        return self._rpc("DeleteAdapter", pb.DeleteAdapterRequest(name=name),
                         pb.DeleteAdapterResponse, _none, timeout, request_id)

    def sample(self, input_ids, seq_lens, *, max_tokens, num_samples=1, temperature=None,
               top_k=0, top_p=None, seed=0, stop_token_ids=(), stop_sequences=(),
               top_logprobs=0, prompt_logprobs=False, adapter="",
               max_tokens_per_micro_batch=0, timeout=None):
        """Completions of packed prompts (the Sample stream, read to its
        end), from the weights as of the call's start; changes no training
        state. input_ids: int32 [N], the prompts packed; seq_lens: each
        prompt's length, sum N. max_tokens: new tokens per completion;
        num_samples: completions per prompt. temperature: None (1), 0
        (greedy) or > 0; top_k: 0 (off) or the k most likely tokens; top_p:
        None (off) or in (0, 1]. seed: with the prompt's and the sample's
        index, the only source of a completion's randomness.
        stop_token_ids: tokens that end a completion; stop_sequences: lists
        of tokens that end it (both kept in the completion).
        top_logprobs: 0..20 best log-probs per new token; prompt_logprobs:
        the prompts' own (on sample 0). adapter: the LoRA adapter sampled
        ("": the base). max_tokens_per_micro_batch: prompt tokens per
        prefill chunk (0: the engine's budget). timeout: the whole
        stream's. docs/SAMPLING.md defines each. Returns a SampleResult
        (completions sorted by (prompt_index, sample_index),
        weights_version)."""
        req = _sample_request_of(locals())
        return self._rpc_stream("Sample", req, pb.SampleResponse, R.SampleResult.from_replies,
                                timeout)

    def sample_iter(self, input_ids, seq_lens, *, max_tokens, num_samples=1,
                    temperature=None, top_k=0, top_p=None, seed=0, stop_token_ids=(),
                    stop_sequences=(), top_logprobs=0, prompt_logprobs=False, adapter="",
                    max_tokens_per_micro_batch=0, timeout=None):
        """sample's completions one by one as the stream delivers them
        (each as soon as it is done, in any order): a generator of
        Completion (an async generator in AsyncEngineClient; the request is
        built here, the call starts at the first item). To stop early,
        close it (`gen.close()`, `with contextlib.closing(gen)`; `await
        gen.aclose()`, `async with contextlib.aclosing(gen)`): that cancels
        the call at once, as does cancelling the task that awaits an item.
        Arguments as sample's."""
        req = _sample_request_of(locals())
        return self._stream_items("Sample", req, pb.SampleResponse, R.Completion.of_reply,
                                  timeout)

    def create_group(self, world_size, device="", timeout=None):
        """On rank 0's daemon: a new data-parallel group of world_size
        ranks (docs/DISTRIBUTED.md). Returns a CreateGroupResult; pass its
        group_id to every rank's initialize(dist={"rank": r, "world_size":
        world_size, "group_id": id}). Not state-changing: a retry makes a
        new id, and an unused id costs nothing."""
        req = pb.CreateGroupRequest(device=device, world_size=world_size)
        return self._rpc("CreateGroup", req,
                         pb.CreateGroupResponse, R.CreateGroupResult.from_proto, timeout)

    def health(self, service="", timeout=None):
        """grpc.health.v1.Health/Check: "SERVING" or "NOT_SERVING"."""
        return self._rpc_raw("/grpc.health.v1.Health/Check", _health_request(service),
                             timeout, _health)

    def call_raw(self, method, data, timeout=None):
        """Any method path with raw request bytes; returns raw reply bytes."""
        return self._rpc_raw(method, data, timeout, _raw)

    def _timeout(self, timeout):
        return timeout if timeout is not None else self.timeout
