"""config.py — EnginedEngineConfig: the verl engine config of the engined
backend (`strategy: engined`), in verl's style (a BaseConfig dataclass that
Hydra builds from `_target_: engined_client.verl.EnginedEngineConfig`).

verl's own fields (EngineConfig: param_offload, optimizer_offload,
forward_only, dtype, use_dynamic_bsz, max_token_len_per_gpu, seed, ...) keep
their meaning; the rest say where the daemons are and what they load:

  addresses         the daemons: one per data-parallel rank of engined. A
                    verl process that is alone (no torch.distributed, or a
                    world of one) drives all of them as one EngineGroup; in
                    a torch.distributed world of W processes there must be
                    W addresses and process r drives addresses[r] (one
                    daemon per verl rank).
  token / token_file, root_certificates, certificate_chain, private_key,
  server_name       the daemons' credentials (EngineClient's arguments;
                    file paths for the PEM ones).
  model_path        the model directory on the daemon's host, relative to
                    its model root; preset: a daemon preset ("tiny", ...)
                    instead. With neither, the daemon builds the model of
                    the verl model config's config.json from `seed` (a
                    random init: tests and toys).
  device            the daemon's device: "cpu" or "cuda".
  checkpoint_local_root
                    the directory that verl's checkpoint paths are under
                    and that is the daemons' checkpoint root (the same
                    disk, or a shared file system); verl's local_path is
                    sent relative to it. None: verl's paths are sent as
                    they are (then they must be relative).
  model_local_root  the directory that is the daemons' model root, seen
                    from here: verl's lora_adapter_path is sent relative to
                    it (None: sent as it is, then it must be relative).
  replace           replace an engine the daemon already holds (a restarted
                    controller); else Initialize on such a daemon fails
                    FAILED_PRECONDITION. verl's reset() (initialize()
                    again) always replaces this adapter's own engine.
  timeout_s, retries, collective_timeout_s
                    per-call deadline, retries of UNAVAILABLE /
                    DEADLINE_EXCEEDED (same request id: exactly once), and
                    the data-parallel group's collective timeout.
  zero_stage        what the daemons' group shards (DistConfig.zero_stage:
                    1 the optimizer state, the default; 2 the gradients
                    too; 3 the parameters too, verl's FSDP). With 3 the
                    weights go by the stream (a share needs them whole),
                    every rank reading it at once, as FSDP's full tensors
                    need every rank.

dtype is the matmul precision: "bfloat16" (verl's default) makes the
daemon multiply in bf16 with fp32 accumulation and fp32 master weights
(bf16_matmul); "float32" keeps every product in fp32. Weights go to
rollout in `weight_dtype` ("bfloat16" by default, as verl's FSDP engine
hands them to vLLM / SGLang), by `weight_transport`: "auto" (the default)
maps them from shared memory when the daemon runs on this host with a
share socket this user may open (ShareWeights: a bfloat16 share of a CPU
engine is its own bf16 copy, no copy made) and streams them otherwise;
"share" always maps them (an error when it cannot); "stream" always
streams them (GetPerTensorParam).
"""
import os
from dataclasses import dataclass, field
from typing import Optional

from verl.workers.config.engine import EngineConfig

STRATEGY = "engined"


@dataclass
class EnginedEngineConfig(EngineConfig):
    strategy: str = STRATEGY
    addresses: list = field(default_factory=lambda: ["127.0.0.1:50051"])
    token: Optional[str] = None
    token_file: Optional[str] = None
    root_certificates: Optional[str] = None
    certificate_chain: Optional[str] = None
    private_key: Optional[str] = None
    server_name: Optional[str] = None
    model_path: Optional[str] = None
    preset: Optional[str] = None
    device: str = "cpu"
    checkpoint_local_root: Optional[str] = None
    model_local_root: Optional[str] = None
    weight_dtype: str = "bfloat16"
    weight_transport: str = "auto"
    replace: bool = False
    timeout_s: Optional[float] = None
    retries: int = 3
    collective_timeout_s: Optional[float] = None
    zero_stage: Optional[int] = None

    def __post_init__(self):
        super().__post_init__()
        if self.strategy != STRATEGY:
            raise ValueError(f"strategy: {self.strategy!r} is not {STRATEGY!r}")
        if not self.address_list():
            raise ValueError("addresses: at least one daemon")
        if self.dtype not in ("bfloat16", "float32"):
            raise ValueError(f"dtype: {self.dtype!r}: the engined backend computes in "
                             "'bfloat16' (bf16 matmuls, fp32 master weights) or 'float32'")
        if self.weight_dtype not in ("bfloat16", "float32", "float16"):
            raise ValueError(f"weight_dtype: {self.weight_dtype!r}: 'bfloat16', 'float16' "
                             "or 'float32'")
        if self.weight_transport not in ("auto", "share", "stream"):
            raise ValueError(f"weight_transport: {self.weight_transport!r}: 'auto', 'share' "
                             "or 'stream'")
        if self.zero_stage not in (None, 1, 2, 3):
            raise ValueError(f"zero_stage: {self.zero_stage!r}: 1, 2 or 3")
        if self.model_path and self.preset:
            raise ValueError("model_path and preset: give one of them")

    def address_list(self):
        """addresses as a list (Hydra gives a ListConfig; one string is one
        daemon)."""
        a = self.addresses
        return [a] if isinstance(a, str) else [str(x) for x in a]

    def client_kwargs(self):
        """The EngineClient arguments of these credentials and limits."""
        token = self.token
        if token is None and self.token_file:
            with open(self.token_file, encoding="utf-8") as f:
                token = f.read().strip()
        kw = {"timeout": self.timeout_s, "retries": self.retries, "token": token,
              "server_name": self.server_name}
        for k in ("root_certificates", "certificate_chain", "private_key"):
            path = getattr(self, k)
            if path:
                with open(path, "rb") as f:
                    kw[k] = f.read()
        return kw


def daemon_path(path, root, what, root_name):
    """path as a daemon reads it: relative to root (the daemons' root
    directory of that kind, seen from here); without a root, path as it
    is, which must then be relative."""
    if root is None:
        if os.path.isabs(path):
            raise ValueError(f"{what} {path!r}: absolute, but the engine config has no "
                             f"{root_name} (the directory that is the daemons' root)")
        return path
    rel = os.path.relpath(os.path.abspath(path), os.path.abspath(root))
    if rel == "." or rel.startswith(".."):
        raise ValueError(f"{what} {path!r} is not under {root_name} {root!r}")
    return rel
