"""gateway.py — what the Tinker endpoints do, over engined (the HTTP side is
app.py): sessions, training models (a LoRA adapter, or a full fine-tune on
an engine of its own), their requests in seq_id order with engined request
ids, checkpoints named by tinker:// paths, and samplers.

Exactly-once: a training request runs as engined request id
"tk:<model_id>:<seq_id>" (ids are per adapter in engined), so a request the
gateway re-sends after a broken connection to the daemon is applied once;
the same (model_id, seq_id) re-POSTed by the SDK gets the same future
(sequence.py).

Samplers: a sampler of a training model's saved weights samples that model
while it still holds exactly those weights (its engine's weights_version
and the gateway's count of loads both unchanged, checked on every reply);
once the model has moved on, a LoRA snapshot is loaded into an adapter of
its own from the saved checkpoint, and a full fine-tune's snapshot (one
set of full weights per engine) is refused with a precise error."""
import asyncio
import hashlib
import json
import logging
import re
import secrets
import time

import numpy as np

from . import losses, wire
from .checkpoints import Checkpoints, iso, safe
from .futures import Failed
from .sequence import Sequencer
from .wire import UserError

log = logging.getLogger("engined_tinker")
NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
SNAPSHOTS_PER_MODEL = 2
# Completions per sample request: engined's own bound (engine.h
# ENGINE_SAMPLE_MAX_SAMPLES), checked here before the future's reply lists
# one sequence id per completion.
MAX_SAMPLES = 65536


class Model:
    def __init__(self, model_id, session_id, engine, lora, gap_wait_s):
        self.model_id = model_id
        self.session_id = session_id
        self.engine = engine
        self.lora = lora                  # None (full) or {"rank", "alpha", "targets", ...}
        self.adapter = ("tk-" + safe(model_id))[:64] if lora else ""
        self.seq = Sequencer(model_id, gap_wait_s)
        self.version = 0                  # engined's weights_version of the live weights
        self.generation = 0               # loads so far (a load can repeat a version)
        self.snapshots = []               # snapshot adapters, oldest first
        self.created = time.time()
        self.last_request = time.time()
        self.user_metadata = None

    def request_id(self, seq_id):
        return "tk:%s:%d" % (self.model_id, seq_id)


class Sampler:
    def __init__(self, sampler_id, engine, adapter, model=None, version=None, generation=None,
                 checkpoint=None, model_path=None):
        self.sampler_id = sampler_id
        self.engine = engine
        self.adapter = adapter            # what is sampled while it holds the weights
        self.model = model                # the training model it samples (None: base)
        self.version = version
        self.generation = generation
        self.checkpoint = checkpoint      # a snapshot's checkpoint record, to reload it
        self.model_path = model_path
        self.requests = {}                # seq_id -> (key, record)
        self.lock = asyncio.Lock()


