"""engine.py — EnginedEngine: verl's BaseEngine served by engined daemons.

Each BaseEngine method is one RPC (docs/DESIGN.md's table) on the daemons
this verl process drives (config.EnginedEngineConfig.addresses):
  - alone (no torch.distributed world, or a world of one): every address,
    as one EngineGroup (engined's own data parallelism: the batch split
    over the daemons, gradients reduced during the training call's
    backward pass, reduce_gradients); verl sees one
    data-parallel rank;
  - in a torch.distributed world of W: rank r drives addresses[r], the
    daemons form a group (rank 0's CreateGroup, its id broadcast over
    torch.distributed), and verl's data-parallel rank / size / group are
    torch.distributed's, as with FSDP.
forward_backward_batch sends verl's own losses to the daemon's loss library
(losses.py) and any other callable through the custom-gradient path: a
forward-only call for the outputs, verl's loss with torch autograd here,
and its gradients back as the "custom" loss. layout.py holds the
alignment between verl's batches and engined's packed arrays.

Routing replay of a mixture of experts (the engine config's
router_replay.mode, verl's RouterReplayConfig): "R2" records the routing
in a forward-only call whose batch has none (model_output["routed_experts"],
[bsz, j, layers, k] nested, as verl's Megatron engine returns it) and
replays a batch's routed_experts in every call; "R3" replays the
routed_experts the rollout returned (a sequence's last row, which rollouts
do not record, routed as the router chooses it: layout.routes). A batch
flagged enable_routing_replay False (verl's reference passes) routes
freely.

LoRA (verl's model config lora_rank > 0, or lora_adapter_path): the
daemon holds the model as a frozen base and one adapter, ADAPTER, over it
(lora.py: verl's LoRA keys as CreateAdapter's fields, the weight views);
every call names the adapter but those inside disable_adapter(), which
score with the base alone (verl's reference log-probs).

Errors: a daemon's refusal raises EngineError (a grpc.RpcError: code() and
details() name the field) in the one-daemon-per-rank mode, and GroupError
(.errors / .codes() per rank) when this process drives an EngineGroup;
what engined does not serve raises NotImplementedError, a batch it cannot
take ValueError.
"""
import logging
import os
import re
import shutil

import grpc
import torch

import verl.utils.tensordict_utils as tu
from verl.utils.metric import Metric
from verl.workers.engine.base import BaseEngine

from .._rpc import EngineError
from ..client import EngineClient
from ..group import EngineGroup, GroupError
from . import layout
from .config import daemon_path
from .losses import server_loss, verl_metrics
from .lora import ADAPTER, LoraSpec

_STEP_DIR = re.compile(r"global_step_\d+$")
_log = logging.getLogger(__name__)
# A share that cannot reach this process: the daemon has no share socket,
# runs on another host (its socket path is not here), or its socket's
# group leaves this user out. weight_transport "auto" then streams.
_NO_SHARE = {grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNAVAILABLE,
             grpc.StatusCode.PERMISSION_DENIED}


def _codes(e):
    return set(e.codes().values()) if isinstance(e, GroupError) else {e.code()}


def _shared_tensors(w):
    """(name, torch view) of a share in its order, then the share closed
    (views handed out stay valid: SharedWeights.close)."""
    try:
        yield from w.items()
    finally:
        w.close()


def _dist_world():
    d = torch.distributed
    if d.is_available() and d.is_initialized() and d.get_world_size() > 1:
        return d.get_rank(), d.get_world_size()
    return 0, 1


