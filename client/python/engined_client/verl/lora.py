"""lora.py — verl's LoRA settings as engined's adapter (docs/LORA.md).

verl's model config carries LoRA in lora_rank (0: off), lora_alpha,
target_modules ("all-linear" or a list), exclude_modules (a list of module
names, or a regular expression as peft takes it), lora_adapter_path (a
PEFT directory to start from) and lora.merge (sync merged weights). Here
they become one adapter, ADAPTER, of a frozen base (CreateAdapter), and
the three ways verl syncs weights become adapter views:

  lora.merge           -> "merged": W + scale B A in HF names, peft_config None
  base_sync_done=True  -> "adapter": lora_A / lora_B in PEFT's names
  base_sync_done=False -> "base": the base under verl's base_layer names

with, but for merged, the peft.LoraConfig that verl's FSDP engine hands
its rollout (task CAUSAL_LM, the adapter's r, alpha, rsLoRA and the module
names it targets). Exclusions are resolved here, as peft resolves them, on
every layer's module paths: what remains must be the same set of modules
on every layer (CreateAdapter's targets are per module, not per layer);
and as verl's replace_lora_wrapper, an excluded module's base weight keeps
its plain name in the base view.
"""
import re
from dataclasses import dataclass
from typing import Optional

from .config import daemon_path

ADAPTER = "default"          # peft's name of a model's one adapter
MODULES = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn",
           "o_proj": "self_attn", "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def _excluded(exclude, key):
    """peft's rule for exclude_modules on one module path: a string is a
    regular expression that must match the whole path; a list names
    modules by path suffix."""
    if exclude is None:
        return False
    if isinstance(exclude, str):
        return re.fullmatch(exclude, key) is not None
    return any(key == m or key.endswith("." + m) for m in exclude)


def _as_list(x):
    if x is None or isinstance(x, str):
        return x
    return [str(m) for m in x]       # Hydra's ListConfig


def _targets(target_modules, exclude, num_layers):
    """The module names targeted on every layer (None: the request's own
    targets stand, no exclusion applies)."""
    if isinstance(target_modules, str):
        names = list(MODULES) if target_modules == "all-linear" else [target_modules]
    else:
        names = list(target_modules)
    unknown = [m for m in names if m.rsplit(".", 1)[-1] not in MODULES]
    if unknown:
        raise ValueError(f"target_modules: {unknown}: engined's adapters target the "
                         f"projections {sorted(MODULES)} (or 'all-linear')")
    if exclude is None:
        return names
    per_layer = []
    for layer in range(num_layers):
        keep = [m for m in names
                if not _excluded(exclude, "model.layers.%d.%s.%s" % (
                    layer, MODULES[m.rsplit(".", 1)[-1]], m.rsplit(".", 1)[-1]))]
        per_layer.append(keep)
    if any(k != per_layer[0] for k in per_layer):
        raise NotImplementedError(f"exclude_modules {exclude!r} excludes different modules on "
                                  "different layers: engined's adapters target the same "
                                  "modules on every layer")
    if not per_layer or not per_layer[0]:
        raise ValueError(f"exclude_modules {exclude!r} leaves no module to adapt")
    return per_layer[0]


@dataclass
class LoraSpec:
    rank: int
    alpha: float
    target_modules: object           # "all-linear" or a list
    exclude_modules: object          # None, a regular expression or a list
    adapter_dir: Optional[str]       # under the daemon's model root
    merge: bool
    num_layers: int
    made: object = None              # the CreateAdapterResult

    @classmethod
    def of(cls, model_config, engine_config):
        """The spec of verl's model config, None without LoRA."""
        rank = int(getattr(model_config, "lora_rank", 0) or 0)
        path = getattr(model_config, "lora_adapter_path", None)
        if rank <= 0 and not path:
            return None
        if getattr(model_config, "target_parameters", None):
            raise NotImplementedError("target_parameters: engined's adapters target modules "
                                      "(LoRA on nn.Parameter is not served)")
        lora = dict(getattr(model_config, "lora", None) or {})
        hf = getattr(model_config, "hf_config", None)
        return cls(rank=rank, alpha=float(getattr(model_config, "lora_alpha", 16)),
                   target_modules=_as_list(getattr(model_config, "target_modules",
                                                   "all-linear")),
                   exclude_modules=_as_list(getattr(model_config, "exclude_modules", None)),
                   adapter_dir=daemon_path(path, engine_config.model_local_root,
                                           "lora_adapter_path", "model_local_root")
                   if path else None,
                   merge=bool(lora.get("merge", False)),
                   num_layers=int(getattr(hf, "num_hidden_layers", 0) or 0))

    def create_kwargs(self, seed):
        """CreateAdapter's arguments. From a PEFT directory the file
        gives rank, alpha and targets (verl's FSDP engine loads it with
        PeftModel.from_pretrained, ignoring lora_rank and the rest)."""
        if self.adapter_dir:
            return {"peft_dir": self.adapter_dir, "seed": seed}
        return {"rank": self.rank, "alpha": self.alpha, "seed": seed,
                "target_modules": _targets(self.target_modules, self.exclude_modules,
                                           self.num_layers)}

    def created(self, result):
        self.made = result

    def view(self, base_sync_done):
        if self.merge:
            return "merged"
        return "adapter" if base_sync_done else "base"

    def peft_config(self, view):
        """What verl's FSDP engine returns beside the tensors: the
        adapter's peft.LoraConfig (None for merged weights)."""
        if view == "merged":
            return None
        from peft import LoraConfig, TaskType
        m = self.made
        alpha = int(m.alpha) if float(m.alpha).is_integer() else m.alpha
        return LoraConfig(task_type=TaskType.CAUSAL_LM, r=int(m.rank), lora_alpha=alpha,
                          target_modules=set(m.target_modules), use_rslora=bool(m.use_rslora),
                          exclude_modules=self.exclude_modules, bias="none")

    def renamed(self, tensors, view):
        """The base view under verl's names: an excluded module's weight
        keeps its plain name (replace_lora_wrapper)."""
        if view != "base" or self.exclude_modules is None:
            yield from tensors
            return
        for name, t in tensors:
            module, dot, leaf = name.rpartition(".base_layer.")
            if dot and _excluded(self.exclude_modules, module):
                name = module + "." + leaf
            yield name, t
