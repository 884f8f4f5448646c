"""group.py — N daemons (one per GPU, engined@N) as one data-parallel engine.

EngineGroup(addresses) holds one EngineClient per rank (rank r is
addresses[r]) and has the methods of EngineClient. initialize() makes the
group (CreateGroup on rank 0, then every rank's Initialize at once, since
each returns only when all ranks joined). forward_backward() splits the
packed batch over the ranks, sets the loss options that normalize each
rank's loss by the whole batch, runs the ranks in parallel and merges their
outputs; optimizer_step() and the other calls run on every rank in parallel
and check that the ranks agree. AsyncEngineGroup is the same over
AsyncEngineClient (coroutines, asyncio.gather).

The split (split_sequences): contiguous runs of whole sequences, in order,
one run per rank, that minimize the largest rank's token count (the linear
partition problem, solved exactly: a binary search on the bound with a
greedy fill). Contiguous runs keep each rank's batch in the caller's order,
so merging is concatenation in rank order and restores the order exactly;
whole sequences because attention and the loss's per-sequence terms never
cross sequences. Balancing by tokens (seq_lens) is balancing the compute.
A batch with fewer sequences than ranks is refused (ValueError): every rank
must take part in every step (OptimizerStep reduces over all ranks).

Loss normalization (verl's convention, engines/loss/loss.h): each rank's
loss gets dp_size = N and the whole batch's normalizers, so each rank's
gradient is N times its share of the whole batch's gradient and the mean
over ranks (what OptimizerStep reduces) is the whole batch's gradient:
  global_num_tokens  the batch's loss tokens as the loss library counts
                     them (loss_mask != 0; without a mask every token but
                     each sequence's first),
  global_batch_size  the sequences with at least one loss token,
  loss_scale_factor  the longest sequence (seq-mean-token-sum-norm's H),
  dp_size            N,
each unless the caller gave it. The custom loss takes its gradients as
given, so the group multiplies grad_log_probs / grad_entropy / grad_values
by N instead.

Errors: a call that fails on any rank raises GroupError after every rank's
call returned (no rank is left running unobserved); .errors maps each
failed rank to its EngineError. Results that must agree over ranks (steps,
grad norms, modes) are checked; a disagreement raises GroupMismatchError.
Every state-changing call sends one request id to every rank (request_id=
or a fresh one; GroupError.request_id), so calling again with that id after
a partial failure runs the call on the ranks that failed and replays it on
the others (each daemon answers a repeated id with its first outcome).
"""
import asyncio
import concurrent.futures
import inspect
import math

import numpy as np

from ._api import _PER_TOKEN
from ._rpc import EngineError, new_request_id
from .aio import AsyncEngineClient, as_coroutines
from .client import EngineClient
from .results import ForwardBackwardResult

# Metrics (engines/loss/loss.h, loss_metric_is_mean): counts add over
# ranks; means over loss tokens combine weighted by each rank's loss tokens
# (its num_tokens); every other metric is a share of the dp_size-scaled
# objective: summed over ranks and divided by dp_size.
COUNT_METRICS = frozenset({"num_tokens", "num_sequences"})
MEAN_METRICS = frozenset({"pg_clipfrac", "pg_clipfrac_lower", "ppo_kl", "vf_clipfrac"})
_GRADS = ("grad_log_probs", "grad_entropy", "grad_values")
_OUTPUTS = ("log_probs", "entropy", "values")


class GroupError(Exception):
    """A call failed on one or more ranks. errors: {rank: EngineError} of
    every rank that failed; results: {rank: result} of the others; method:
    the RPC; addresses: every rank's address; request_id: the id every rank
    got (None for reads), to call again with after a partial failure."""

    def __init__(self, method, errors, addresses, results=None, request_id=None,
                 message=None):
        self.method = method
        self.errors = dict(errors)
        self.results = dict(results or {})
        self.addresses = list(addresses)
        self.request_id = request_id
        if message is None:
            message = "%s failed on %d of %d ranks: %s" % (
                method, len(self.errors), len(self.addresses), "; ".join(
                    "rank %d (%s): %s: %s" % (
                        r, self.addresses[r], e.code().name if e.code() else "?",
                        e.details()) for r, e in sorted(self.errors.items())))
        super().__init__(message)

    def codes(self):
        """{rank: grpc.StatusCode} of the failed ranks."""
        return {r: e.code() for r, e in self.errors.items()}