class EnginedEngine(BaseEngine):
    """verl's BaseEngine over engined. Subclasses set model_type."""

    model_type = None

    def __init__(self, model_config, engine_config, optimizer_config, checkpoint_config):
        super().__init__()
        self.model_config = model_config
        self.engine_config = engine_config
        self.optimizer_config = optimizer_config
        self.checkpoint_config = checkpoint_config
        self.mode = None
        self.rank, self.world = _dist_world()
        addresses = engine_config.address_list()
        kw = engine_config.client_kwargs()
        if self.world > 1:
            if len(addresses) != self.world:
                raise ValueError(f"addresses: {len(addresses)} daemons for a torch.distributed "
                                 f"world of {self.world} (one daemon per rank)")
            self.daemon = EngineClient(addresses[self.rank], **kw)
        else:
            self.daemon = EngineGroup(addresses, **kw)
        self._initialized = False
        self._saved_paths = []
        self._share_works = None        # weight_transport "auto": not tried yet
        self.lora = LoraSpec.of(model_config, engine_config)   # None: no LoRA
        self._adapter_off = False       # inside disable_adapter()

    @property
    def adapter(self):
        """The adapter every call names ("": the base model)."""
        return ADAPTER if self.lora is not None and not self._adapter_off else ""

    # --- placement and modes ------------------------------------------------

    @property
    def is_param_offload_enabled(self):
        return bool(self.engine_config.param_offload)

    @property
    def is_optimizer_offload_enabled(self):
        return bool(self.engine_config.optimizer_offload)

    def is_mp_src_rank_with_outputs(self):
        return True

    def get_data_parallel_rank(self):
        return self.rank

    def get_data_parallel_size(self):
        return self.world

    def get_data_parallel_group(self):
        d = torch.distributed
        return d.group.WORLD if d.is_available() and d.is_initialized() else None

    def train_mode(self, **kwargs):
        return _ModeCtx(self, "train", **kwargs)

    def eval_mode(self, **kwargs):
        return _ModeCtx(self, "eval", **kwargs)

    def to(self, device, model=True, optimizer=True, grad=True):
        """With LoRA the base's weights move with model, the adapter's
        whole state with the flags."""
        super().to(device=device, model=model, optimizer=optimizer, grad=grad)
        where = "cpu" if device == "cpu" else "device"
        if self.lora is not None and model:
            self.daemon.to_device(where, model=True, optimizer=False, grad=False)
        self.daemon.to_device(where, model=model, optimizer=optimizer, grad=grad,
                              adapter=ADAPTER if self.lora is not None else "")

    def disable_adapter(self):
        """verl's reference-model context: calls inside it run the base
        alone (forward-only: the base is frozen, training it is refused)."""
        return _AdapterOff(self)

    # --- building -------------------------------------------------------------

    def initialize(self):
        """Initialize (replace=True when called again: verl's reset())."""
        ec, oc = self.engine_config, self.optimizer_config
        kw = dict(model_type=self.model_type, device=ec.device, seed=int(ec.seed),
                  bf16_matmul=ec.dtype == "bfloat16", replace=bool(ec.replace) or self._initialized,
                  offload={"param_offload": bool(ec.param_offload),
                           "optimizer_offload": bool(ec.optimizer_offload)})
        if ec.use_dynamic_bsz and ec.max_token_len_per_gpu:
            kw["max_tokens_per_micro_batch"] = int(ec.max_token_len_per_gpu)
        if ec.model_path:
            kw["model_path"] = ec.model_path
        elif ec.preset:
            kw["preset"] = ec.preset
        else:
            kw["hf_config_json"] = self.model_config.hf_config.to_json_string()
        if oc is not None:
            kw["optimizer"], kw["lr_scheduler"] = optimizer_settings(oc)
        if self.lora is not None:
            kw["frozen_base"] = True
        if self.world > 1:
            self._initialize_rank(kw)
        else:
            self.daemon.initialize(dist_timeout_s=ec.collective_timeout_s,
                                   dist_zero_stage=ec.zero_stage, **kw)
        if self.lora is not None:
            # The adapter's optimizer and schedule are the base engine's
            # (Initialize's, above).
            self.lora.created(self.daemon.create_adapter(ADAPTER, **self.lora.create_kwargs(
                int(ec.seed))))
        self._initialized = True
        if self.is_param_offload_enabled or self.is_optimizer_offload_enabled:
            self.to("cpu", model=self.is_param_offload_enabled,
                    optimizer=self.is_optimizer_offload_enabled,
                    grad=self.is_param_offload_enabled)

    def _initialize_rank(self, kw):
        """One daemon per torch.distributed rank: rank 0 makes the group id,
        every rank joins with it."""
        box = [None]
        if self.rank == 0:
            box[0] = self.daemon.create_group(self.world, device=kw["device"]).group_id
        torch.distributed.broadcast_object_list(box, src=0)
        dist = {"rank": self.rank, "world_size": self.world, "group_id": box[0]}
        if self.engine_config.collective_timeout_s is not None:
            dist["timeout_s"] = float(self.engine_config.collective_timeout_s)
        if self.engine_config.zero_stage is not None:
            dist["zero_stage"] = int(self.engine_config.zero_stage)
        self.daemon.initialize(dist=dist, **kw)

    # --- optimizer ------------------------------------------------------------

    def optimizer_zero_grad(self):
        self.daemon.zero_grad(adapter=self.adapter)

    def optimizer_step(self):
        """Clip, AdamW, zero the gradients; returns the grad norm before
        clipping. A non-finite norm skips the update and drops the
        gradients (verl's rule); the norm is returned as it is."""
        return float(self.daemon.optimizer_step(adapter=self.adapter).grad_norm)

    def lr_scheduler_step(self):
        return float(self.daemon.lr_scheduler_step(adapter=self.adapter))

    # --- compute --------------------------------------------------------------

    def forward_backward_batch(self, data, loss_function, forward_only=False):
        """verl's NO_PADDING TensorDict batch; returns {"model_output",
        "loss", "metrics"} as verl's engines do (one entry per call: the
        daemon does its own micro-batching, with the whole batch's
        normalizers, so the call's loss is what verl's micro-batch losses
        add up to). A training call reduces the gradients across a
        data-parallel group during its backward pass (reduce_gradients:
        every rank makes the call, as verl's SPMD workers do; a second call
        before the step adds and reduces again, which stays exact)."""
        _check_served(data)
        packed = layout.pack(data)
        num_tokens = data["loss_mask"].sum().to(torch.float64) if "loss_mask" in data.keys() \
            else torch.tensor(float(packed.num_tokens), dtype=torch.float64)
        if self.world > 1:
            torch.distributed.all_reduce(num_tokens)
        tu.assign_non_tensor(data, batch_num_tokens=int(num_tokens.item()),
                             dp_size=self.get_data_parallel_size())
        temperature = _temperature(data)
        entropy = bool(tu.get_non_tensor_data(data, "calculate_entropy", False))
        common = dict(temperature=temperature, adapter=self.adapter)
        common.update(self._replay(data, packed, forward_only or loss_function is None))
        if forward_only or loss_function is None:
            return self._forward_only(data, packed, loss_function, entropy, common)
        spec = server_loss(loss_function, data, packed, calculate_entropy=entropy,
                           dp_size=self.world if self.world > 1 else None)
        if spec is None:
            return self._custom(data, packed, loss_function, entropy, common)
        name, options, per_token = spec
        outs = self._outputs(entropy)
        r = self.daemon.forward_backward(packed.input_ids, packed.seq_lens, loss=name,
                                         loss_options=options, reduce_gradients=True,
                                         **outs, **common, **per_token)
        metrics = verl_metrics(name, options, r.metrics, r.values, packed,
                               data.get("response_mask", None))
        return _result(self._model_output(packed, r), [float(r.loss)], metrics)

    def _replay(self, data, packed, forward_only):
        """The calls' routing replay arguments (router_replay.mode)."""
        mode = self.engine_config.router_replay.mode
        if mode == "disabled" or not tu.get_non_tensor_data(data, "enable_routing_replay", True):
            return {}
        if "routed_experts" in data.keys():
            return {"routed_experts": packed.routes(data["routed_experts"])}
        if mode == "R2" and forward_only:
            return {"return_routed_experts": True}
        raise ValueError(f"router_replay.mode {mode}: the batch has no routed_experts "
                         "(R3: the rollout's; R2: the forward-only pass's)")

    def _outputs(self, entropy):
        if self.model_type == "value_model":
            return {"return_values": True}
        return {"return_log_probs": True, "return_entropy": entropy}

    def _forward_only(self, data, packed, loss_function, entropy, common):
        ec = self.engine_config
        if ec.use_dynamic_bsz and ec.infer_max_token_len_per_gpu:
            # verl's own budget for forward-only (log-prob) passes.
            common = dict(common, max_tokens_per_micro_batch=int(ec.infer_max_token_len_per_gpu))
        r = self.daemon.forward_backward(packed.input_ids, packed.seq_lens, forward_only=True,
                                         **self._outputs(entropy), **common)
        model_output = self._model_output(packed, r)
        if r.routed_experts is not None:   # R2's record
            model_output["routed_experts"] = packed.nested(torch.from_numpy(r.routed_experts))
        losses, metrics = [], {}
        if loss_function is not None:
            with torch.no_grad():
                loss, metrics = loss_function(model_output=model_output, data=data,
                                              dp_group=self.get_data_parallel_group())
            losses = [float(loss)]
        return _result(model_output, losses, metrics)

    def _custom(self, data, packed, loss_function, entropy, common):
        """Any loss of the model's outputs: forward-only here, verl's loss
        and its gradients with autograd, the gradients back as "custom"."""
        r = self.daemon.forward_backward(packed.input_ids, packed.seq_lens, forward_only=True,
                                         **self._outputs(entropy), **common)
        leaves = {k: torch.from_numpy(packed.shift_to_verl(v)).requires_grad_()
                  for k, v in _arrays(r).items()}
        model_output = {k: packed.nested(t) for k, t in leaves.items()}
        loss, metrics = loss_function(model_output=model_output, data=data,
                                      dp_group=self.get_data_parallel_group())
        loss.backward()
        grads = {"grad_" + k: packed.grad_from_verl(t.grad.numpy())
                 for k, t in leaves.items() if t.grad is not None}
        if not grads:
            raise ValueError("the loss does not depend on the model's outputs")
        self.daemon.forward_backward(packed.input_ids, packed.seq_lens, loss="custom",
                                     reduce_gradients=True, **common, **grads)
        return _result({k: packed.nested(t.detach()) for k, t in leaves.items()},
                       [float(loss.detach())], metrics)

    def _model_output(self, packed, r):
        return {k: packed.nested(torch.from_numpy(packed.shift_to_verl(v)))
                for k, v in _arrays(r).items()}

    # --- weights ----------------------------------------------------------------

    def get_per_tensor_param(self, layered_summon=False, base_sync_done=False, **kwargs):
        """(generator of (name, torch tensor), peft_config): the tensors
        from the daemon (rank 0 of a group), in weight_dtype, by
        weight_transport: "share" maps them from shared memory (views of
        the daemon's sealed file, released when the generator ends and no
        tensor is held); "stream" streams them lazily (closing the
        generator cancels the stream); "auto" shares when the daemon can
        share with this process and streams otherwise, deciding at the
        first call (a later failure of a share that worked is raised).
        Without LoRA: the full model in HF names, peft_config None. With
        LoRA, as verl's FSDP engine: lora.merge on, the merged weights in
        HF names and None; base_sync_done, the adapter alone in PEFT's
        names and its peft.LoraConfig; else the base under verl's
        base_layer names and the LoraConfig. layered_summon needs
        base_sync_done (verl's rule) and changes nothing else here."""
        if self.lora is None:
            return self._weights(), None
        if layered_summon and not base_sync_done:
            raise ValueError("layered_summon needs base_sync_done: the base model must be "
                             "loaded in the rollout first (verl's rule)")
        view = self.lora.view(base_sync_done)
        gen = self._weights(adapter=ADAPTER, adapter_view=view)
        return self.lora.renamed(gen, view), self.lora.peft_config(view)

    def _weights(self, **which):
        dtype, how = self.engine_config.weight_dtype, self.engine_config.weight_transport
        if how == "share" or (how == "auto" and self._share_works is not False):
            try:
                w = self.daemon.share_weights(dtype=dtype, as_torch=True, **which)
            except (EngineError, GroupError) as e:
                if how == "share" or self._share_works or not _codes(e) <= _NO_SHARE:
                    raise
                self._share_works = False
                _log.warning("engined: weights go through the stream: no share (%s)", e)
            else:
                self._share_works = True
                return _shared_tensors(w)
        return self.daemon.stream_weights(dtype=dtype, as_torch=True, **which)

    def get_per_tensor_param_shard(self, **kwargs):
        raise NotImplementedError(
            "engined exports whole tensors only: with zero_stage 1 and 2 every rank holds "
            "them, with 3 each is gathered from the ranks as it streams; use "
            "get_per_tensor_param")

    def get_per_tensor_param_delta_shard(self, **kwargs):
        self.get_per_tensor_param_shard()

    def prime_delta_snapshots(self):
        self.get_per_tensor_param_shard()

    # --- checkpoints ------------------------------------------------------------

    def _daemon_path(self, local_path):
        return daemon_path(local_path, self.engine_config.checkpoint_local_root,
                           "checkpoint path", "checkpoint_local_root")

    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0,
                        max_ckpt_to_keep=None, **kwargs):
        """The daemon writes the model (HF), optimizer, scheduler, RNG and
        step at local_path (relative to checkpoint_local_root); with LoRA
        the adapter's (a PEFT directory, its optimizer and state beside
        it) and not the frozen base, which never changes: what verl's
        checkpoint.save_lora_only asks, whatever it says. Rotation as
        verl's: the newest max_ckpt_to_keep of this engine's saves are
        kept. A path ending in global_step_N is rotated by the daemon among
        its siblings; a role directory (global_step_N/actor) by removing
        the older ones' directories here, under checkpoint_local_root."""
        if hdfs_path is not None:
            raise NotImplementedError("hdfs_path: the daemon writes to its own disk; copy "
                                      "checkpoints to HDFS with your own tooling")
        rel = self._daemon_path(local_path)
        keep = int(max_ckpt_to_keep or 0)
        by_daemon = bool(_STEP_DIR.search(rel.rstrip("/")))
        self.daemon.save_checkpoint(rel, global_step=int(global_step),
                                    max_to_keep=keep if by_daemon else 0,
                                    adapter=ADAPTER if self.lora is not None else "")
        if by_daemon or keep <= 0 or self.rank != 0:
            return
        self._saved_paths = [p for p in self._saved_paths if p != rel] + [rel]
        root = self.engine_config.checkpoint_local_root
        while len(self._saved_paths) > keep:
            old = self._saved_paths.pop(0)
            if root is not None:
                shutil.rmtree(os.path.join(root, old), ignore_errors=True)

    def load_checkpoint(self, local_path, hdfs_path=None, del_local_after_load=True, **kwargs):
        """The daemon loads local_path (relative to checkpoint_local_root);
        the daemon's files are the checkpoint and are never deleted
        (del_local_after_load is verl's copy-from-HDFS flag)."""
        if hdfs_path is not None:
            raise NotImplementedError("hdfs_path: the daemon reads from its own disk")
        return int(self.daemon.load_checkpoint(self._daemon_path(local_path),
                                               adapter=ADAPTER if self.lora is not None else ""))