class Gateway:
    def __init__(self, engines, futures, *, model_name, tokenizer_id, arch, eos_token_ids,
                 max_context_length, lora_alpha, checkpoint_root, gap_wait_s,
                 seed=None, tokenizer=None, session_timeout_s=300.0):
        self.engines = engines
        self.futures = futures
        self.model_name = model_name
        self.tokenizer_id = tokenizer_id
        self.arch = arch
        self.eos_token_ids = list(eos_token_ids)
        self.max_context_length = max_context_length
        self.lora_alpha = lora_alpha
        self.gap_wait_s = gap_wait_s
        self.seed = seed
        self.session_timeout_s = session_timeout_s
        self.tokenizer = tokenizer        # a tokenizers.Tokenizer, or None
        self.sessions = {}                # id -> {"created", "last_seen", ...}
        self.models = {}
        self.samplers = {}
        self.checkpoints = Checkpoints(checkpoint_root)
        self.creating = {}                # model_id -> record of its create future
        self._snap = 0

    # --- sessions ------------------------------------------------------
    def create_session(self, body):
        sid = "s" + secrets.token_hex(8)
        self.sessions[sid] = {"created": time.time(), "last_seen": time.time(),
                              "tags": body.get("tags") or [],
                              "user_metadata": body.get("user_metadata") or {}}
        return sid

    def session(self, sid):
        s = self.sessions.get(sid)
        if s is None:
            raise LookupError("session %r is unknown to this gateway" % (sid,))
        s["last_seen"] = time.time()
        return s

    def model(self, model_id):
        m = self.models.get(model_id)
        if m is None:
            raise LookupError("model_id %r is unknown to this gateway (created in another "
                              "gateway process, or unloaded)" % (model_id,))
        m.last_request = time.time()
        if m.session_id in self.sessions:  # a request is a sign of life too
            self.sessions[m.session_id]["last_seen"] = m.last_request
        return m

    # --- models ----------------------------------------------------------
    def _check_base(self, base_model):
        if base_model not in (None, self.model_name):
            raise UserError("base_model %r is not served here (this gateway serves %r)"
                            % (base_model, self.model_name))

    def _lora_of(self, cfg, model_seq_id):
        rank = wire.number(cfg or {}, "rank", 0, "lora_config", integer=True)
        if rank < 0:
            raise UserError("lora_config.rank: %d (0 for full fine-tuning, or > 0)" % rank)
        if rank == 0:
            return None
        cfg = cfg or {}
        targets = (ATTN if cfg.get("train_attn", True) else ()) + \
                  (MLP if cfg.get("train_mlp", True) else ())
        if not targets:
            raise UserError("lora_config: train_attn and train_mlp both false leave nothing "
                            "to train (engined's LoRA does not reach the unembedding)")
        seed = wire.number(cfg, "seed", None, "lora_config", integer=True)
        return {"rank": rank, "alpha": self.lora_alpha, "targets": list(targets),
                "seed": seed if seed is not None else self._seed("lora:%d" % model_seq_id),
                "train_unembed": bool(cfg.get("train_unembed", True)),
                "train_mlp": bool(cfg.get("train_mlp", True)),
                "train_attn": bool(cfg.get("train_attn", True))}

    async def _new_model(self, model_id, session_id, lora):
        engine = await self.engines.claim("lora" if lora else "full", model_id)
        m = Model(model_id, session_id, engine, lora, self.gap_wait_s)
        try:
            if lora:
                await engine.client.create_adapter(
                    m.adapter, rank=lora["rank"], alpha=lora["alpha"],
                    target_modules=lora["targets"], seed=lora["seed"] % (1 << 63),
                    request_id="tk:create:" + model_id)
        except BaseException:
            self.engines.release(engine, model_id)
            raise
        self.models[model_id] = m
        return m

    def _create(self, body, kind, prepare):
        """create_model and create-from-checkpoint: check the session, the
        ids and the base model, then (once per model id: a retry gets the
        same future) run the coroutine prepare(model_id, session_id,
        model_seq_id) returns (it raises UserError for a bad request)."""
        sid = body.get("session_id")
        self.session(sid)
        seq = body.get("model_seq_id")
        if not isinstance(seq, int) or seq < 0:
            raise UserError("model_seq_id: %r (an integer from 0)" % (seq,))
        self._check_base(body.get("base_model"))
        model_id = "%s:train:%d" % (sid, seq)
        if model_id in self.creating:
            return self.creating[model_id]
        coro = prepare(model_id, sid, seq)
        rec = self.futures.new(kind)
        self.creating[model_id] = rec
        self.futures.run(rec, coro)
        return rec

    def create_model(self, body):
        def prepare(model_id, sid, seq):
            lora = self._lora_of(body.get("lora_config"), seq)

            async def run():
                m = await self._new_model(model_id, sid, lora)
                m.user_metadata = body.get("user_metadata")
                return {"model_id": model_id, "type": "create_model"}, "application/json"
            return run()
        return self._create(body, "CreateModel", prepare)

    def get_info(self, body):
        m = self.model(body.get("model_id"))
        return {"model_id": m.model_id, "type": "get_info",
                "model_data": {"arch": self.arch, "model_name": self.model_name,
                               "tokenizer_id": self.tokenizer_id},
                "is_lora": m.lora is not None,
                "lora_rank": m.lora["rank"] if m.lora else None,
                "model_name": self.model_name, "optimizer_config": {"type": "adamw"}}

    async def unload(self, model_id):
        m = self.models.pop(model_id, None)
        if m is None:
            return
        m.seq.close()
        for s in [s for s in self.samplers.values() if s.model is m]:
            s.model = None
        if m.lora:
            for name in [m.adapter] + m.snapshots:
                try:
                    await m.engine.client.delete_adapter(name)
                except Exception as e:  # already gone: nothing to free
                    log.warning("unload %s: DeleteAdapter(%s): %s", model_id, name, e)
            m.engine.snapshots -= len(m.snapshots)
        self.engines.release(m.engine, model_id)

    # --- training requests ------------------------------------------------
    def _submit(self, m, seq_id, key, kind, fn):
        """Queue fn() (a coroutine returning (result, media type)) as
        seq_id of m; the record of its future (a retry's: the first's)."""
        def make():
            rec = self.futures.new(kind)

            async def start():
                await self.futures.run(rec, fn())
            return rec, start
        return m.seq.submit(seq_id, key, make)

    def forward_backward(self, fb):
        m = self.model(fb.model_id)
        kind = "Forward" if fb.forward_only else "ForwardBackward"
        with m.seq.refusing(fb.seq_id):
            kwargs, lens = losses.pack(fb)

        async def run():
            r = await m.engine.client.forward_backward(
                adapter=m.adapter, request_id=m.request_id(fb.seq_id), **kwargs)
            lps, metrics = losses.outputs(r, lens)
            return wire.forward_backward_output(lps, metrics), "application/x-protobuf"
        return self._submit(m, fb.seq_id, fb.key(), kind, run)

    def optim_step(self, body):
        m = self.model(body.get("model_id"))
        seq_id = body.get("seq_id")
        with m.seq.refusing(seq_id):
            p = body.get("adam_params")
            if p is None:
                raise UserError("optim_step: adam_params missing (only AdamW is served)")
            params = {}
            for src, dst, default in (("learning_rate", "lr", 1e-4), ("beta1", "beta1", 0.9),
                                      ("beta2", "beta2", 0.95), ("eps", "eps", 1e-12),
                                      ("weight_decay", "weight_decay", 0.0),
                                      ("grad_clip_norm", "clip_grad", 0.0)):
                v = p.get(src, default)
                if not isinstance(v, (int, float)) or not np.isfinite(v):
                    raise UserError("adam_params.%s: %r is not a finite number" % (src, v))
                params[dst] = float(v)

        async def run():
            r = await m.engine.client.optimizer_step(
                adapter=m.adapter, request_id=m.request_id(seq_id), **params)
            m.version = r.step
            return {"metrics": {"grad_norm:mean": float(r.grad_norm),
                                "learning_rate:mean": float(r.lr)},
                    "type": "optim_step"}, "application/json"
        return self._submit(m, seq_id, json.dumps(body, sort_keys=True), "OptimStep", run)

    @staticmethod
    def _name(name):
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise UserError("path %r: a checkpoint name is 1 to 128 of [A-Za-z0-9._-]" % (name,))
        return name

    async def _save(self, m, seq_id, kind, name, contents, ttl_s=None, overwrite=True):
        path = "tinker://%s/%s/%s" % (m.model_id, kind, name)
        if path in self.checkpoints.by_path and not overwrite:
            raise Failed("%s exists (overwrite is false)" % path, "user")
        r = await m.engine.client.save_checkpoint(
            Checkpoints.rel(m.model_id, kind, name), global_step=m.version, contents=contents,
            adapter=m.adapter, request_id=m.request_id(seq_id))
        return self.checkpoints.add(m, kind, name, int(getattr(r, "bytes", 0) or 0),
                                    contents is None, ttl_s)

    def save_weights(self, body):
        m = self.model(body.get("model_id"))
        seq_id = body.get("seq_id")
        with m.seq.refusing(seq_id):
            name = self._name(body.get("path"))
            ttl = Checkpoints.check_ttl(body.get("ttl_seconds"))

        async def run():
            c = await self._save(m, seq_id, "weights", name, None, ttl,
                                 overwrite=bool(body.get("overwrite", False)))
            return {"path": c["path"], "type": "save_weights"}, "application/json"
        return self._submit(m, seq_id, json.dumps(body, sort_keys=True), "SaveWeights", run)

    def save_weights_for_sampler(self, body):
        m = self.model(body.get("model_id"))
        seq_id = body.get("seq_id")
        name = body.get("path")
        sss = body.get("sampling_session_seq_id")
        with m.seq.refusing(seq_id):
            if name is not None:
                name = self._name(name)
            elif not isinstance(sss, int):
                raise UserError("save_weights_for_sampler: neither path nor "
                                "sampling_session_seq_id")
            ttl = Checkpoints.check_ttl(body.get("ttl_seconds"))

        async def run():
            c = await self._save(m, seq_id, "sampler_weights",
                                 name or "unnamed-%d" % seq_id, ["model"], ttl)
            if name is not None:
                return ({"path": c["path"], "type": "save_weights_for_sampler"},
                        "application/json")
            sid = "%s:sample:%d" % (m.session_id, sss)
            self.samplers[sid] = Sampler(sid, m.engine, m.adapter, m, c["version"],
                                         c["generation"], c, c["path"])
            return ({"sampling_session_id": sid, "type": "save_weights_for_sampler"},
                    "application/json")
        return self._submit(m, seq_id, json.dumps(body, sort_keys=True),
                            "SaveWeightsForSampler", run)

    def save_weights_external(self, body):
        m = self.model(body.get("model_id"))
        seq_id = body.get("seq_id")
        with m.seq.refusing(seq_id):
            name = self._name(body.get("path"))
            ttl = Checkpoints.check_ttl(body.get("ttl_seconds"))
            if body.get("age_encryption_recipients"):
                raise UserError("age_encryption_recipients: encrypted exports are not supported")

        async def run():
            c = await self._save(m, seq_id, "external_weights", name, ["model"], ttl)
            return ({"path": c["path"], "size_bytes": c["size_bytes"],
                     "type": "save_weights_external"}, "application/json")
        return self._submit(m, seq_id, json.dumps(body, sort_keys=True),
                            "SaveWeightsExternal", run)

    def _checkpoint(self, path):
        return self.checkpoints.get(path)

    def weights_info(self, path):
        c = self._checkpoint(path)
        lora = c["lora"]
        out = {"base_model": self.model_name, "is_lora": lora is not None,
               "optimizer_config": {"type": "adamw"}}
        if lora:
            out.update(lora_rank=lora["rank"], train_unembed=lora["train_unembed"],
                       train_mlp=lora["train_mlp"], train_attn=lora["train_attn"])
        return out

    def load_weights(self, body):
        path = body.get("path")
        optimizer = bool(body.get("optimizer", False))
        if body.get("model_id") is None:
            return self._create_from_checkpoint(body, path, optimizer)
        m = self.model(body.get("model_id"))
        seq_id = body.get("seq_id")
        with m.seq.refusing(seq_id):
            c = self._checkpoint(path)
            self._compatible(m.lora, c)

        async def run():
            await self._load(m, c, optimizer, m.request_id(seq_id))
            return {"path": path, "type": "load_weights"}, "application/json"
        return self._submit(m, seq_id, json.dumps(body, sort_keys=True), "LoadWeights", run)

    def _compatible(self, lora, c):
        if (lora is None) != (c["lora"] is None):
            raise UserError("%s is a %s checkpoint; this model is %s" % (
                c["path"], "LoRA" if c["lora"] else "full fine-tuning",
                "LoRA" if lora else "full fine-tuning"))
        if lora and (lora["rank"], lora["targets"]) != (c["lora"]["rank"], c["lora"]["targets"]):
            raise UserError("%s has LoRA rank %d on %s; this model has rank %d on %s" % (
                c["path"], c["lora"]["rank"], c["lora"]["targets"], lora["rank"],
                lora["targets"]))

    async def _load(self, m, c, optimizer, request_id):
        if optimizer and not c["optimizer"]:
            raise Failed("%s holds weights only (save_weights_for_sampler); load it without "
                         "the optimizer" % c["path"], "user")
        step = await m.engine.client.load_checkpoint(
            c["rel"], contents=None if optimizer else ["model"], adapter=m.adapter,
            request_id=request_id)
        m.generation += 1
        m.version = int(step) if optimizer else m.version

    def _create_from_checkpoint(self, body, path, optimizer):
        def prepare(model_id, sid, seq):
            c = self._checkpoint(path)

            async def run():
                lora = dict(c["lora"], seed=0) if c["lora"] else None
                m = await self._new_model(model_id, sid, lora)
                try:
                    await self._load(m, c, optimizer, "tk:load:" + model_id)
                except BaseException:
                    await self.unload(model_id)
                    raise
                return ({"path": path, "model_id": model_id, "type": "load_weights"},
                        "application/json")
            return run()
        return self._create(body, "LoadWeights", prepare)

    # --- sampling --------------------------------------------------------
    async def create_sampling_session(self, body):
        sid = body.get("session_id")
        self.session(sid)
        n = body.get("sampling_session_seq_id")
        if not isinstance(n, int) or n < 0:
            raise UserError("sampling_session_seq_id: %r (an integer from 0)" % (n,))
        sampler_id = "%s:sample:%d" % (sid, n)
        if sampler_id in self.samplers:
            return sampler_id
        path = body.get("model_path")
        if path:
            c = self._checkpoint(path)
            m = self.models.get(c["model_id"])
            eng = m.engine if m else None
            self.samplers[sampler_id] = Sampler(
                sampler_id, eng, m.adapter if m else None, m, c["version"], c["generation"],
                c, path)
        else:
            self._check_base(body.get("base_model"))
            eng = await self.engines.base()
            self.samplers[sampler_id] = Sampler(sampler_id, eng, "")
        return sampler_id

    def get_sampler(self, sampler_id):
        s = self.samplers.get(sampler_id)
        if s is None:
            raise LookupError("sampler %r is unknown to this gateway" % (sampler_id,))
        return {"sampler_id": sampler_id, "base_model": self.model_name,
                "model_path": s.model_path}

    def asample(self, body):
        sid = body.get("sampling_session_id")
        s = self.samplers.get(sid)
        if s is None:
            raise LookupError("sampling_session_id %r is unknown to this gateway" % (sid,))
        seq_id = body.get("seq_id")
        key = json.dumps(body, sort_keys=True)
        if seq_id in s.requests:
            k, rec = s.requests[seq_id]
            if k != key:
                raise UserError("seq_id %r of %s was already used for another request"
                                % (seq_id, sid))
            return rec
        args, n, last_n = self._sample_args(body)
        rec = self.futures.new("Sample")
        rec.sequence_ids = ["%s:%s:%d" % (sid, seq_id, i) for i in range(n)]
        s.requests[seq_id] = (key, rec)

        async def run():
            stop_texts = args.pop("stop_texts")
            r = await self._sample(s, args)
            return self._sample_reply(r, n, last_n, stop_texts), "application/x-protobuf"
        self.futures.run(rec, run())
        return rec

    def _sample_args(self, body):
        tokens = []
        for i, ch in enumerate((body.get("prompt") or {}).get("chunks") or []):
            if ch.get("type", "encoded_text") != "encoded_text":
                raise UserError("prompt.chunks[%d]: %s chunks are not supported (engined "
                                "serves text models)" % (i, ch.get("type")))
            tokens.extend(wire.token_ids(ch.get("tokens") or [], "prompt.chunks[%d].tokens" % i))
        if not tokens:
            raise UserError("prompt: no tokens")
        for unsupported in ("topk_prompt_logprobs", "prompt_alt_tokens_k"):
            if body.get(unsupported):
                raise UserError("%s: not supported by this gateway" % unsupported)
        if body.get("target_prompt_logprobs") is not None or body.get("record_stability_info"):
            raise UserError("target_prompt_logprobs / record_stability_info: not supported")
        sp = body.get("sampling_params") or {}
        n = wire.number(body, "num_samples", 1, "request", integer=True)
        if not 1 <= n <= MAX_SAMPLES:
            raise UserError("num_samples: %d (1 to %d)" % (n, MAX_SAMPLES))
        max_tokens = wire.number(sp, "max_tokens", None, "sampling_params", integer=True)
        if max_tokens is None:
            max_tokens = max(1, min(4096, (self.max_context_length or 4096) - len(tokens)))
        stop = sp.get("stop")
        stop_ids, stop_seqs, stop_texts = [], [], []
        if isinstance(stop, str):
            stop = [stop]
        if stop is None:
            stop_ids = list(self.eos_token_ids)
        elif isinstance(stop, list) and stop and all(isinstance(t, str) for t in stop):
            stop_texts = list(stop)
            stop_seqs = self._stop_sequences(stop_texts)
        elif isinstance(stop, list) and all(isinstance(t, int) and not isinstance(t, bool)
                                            for t in stop):
            stop_ids = wire.token_ids(stop, "sampling_params.stop")
        else:
            raise UserError("sampling_params.stop: a string, a list of strings or a list of "
                            "token ids (got %r)" % (stop,))
        top_k = wire.number(sp, "top_k", -1, "sampling_params", integer=True)
        top_p = wire.number(sp, "top_p", 1.0, "sampling_params")
        seed = wire.number(sp, "seed", None, "sampling_params", integer=True)
        args = dict(input_ids=np.array(tokens, dtype=np.int32), seq_lens=[len(tokens)],
                    max_tokens=max_tokens, num_samples=n,
                    temperature=float(wire.number(sp, "temperature", 1.0, "sampling_params")),
                    top_k=top_k if top_k > 0 else 0,
                    top_p=None if top_p >= 1.0 else float(top_p),
                    seed=(seed if seed is not None else self._draw_seed(body)) % (1 << 63),
                    stop_token_ids=stop_ids, stop_sequences=stop_seqs,
                    top_logprobs=wire.number(body, "topk_sample_logprobs", 0, "request",
                                             integer=True),
                    prompt_logprobs=bool(body.get("prompt_logprobs")))
        args["stop_texts"] = stop_texts
        last_n = wire.number(body, "prompt_logprobs_last_n", None, "request", integer=True)
        return args, n, last_n

    def _stop_sequences(self, texts):
        """Stop strings as engined's stop_sequences: each string's tokens
        (the tokenizer's own encoding). The reply is then cut where the
        decoded text first holds a stop string (_cut_at_stop), which also
        catches a stop string the model spelled with other tokens."""
        if self.tokenizer is None:
            raise UserError("sampling_params.stop: stop strings need the model's tokenizer "
                            "(tokenizer.json in the gateway's --model-dir); send token ids")
        if len(texts) > 64:
            raise UserError("sampling_params.stop: %d strings (at most 64)" % len(texts))
        seqs = []
        for t in texts:
            ids = self.tokenizer.encode(t, add_special_tokens=False).ids
            if not 1 <= len(ids) <= 64:
                raise UserError("sampling_params.stop: %r is %d tokens (1 to 64)" % (t, len(ids)))
            seqs.append(ids)
        return seqs

    def _cut_at_stop(self, tokens, texts):
        """How many of tokens to keep: up to the token that completes the
        first stop string in the decoded text (all when none appears)."""
        def holds(n):
            text = self.tokenizer.decode(list(tokens[:n]), skip_special_tokens=False)
            return any(t in text for t in texts)
        if not texts or not holds(len(tokens)):
            return None
        # not holds(lo), holds(hi): a prefix that holds one, longer ones do too
        lo, hi = 0, len(tokens)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if holds(mid) else (mid, hi)
        return hi

    def _draw_seed(self, body):
        """A sample's seed when the client gives none."""
        sampler = str(body.get("sampling_session_id", "")).rpartition(":sample:")[2]
        return self._seed("sample:%s:%s" % (sampler, body.get("seq_id")))

    def _seed(self, what):
        """A seed the client left unset: random, or with --seed derived
        from it and `what` (ids without the random session id), so that a
        run repeats."""
        if self.seed is None:
            return secrets.randbits(63)
        key = "%d:%s" % (self.seed, what)
        return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little") >> 1

    async def _snapshot_adapter(self, s):
        """s's weights in an adapter of their own, loaded from its checkpoint."""
        c = s.checkpoint
        if not c["lora"]:
            raise Failed("%s: the model has been trained (or reloaded) since these weights "
                         "were saved, and a full fine-tune's engine holds one set of weights: "
                         "sample before the next optim_step" % s.sampler_id, "user")
        m = s.model
        eng = m.engine if m else await self.engines.claim("lora", s.sampler_id)
        self._snap += 1
        name = ("tk-snap%d-" % self._snap + safe(c["model_id"]))[:64]
        lora = c["lora"]
        await eng.client.create_adapter(name, rank=lora["rank"], alpha=lora["alpha"],
                                        target_modules=lora["targets"], seed=0)
        await eng.client.load_checkpoint(c["rel"], contents=["model"], adapter=name)
        eng.snapshots += 1
        if m is not None:
            m.snapshots.append(name)
            while len(m.snapshots) > SNAPSHOTS_PER_MODEL:
                old = m.snapshots.pop(0)
                for other in self.samplers.values():
                    if other.engine is eng and other.adapter == old:
                        other.adapter = None
                await eng.client.delete_adapter(old)
                eng.snapshots -= 1
        s.engine, s.adapter, s.model = eng, name, None

    async def _sample(self, s, args):
        """Sample s's weights: the live model while it holds them (the
        reply's weights_version and the model's loads checked), else its
        snapshot (loaded once, then sampled)."""
        moved = False
        for _ in range(3):
            m = s.model
            if m is not None and (moved or m.generation != s.generation
                                  or m.version != s.version):
                async with s.lock:
                    if s.model is m:
                        await self._snapshot_adapter(s)
                continue
            if s.adapter is None:
                async with s.lock:
                    if s.adapter is None:
                        await self._snapshot_adapter(s)
            gen = m.generation if m else None
            r = await s.engine.sampler.sample(adapter=s.adapter, **args)
            if m is None or (r.weights_version == s.version and m.generation == gen):
                return r
            moved = True  # a step landed first: the snapshot is what to sample
        raise Failed("%s: the weights moved while sampling; retry" % s.sampler_id, "server")

    def _sample_reply(self, r, n, last_n, stop_texts):
        seqs, plp = [], None
        for c in r.completions:
            seq = (c.finish_reason, c.token_ids, c.logprobs, c.top_token_ids, c.top_logprobs)
            keep = self._cut_at_stop(c.token_ids, stop_texts)
            if keep is not None:
                seq = ("stop",) + tuple(None if x is None else x[:keep] for x in seq[1:])
            seqs.append(seq)
            if c.prompt_logprobs is not None and c.sample_index == 0:
                plp = c.prompt_logprobs.astype(np.float32).copy()
                plp[0] = np.nan
                if last_n is not None:
                    plp[:max(0, len(plp) - int(last_n))] = np.nan
        if len(seqs) != n:
            raise Failed("engined returned %d completions for %d samples" % (len(seqs), n),
                         "server")
        return wire.sample_output(seqs, plp)

    # --- REST: training runs and checkpoints ------------------------------
    def training_run(self, model_id):
        m = self.models.get(model_id)
        ck = [c for c in self.checkpoints.by_path.values() if c["model_id"] == model_id]
        if m is None and not ck:
            raise LookupError("training run %r is unknown to this gateway" % (model_id,))
        lora = m.lora if m else ck[0]["lora"]

        def last(kind):
            cs = [c for c in ck if c["kind"] == kind]
            return self.checkpoints.json(max(cs, key=lambda c: c["time"])) if cs else None
        t = m.last_request if m else max(c["time"] for c in ck)
        return {"training_run_id": model_id, "base_model": self.model_name,
                "model_owner": "engined", "is_lora": lora is not None,
                "lora_rank": lora["rank"] if lora else None, "corrupted": False,
                "last_request_time": iso(t), "last_checkpoint": last("weights"),
                "last_sampler_checkpoint": last("sampler_weights"),
                "user_metadata": m.user_metadata if m else None}

    def training_runs(self):
        ids = sorted(set(self.models) |
                     {c["model_id"] for c in self.checkpoints.by_path.values()})
        return [self.training_run(i) for i in ids]

    async def housekeeping(self):
        """Periodic: expired checkpoints and results go, and so do the
        sessions not heard from (no heartbeat, no request) for
        session_timeout_s, with their models (a script that died: the SDK
        heartbeats every 10 s while it lives)."""
        self.checkpoints.expire()
        self.futures.expire()
        now = time.time()
        for sid in [k for k, v in self.sessions.items()
                    if now - v["last_seen"] > self.session_timeout_s]:
            await self.end_session(sid, "no heartbeat for %.0f s" % self.session_timeout_s)

    async def end_session(self, sid, why):
        """Unload a session's models and forget it."""
        models = [k for k, m in self.models.items() if m.session_id == sid]
        if models:
            log.warning("session %s ended (%s): unloading %s", sid, why, ", ".join(models))
        for model_id in models:
            await self.unload(model_id)
        self.sessions.pop(sid, None)