class GroupMismatchError(GroupError):
    """Every rank answered but the answers disagree where they must agree.
    field: what differs; values: {rank: value}; results: every rank's result."""

    def __init__(self, method, field, values, addresses, results, request_id=None):
        self.field = field
        self.values = dict(values)
        super().__init__(method, {}, addresses, results, request_id, message=(
            "%s: ranks disagree on %s: %s" % (method, field, ", ".join(
                "rank %d (%s): %r" % (r, addresses[r], v) for r, v in sorted(values.items())))))


# --- the split --------------------------------------------------------------

def split_sequences(seq_lens, world_size):
    """The split of a packed batch over world_size ranks: a list of
    (first, stop) sequence index ranges, one per rank, contiguous, in
    order, each non-empty, covering every sequence, that minimize the
    largest rank's tokens (ties: each rank takes as many sequences as the
    bound allows, so earlier ranks are the fuller ones). ValueError when
    there are fewer sequences than ranks."""
    lens = [int(s) for s in seq_lens]
    n, k = len(lens), int(world_size)
    if k < 1:
        raise ValueError("world_size: %d, must be >= 1" % k)
    if n < k:
        raise ValueError("a batch of %d sequences cannot be split over %d ranks: every "
                         "rank needs at least one sequence" % (n, k))
    if any(s < 1 for s in lens):
        raise ValueError("seq_lens: every length must be >= 1")

    def fill(bound):
        """Greedy ranges under bound, leaving a sequence for each later
        rank; None when the sequences do not fit in k ranks."""
        out, i = [], 0
        for r in range(k):
            first, tokens = i, 0
            last_ok = n - (k - r - 1)  # stop at most here: later ranks need one each
            while i < last_ok and tokens + lens[i] <= bound:
                tokens += lens[i]
                i += 1
            if i == first:
                return None
            out.append((first, i))
        return out if i == n else None

    lo, hi = max(max(lens), -(-sum(lens) // k)), sum(lens)
    while lo < hi:  # the least bound that fits
        mid = (lo + hi) // 2
        if fill(mid) is None:
            lo = mid + 1
        else:
            hi = mid
    return fill(lo)


def _loss_counts(seq_lens, loss_mask):
    """(loss tokens, sequences with a loss token, longest sequence) as the
    loss library counts them (engines/loss/loss_engine.c)."""
    lens = np.asarray([int(s) for s in seq_lens], dtype=np.int64)
    if lens.size == 0:
        return 0, 0, 0
    if loss_mask is None:
        cnt = lens - 1
    else:
        m = np.asarray(loss_mask, dtype=np.float32).reshape(-1) != 0
        if m.size != int(lens.sum()):
            raise ValueError("loss_mask: %d elements, expected %d (one per token)"
                             % (m.size, int(lens.sum())))
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
        cnt = np.add.reduceat(m.astype(np.int64), starts)
    return int(cnt.sum()), int(np.count_nonzero(cnt)), int(lens.max())


def global_loss_options(seq_lens, world_size, loss_mask=None):
    """The loss options that normalize each rank's loss by the whole batch
    (seq_lens and loss_mask of the whole batch): global_num_tokens,
    global_batch_size, loss_scale_factor, dp_size = world_size. Empty when
    the batch has no loss token (every term is then 0; the library would
    refuse dp_size > 1 without a normalizer)."""
    tokens, seqs, horizon = _loss_counts(seq_lens, loss_mask)
    if world_size <= 1 or tokens == 0:
        return {}
    return {"global_num_tokens": tokens, "global_batch_size": seqs,
            "loss_scale_factor": float(horizon), "dp_size": int(world_size)}


def _loss_name_options(loss, loss_options):
    opts = dict(loss_options or {})
    if isinstance(loss, dict):
        loss = dict(loss)
        name = loss.pop("name")
        opts.update(loss)
        return name, opts
    return loss, opts


class GroupForwardBackwardResult(ForwardBackwardResult):
    """A ForwardBackwardResult of the whole batch (loss, metrics, the
    per-token outputs in the caller's order; num_micro_batches: the sum over
    ranks) with ranks: each rank's own result and seq_ranges: the (first,
    stop) sequences each rank ran. Compares and maps as ForwardBackwardResult."""

    def __init__(self, loss, metrics, num_micro_batches, log_probs=None, entropy=None,
                 values=None, ranks=(), seq_ranges=(), routed_experts=None):
        super().__init__(loss, metrics, num_micro_batches, log_probs, entropy, values,
                         routed_experts=routed_experts)
        object.__setattr__(self, "ranks", tuple(ranks))
        object.__setattr__(self, "seq_ranges", tuple(seq_ranges))


class ForwardBackwardPlan:
    """One ForwardBackward of the whole batch as world_size calls.

    requests[r]: the keyword arguments of rank r's forward_backward
    (input_ids, seq_lens, loss, loss_options, target_ids, routed_experts
    and the per-token arrays of its sequences); the call's other arguments (forward_only,
    return_*, temperature, ...) are the same on every rank. merge(results)
    combines the ranks' ForwardBackwardResults into the whole batch's.
    seq_ranges / token_ranges: what each rank takes; dp_size: the loss's."""

    def __init__(self, world_size, input_ids, seq_lens, loss=None, loss_options=None,
                 target_ids=None, routed_experts=None, **per_token):
        unknown = set(per_token) - set(_PER_TOKEN)
        if unknown:
            raise TypeError("unknown per-token arrays: %s" % ", ".join(sorted(unknown)))
        ids = np.asarray(input_ids, dtype=np.int32).reshape(-1)
        lens = [int(s) for s in seq_lens]
        if sum(lens) != ids.size:
            raise ValueError("seq_lens: sum %d != %d input_ids" % (sum(lens), ids.size))
        arrays = {k: np.asarray(v, dtype=np.float32).reshape(-1)
                  for k, v in per_token.items() if v is not None}
        if target_ids is not None:
            arrays["target_ids"] = np.asarray(target_ids, dtype=np.int32).reshape(-1)
        for k, v in arrays.items():
            if v.size != ids.size:
                raise ValueError("%s: %d elements, expected %d (one per token)"
                                 % (k, v.size, ids.size))
        if routed_experts is not None:   # [N, layers, k]: split by tokens too
            arrays["routed_experts"] = np.asarray(routed_experts)
            if arrays["routed_experts"].shape[:1] != (ids.size,):
                raise ValueError("routed_experts: shape %s, expected [%d, layers, "
                                 "experts_per_tok]" % (arrays["routed_experts"].shape,
                                                       ids.size))
        self.world_size = int(world_size)
        self.seq_ranges = split_sequences(lens, world_size)
        offs = np.concatenate([[0], np.cumsum(lens, dtype=np.int64)])
        self.token_ranges = [(int(offs[a]), int(offs[b])) for a, b in self.seq_ranges]
        self.num_tokens = int(ids.size)

        name, opts = _loss_name_options(loss, loss_options)
        self.dp_size = 1
        scale = 1.0
        if name == "custom":
            scale = float(self.world_size)  # its gradients are taken as given
            self.dp_size = self.world_size
        elif name is not None:
            for k, v in global_loss_options(lens, self.world_size,
                                            arrays.get("loss_mask")).items():
                opts.setdefault(k, v)
            self.dp_size = int(float(opts.get("dp_size", 1)))
        self.requests = []
        for (a, b), (t0, t1) in zip(self.seq_ranges, self.token_ranges):
            req = {"input_ids": ids[t0:t1], "seq_lens": lens[a:b]}
            if name is not None:
                req["loss"] = name
                req["loss_options"] = dict(opts)
            for k, v in arrays.items():
                v = v[t0:t1]
                req[k] = v * np.float32(scale) if k in _GRADS and scale != 1.0 else v
            self.requests.append(req)

    def merge(self, results):
        """The whole batch's GroupForwardBackwardResult from the ranks'
        results (in rank order): per-token outputs concatenated in rank
        order (the caller's order); loss and the objective's metrics summed
        and divided by dp_size (with the default options: exactly the
        whole batch's, the mean over ranks of the dp_size-scaled losses);
        num_tokens / num_sequences summed; the means over loss tokens
        (pg_clipfrac, ppo_kl, ...) weighted by each rank's num_tokens."""
        results = list(results)
        if len(results) != self.world_size:
            raise ValueError("%d results for %d ranks" % (len(results), self.world_size))
        outs = {}
        for k in _OUTPUTS + ("routed_experts",):
            got = [getattr(res, k) for res in results]
            if all(g is None for g in got):
                outs[k] = None
                continue
            for r, (g, (t0, t1)) in enumerate(zip(got, self.token_ranges)):
                if g is None or len(g) != t1 - t0:   # routed_experts: [tokens, ...]
                    raise ValueError("rank %d: %s of %s elements, expected %d" % (
                        r, k, None if g is None else len(g), t1 - t0))
            outs[k] = np.concatenate(got)
        dp = float(self.dp_size)
        weights = [float(res.metrics.get("num_tokens", 0.0)) for res in results]
        metrics = {}
        names = []
        for res in results:
            names += [m for m in res.metrics if m not in names]
        for m in names:
            have = [(res.metrics[m], w) for res, w in zip(results, weights) if m in res.metrics]
            if m in COUNT_METRICS:
                metrics[m] = float(sum(v for v, _ in have))
            elif m in MEAN_METRICS:
                wsum = sum(w for _, w in have)
                metrics[m] = float(sum(v * w for v, w in have) / wsum) if wsum > 0 else 0.0
            else:
                metrics[m] = float(sum(v for v, _ in have) / dp)
        loss = float(sum(res.loss for res in results) / dp)
        return GroupForwardBackwardResult(
            loss, metrics, sum(res.num_micro_batches for res in results), ranks=results,
            seq_ranges=self.seq_ranges, **outs)


# --- agreement checks ----------------------------------------------------------

def _same_float(a, b, rel=1e-6):
    a, b = float(a), float(b)
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b or math.isclose(a, b, rel_tol=rel, abs_tol=0.0)


def _agree(fields, floats=()):
    """A finisher: check that every rank's result has the same value of
    each of fields (floats: equal to a relative 1e-6), return rank 0's."""
    def check(group, method, results, request_id):
        for f in fields:
            vals = {r: (res if f is None else getattr(res, f)) for r, res in enumerate(results)}
            same = _same_float if f in floats else (lambda a, b: a == b)
            if not all(same(vals[0], v) for v in vals.values()):
                raise GroupMismatchError(method, f or "result", vals, group.addresses,
                                         dict(enumerate(results)), request_id)
        return results[0]
    return check


def _as_list(group, method, results, request_id):
    return list(results)


def _first(group, method, results, request_id):
    return results[0]


class _GroupBase:
    """Both groups' methods, written once over the executor primitives each
    group defines: _run (every rank at once), _then (a continuation: a
    value in EngineGroup, a coroutine in AsyncEngineGroup) and _rank0 (one
    call on rank 0). So each method returns its result in EngineGroup and
    a coroutine in AsyncEngineGroup (which wraps them in `async def`)."""

    _client_class = None

    def __init__(self, addresses, **client_kwargs):
        if isinstance(addresses, str):
            raise TypeError("addresses: a list of daemon addresses, one per rank")
        self.addresses = list(addresses)
        if not self.addresses:
            raise ValueError("addresses: at least one daemon")
        self.world_size = len(self.addresses)
        self.clients = [self._client_class(a, **client_kwargs) for a in self.addresses]
        self.group_id = None
        self.backend = None
        self.zero_stage = 1   # initialize's dist_zero_stage

    def _check_init(self, init_kwargs):
        if "dist" in init_kwargs:
            raise TypeError("initialize: dist is EngineGroup's (one rank per address)")

    def _dist(self, rank, dist_timeout_s, dist_bucket_bytes, dist_zero_stage):
        d = {"rank": rank, "world_size": self.world_size, "group_id": self.group_id}
        if dist_zero_stage is not None:
            d["zero_stage"] = int(dist_zero_stage)
        if dist_timeout_s is not None:
            d["timeout_s"] = float(dist_timeout_s)
        if dist_bucket_bytes:
            d["bucket_bytes"] = int(dist_bucket_bytes)
        return d

    def _raise_failed(self, method, outcomes, request_id):
        """outcomes: per rank (True, result) or (False, exception)."""
        errors = {r: x for r, (ok, x) in enumerate(outcomes) if not ok}
        if not errors:
            return [x for _, x in outcomes]
        for x in errors.values():  # not an RPC failure: a bug or an interrupt
            if not isinstance(x, EngineError):
                raise x
        raise GroupError(method, errors, self.addresses,
                         {r: x for r, (ok, x) in enumerate(outcomes) if ok}, request_id)


    # The public calls, in GROUP_METHODS' order.

    def initialize(self, *, dist_timeout_s=None, dist_bucket_bytes=None, dist_zero_stage=None,
                   request_id=None, **init_kwargs):
        """Initialize every rank (init_kwargs: EngineClient.initialize's,
        the same on every rank; dist is the group's). world_size > 1:
        CreateGroup on rank 0, then all ranks' Initialize at once with
        dist {rank, world_size, group_id, timeout_s = dist_timeout_s,
        bucket_bytes = dist_bucket_bytes (the gradient bucket of a
        forward_backward with reduce_gradients; None: 25 MiB), zero_stage =
        dist_zero_stage (1, 2 or 3: what the ranks shard; None: 1)}.
        Returns rank 0's InitializeResult (the ranks must agree)."""
        self._check_init(init_kwargs)
        self.zero_stage = dist_zero_stage or 1
        rid = request_id or new_request_id()
        if self.world_size == 1:
            return self._run("Initialize", lambda c, r: c.initialize(
                request_id=rid, **init_kwargs), _INIT_AGREE, rid)

        def formed(g):
            self.group_id, self.backend = g.group_id, g.backend
            return self._run("Initialize", lambda c, r: c.initialize(
                dist=self._dist(r, dist_timeout_s, dist_bucket_bytes, dist_zero_stage),
                request_id=rid,
                **init_kwargs), _INIT_AGREE, rid)
        return self._then(self._rank0("CreateGroup", lambda c: c.create_group(
            self.world_size, device=init_kwargs.get("device", ""),
            timeout=init_kwargs.get("timeout"))), formed)

    def forward_backward(self, input_ids, seq_lens, *, loss=None, loss_options=None,
                         request_id=None, **kwargs):
        """EngineClient.forward_backward's arguments for the whole batch.
        world_size 1: that call. Else the batch is split over the ranks
        (ForwardBackwardPlan: whole sequences, balanced by tokens, every
        per-token array alike, the whole batch's loss normalizers), the ranks
        run at once and their results are merged: a GroupForwardBackwardResult
        whose outputs are in the caller's order. ValueError for a batch of
        fewer sequences than ranks. reduce_gradients=True (the last call
        before optimizer_step) reduces the gradients across the ranks
        during the call's backward pass instead of in the step."""
        rid = request_id or new_request_id()
        if self.world_size == 1:
            return self._run("ForwardBackward", lambda c, r: c.forward_backward(
                input_ids, seq_lens, loss=loss, loss_options=loss_options, request_id=rid,
                **kwargs), _first, rid)
        per_token = {k: kwargs.pop(k) for k in list(kwargs)
                     if k in _PER_TOKEN or k in ("target_ids", "routed_experts")}
        plan = ForwardBackwardPlan(self.world_size, input_ids, seq_lens, loss=loss,
                                   loss_options=loss_options, **per_token)
        return self._then(self._run("ForwardBackward", lambda c, r: c.forward_backward(
            request_id=rid, **plan.requests[r], **kwargs), _as_list, rid), plan.merge)

    def optimizer_step(self, request_id=None, **params):
        """OptimizerStep on every rank (params as EngineClient's). Returns
        rank 0's StepResult; step, skipped, grad_norm and lr must agree."""
        rid = request_id or new_request_id()
        return self._run("OptimizerStep", lambda c, r: c.optimizer_step(
            request_id=rid, **params), _STEP_AGREE, rid)

    def zero_grad(self, timeout=None, request_id=None, adapter=""):
        rid = request_id or new_request_id()
        return self._then(self._run("ZeroGrad", lambda c, r: c.zero_grad(
            timeout=timeout, request_id=rid, adapter=adapter), _as_list, rid), _none)

    def lr_scheduler_step(self, timeout=None, request_id=None, adapter=""):
        """Returns the new lr (an LrResult); the ranks must agree."""
        rid = request_id or new_request_id()
        return self._run("LrSchedulerStep", lambda c, r: c.lr_scheduler_step(
            timeout=timeout, request_id=rid, adapter=adapter), _LR_AGREE, rid)

    def set_mode(self, mode, disable_auto_offload=False, timeout=None, request_id=None,
                 adapter=""):
        """Returns rank 0's SetModeResult; mode and placement must agree."""
        rid = request_id or new_request_id()
        return self._run("SetMode", lambda c, r: c.set_mode(
            mode, disable_auto_offload, timeout=timeout, request_id=rid, adapter=adapter),
            _MODE_AGREE, rid)

    def to_device(self, device, model=True, optimizer=True, grad=True, timeout=None,
                  request_id=None, adapter=""):
        """Returns the Placement (the ranks must agree)."""
        rid = request_id or new_request_id()
        return self._run("ToDevice", lambda c, r: c.to_device(
            device, model, optimizer, grad, timeout=timeout, request_id=rid, adapter=adapter),
            _PLACEMENT_AGREE, rid)

    def save_checkpoint(self, path, global_step=0, max_to_keep=0, contents=None,
                        timeout=None, request_id=None, adapter=""):
        """Every rank saves, each daemon under its own checkpoint root:
        where the ranks share one root, each writes its optimizer shard
        there; elsewhere rank 0 writes them (docs/DISTRIBUTED.md).
        Returns the SaveResults, one per rank (bytes each rank wrote)."""
        rid = request_id or new_request_id()
        return self._run("SaveCheckpoint", lambda c, r: c.save_checkpoint(
            path, global_step, max_to_keep, contents, timeout=timeout, request_id=rid,
            adapter=adapter), _as_list, rid)

    def load_checkpoint(self, path, contents=None, timeout=None, request_id=None,
                        adapter=""):
        """Every rank loads; returns the global step (the ranks must agree)."""
        rid = request_id or new_request_id()
        return self._run("LoadCheckpoint", lambda c, r: c.load_checkpoint(
            path, contents, timeout=timeout, request_id=rid, adapter=adapter), _LOAD_AGREE,
            rid)

    def get_status(self, timeout=None, adapter=""):
        """A list of Status, one per rank (rank order)."""
        return self._run("GetStatus", lambda c, r: c.get_status(timeout=timeout,
                                                                adapter=adapter))

    def create_adapter(self, name, request_id=None, **kwargs):
        """EngineClient.create_adapter on every rank (the same arguments);
        returns rank 0's CreateAdapterResult. The methods that take
        adapter= pass it to every rank."""
        rid = request_id or new_request_id()
        return self._run("CreateAdapter", lambda c, r: c.create_adapter(
            name, request_id=rid, **kwargs), _first, rid)

    def delete_adapter(self, name, timeout=None, request_id=None):
        rid = request_id or new_request_id()
        return self._then(self._run("DeleteAdapter", lambda c, r: c.delete_adapter(
            name, timeout=timeout, request_id=rid), _as_list, rid), _none)

    def health(self, service="", timeout=None):
        """A list of health answers ("SERVING", ...), one per rank."""
        return self._run("Health", lambda c, r: c.health(service, timeout=timeout))

    def share_weights(self, dtype="float32", names=None, as_torch=False, timeout=None,
                      adapter="", adapter_view="adapter"):
        """EngineClient.share_weights of rank 0 (whose daemon must run on
        this host); a failure raises GroupError naming rank 0. With
        dist_zero_stage 3 each tensor is gathered from every rank: the other
        ranks take part at once (gather_weights) and share nothing, and a
        failure on any rank raises GroupError naming it."""
        kw = dict(dtype=dtype, names=names, timeout=timeout, adapter=adapter,
                  adapter_view=adapter_view)
        if self.zero_stage != 3 or self.world_size == 1:
            return self._rank0("ShareWeights", lambda c: c.share_weights(as_torch=as_torch,
                                                                         **kw))
        return self._run("ShareWeights", lambda c, r: c.share_weights(as_torch=as_torch, **kw)
                         if r == 0 else c.gather_weights(share=True, **kw), _first)

    def _gathering(self, kw):
        """Whether an export of rank 0's needs the other ranks' gathers,
        and the keywords of their gather_weights."""
        return self.zero_stage == 3 and self.world_size > 1, dict(
            dtype=kw["dtype"], names=kw["names"], timeout=kw["timeout"],
            adapter=kw["adapter"], adapter_view=kw["adapter_view"])


GROUP_METHODS = ("initialize", "forward_backward", "optimizer_step", "zero_grad",
                 "lr_scheduler_step", "set_mode", "to_device", "save_checkpoint",
                 "load_checkpoint", "get_status", "health", "share_weights",
                 "create_adapter", "delete_adapter")


def _none(_results):
    return None

_INIT_AGREE = _agree(("num_parameters", "num_tensors"))
_STEP_AGREE = _agree(("step", "skipped", "grad_norm", "lr"), floats=("grad_norm", "lr"))
_LR_AGREE = _agree((None,), floats=(None,))
_MODE_AGREE = _agree(("mode", "placement"))
_PLACEMENT_AGREE = _agree((None,))
_LOAD_AGREE = _agree((None,))


class EngineGroup(_GroupBase):
    """world_size = len(addresses) daemons as one data-parallel engine;
    rank r is addresses[r]. client_kwargs (timeout, token, TLS, retries,
    ...) go to each rank's EngineClient (clients[r]). A group of one
    address is that daemon alone (initialize without dist, forward_backward
    unsplit). Errors raise GroupError (GroupMismatchError when ranks
    disagree); see the module's docstring."""

    _client_class = EngineClient

    def __init__(self, addresses, **client_kwargs):
        super().__init__(addresses, **client_kwargs)
        self._pool = None

    def close(self):
        for c in self.clients:
            c.close()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _run(self, method, call, finish=_as_list, request_id=None):
        """call(client, rank) on every rank at once; after all returned,
        finish(self, method, results, request_id) or GroupError."""
        def one(r):
            try:
                return True, call(self.clients[r], r)
            except Exception as e:  # noqa: BLE001 (sorted out after all returned)
                return False, e
        if self.world_size == 1:
            outcomes = [one(0)]
        else:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    self.world_size, thread_name_prefix="engined-group")
            outcomes = list(self._pool.map(one, range(self.world_size)))
        return finish(self, method, self._raise_failed(method, outcomes, request_id),
                      request_id)

    @staticmethod
    def _then(value, fn):
        return fn(value)

    def _rank0(self, method, call):
        try:
            return call(self.clients[0])
        except EngineError as e:
            raise GroupError(method, {0: e}, self.addresses) from None

    def stream_weights(self, dtype="float32", names=None, bucket_bytes=0, timeout=None,
                       as_torch=False, adapter="", adapter_view="adapter"):
        """EngineClient.stream_weights of rank 0 (every rank holds the full
        parameters); a failure raises GroupError naming rank 0. With
        dist_zero_stage 3 each tensor is gathered from every rank, so the
        other ranks take part at once (gather_weights, on threads beside
        rank 0's stream; they send nothing), and rank 0's stream is read to
        its end even when the caller stops early (a rank left behind would
        hold the others in a gather until the group's timeout)."""
        kw = dict(dtype=dtype, names=names, bucket_bytes=bucket_bytes, timeout=timeout,
                  adapter=adapter, adapter_view=adapter_view)
        others = []
        gathering, gkw = self._gathering(kw)
        if gathering:
            pool = concurrent.futures.ThreadPoolExecutor(
                self.world_size - 1, thread_name_prefix="engined-gather")
            others = [pool.submit(c.gather_weights, **gkw) for c in self.clients[1:]]
            pool.shutdown(wait=False)
        stream = self.clients[0].stream_weights(as_torch=as_torch, **kw)
        errors = {}
        try:
            for item in stream:   # not `yield from`: closing this must not close it
                yield item
        except EngineError as e:
            errors[0] = e
        finally:
            if others:
                try:
                    for _ in stream:   # the caller stopped early: finish rank 0's
                        pass
                except EngineError as e:
                    errors.setdefault(0, e)
            for r, f in enumerate(others, 1):
                try:
                    f.result()
                except EngineError as e:
                    errors[r] = e
        if errors:
            raise GroupError("GetPerTensorParam", errors, self.addresses) from None


class AsyncEngineGroup(_GroupBase):
    """EngineGroup over AsyncEngineClient: the same methods as coroutines
    (asyncio.gather; every rank's call is awaited before an error is
    raised), stream_weights an async generator. Make it inside the event
    loop that uses it; close with `await g.close()` or `async with`."""

    _client_class = AsyncEngineClient

    async def close(self):
        for c in self.clients:
            await c.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    async def _run(self, method, call, finish=_as_list, request_id=None):
        async def one(r):
            try:
                return True, await call(self.clients[r], r)
            except Exception as e:  # noqa: BLE001
                return False, e
        outcomes = await asyncio.gather(*(one(r) for r in range(self.world_size)))
        return finish(self, method, self._raise_failed(method, outcomes, request_id),
                      request_id)

    @staticmethod
    async def _then(awaitable, fn):
        out = fn(await awaitable)
        return await out if inspect.isawaitable(out) else out

    async def _rank0(self, method, call):
        try:
            return await call(self.clients[0])
        except EngineError as e:
            raise GroupError(method, {0: e}, self.addresses) from None

    async def stream_weights(self, dtype="float32", names=None, bucket_bytes=0,
                             timeout=None, as_torch=False, adapter="", adapter_view="adapter"):
        """EngineGroup.stream_weights as an async generator (the other
        ranks' gather_weights as tasks beside rank 0's stream)."""
        kw = dict(dtype=dtype, names=names, bucket_bytes=bucket_bytes, timeout=timeout,
                  adapter=adapter, adapter_view=adapter_view)
        gathering, gkw = self._gathering(kw)
        others = [asyncio.ensure_future(c.gather_weights(**gkw))
                  for c in self.clients[1:]] if gathering else []
        stream = self.clients[0].stream_weights(as_torch=as_torch, **kw)
        errors = {}
        try:
            async for item in stream:
                yield item
        except EngineError as e:
            errors[0] = e
        finally:
            if others:
                try:
                    async for _ in stream:   # the caller stopped early: finish rank 0's
                        pass
                except EngineError as e:
                    errors.setdefault(0, e)
                for r, t in enumerate(others, 1):
                    try:
                        await t
                    except EngineError as e:
                        errors[r] = e
        if errors:
            raise GroupError("GetPerTensorParam", errors, self.addresses) from None


as_coroutines(AsyncEngineGroup, _GroupBase, GROUP_METHODS)