class EnginedEngineWithLMHead(EnginedEngine):
    model_type = "language_model"


class EnginedEngineWithValueHead(EnginedEngine):
    model_type = "value_model"


class _ModeCtx:
    """verl's BaseEngineCtx as SetMode: entering loads what the mode needs
    (unless disable_auto_offload), leaving goes IDLE (offloads what the
    offload flags say; leaving TRAIN zeroes the gradients)."""

    def __init__(self, engine, mode, **kwargs):
        self.engine, self.mode = engine, mode
        self.disable_auto_offload = kwargs.pop("disable_auto_offload", False)
        if not kwargs.pop("zero_grad_on_exit", True) and mode == "train":
            raise NotImplementedError("zero_grad_on_exit=False: engined zeroes the gradients "
                                      "whenever it leaves TRAIN")

    def __enter__(self):
        self.engine.mode = self.mode
        self._set(self.mode)
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            self._set("idle")
        finally:
            self.engine.mode = None
        return False

    def _set(self, mode):
        """The base's mode, and with LoRA the adapter's too."""
        d, off = self.engine.daemon, self.disable_auto_offload
        d.set_mode(mode, disable_auto_offload=off)
        if self.engine.lora is not None:
            d.set_mode(mode, disable_auto_offload=off, adapter=ADAPTER)


class _AdapterOff:
    """EnginedEngine.disable_adapter()'s context (re-entrant)."""

    def __init__(self, engine):
        self.engine = engine

    def __enter__(self):
        self.was, self.engine._adapter_off = self.engine._adapter_off, True
        return self

    def __exit__(self, *exc):
        self.engine._adapter_off = self.was
        return False


# Outputs verl's FSDP engine can add to model_output that engined does not
# compute (the flags verl sets on a batch to ask for them).
_NOT_SERVED = {
    "calculate_sum_pi_squared": "the sum of squared probabilities (sum_pi_squared)",
    "distillation_use_topk": "top-k distillation outputs",
}


def _check_served(data):
    for key, what in _NOT_SERVED.items():
        if tu.get_non_tensor_data(data, key, False):
            raise NotImplementedError(f"{key}: engined does not compute {what}")
    from verl.utils.dataset.dataset_utils import DatasetPadMode
    mode = tu.get_non_tensor_data(data, "pad_mode", DatasetPadMode.NO_PADDING)
    if mode != DatasetPadMode.NO_PADDING:
        raise NotImplementedError(f"pad_mode {mode}: like verl's own engines, engined takes "
                                  "NO_PADDING batches (left_right_2_no_padding)")


def _result(model_output, losses, metrics):
    """What verl's engines return from forward_backward_batch."""
    return {"model_output": model_output, "loss": losses,
            "metrics": {k: v if isinstance(v, Metric) else [v] for k, v in metrics.items()}}


def _arrays(r):
    return {k: r[k] for k in ("log_probs", "entropy", "values") if r[k] is not None}


def _temperature(data):
    t = tu.get_non_tensor_data(data, "temperature", 1.0)
    if isinstance(t, torch.Tensor):
        vals = torch.unique(t.to(torch.float64))
        if vals.numel() != 1:
            raise ValueError("temperature: per-sample temperatures differ; engined takes one "
                             "temperature per call (split the batch by temperature)")
        t = vals.item()
    return float(t)


def optimizer_settings(oc):
    """verl's optimizer config as Initialize's optimizer and lr_scheduler
    (AdamW; verl's FSDP schedule: warmup steps, else ratio * total)."""
    name = str(getattr(oc, "optimizer", "AdamW")).lower()
    if name not in ("adamw", "_adamw"):
        raise ValueError(f"optimizer: {oc.optimizer!r}: engined's optimizer is AdamW")
    if not getattr(oc, "zero_indexed_step", True):
        raise ValueError("zero_indexed_step=False: engined's schedules count steps from 0")
    beta1, beta2 = (float(b) for b in oc.betas)
    opt = {"lr": float(oc.lr), "beta1": beta1, "beta2": beta2,
           "weight_decay": float(oc.weight_decay), "clip_grad": float(oc.clip_grad)}
    total = int(oc.total_training_steps)
    warmup = oc.lr_warmup_steps if oc.lr_warmup_steps is not None else -1
    if warmup <= 0:
        warmup = int(oc.lr_warmup_steps_ratio * total)
    kind = getattr(oc, "lr_scheduler_type", "constant")
    if kind not in ("constant", "cosine"):
        raise ValueError(f"lr_scheduler_type: {kind!r}: verl's FSDP schedules are "
                         "'constant' and 'cosine'")
    sched = {"type": kind, "warmup_steps": max(warmup, 0), "total_steps": max(total, 0)}
    if getattr(oc, "min_lr_ratio", None) is not None:
        sched["min_lr_ratio"] = float(oc.min_lr_ratio)
    if getattr(oc, "num_cycles", None) is not None:
        sched["num_cycles"] = float(oc.num_cycles)
    return opt, sched
