"""verl's LoRA path through the engined backend, driven by the real verl
0.9.1 (issue 27): the model config's lora_rank / lora_alpha /
target_modules / exclude_modules / lora_adapter_path / lora.merge,
get_per_tensor_param's (generator, peft_config) with base_sync_done,
disable_adapter() and checkpoints of the adapter.

The references are verl's and peft's own code on a transformers model
holding the same base weights, made LoRA as verl's FSDP engine makes it
(get_peft_model with LoraConfig(task_type CAUSAL_LM, r, lora_alpha,
target_modules, exclude_modules, bias "none")):
  - the base view (base_sync_done=False) is, name for name and bit for
    bit, what verl's collect_lora_params + replace_lora_wrapper give for
    that model; the adapter view's names are peft's
    get_peft_model_state_dict's, and its peft_config is the model's;
  - one SFT update through verl's sft_loss: the loss within 1e-5 of
    verl's loss on peft's outputs, the adapter after the step within 1e-6
    of torch's AdamW (verl's settings, gradient clipping included) on
    peft's model, the log-probs then within 1e-5 of peft's;
  - disable_adapter(): the base model's log-probs (peft's
    disable_adapter()); the base unchanged bit for bit;
  - lora.merge: the merged weights within 1e-6 of peft's
    merge_and_unload(), peft_config None;
  - lora_adapter_path: a directory peft saved (B not zero) starts the
    adapter: log-probs within 1e-5 of peft's model;
  - a checkpoint saved through verl's arguments is a PEFT directory that
    PeftModel.from_pretrained loads (log-probs within 1e-5), and loading
    it restores the adapter bit for bit.

Run: tests/verl/setup_venv.sh build, then
ENGINED_BIN=build/daemon/engined PYTHONPATH=tests/integration:tests/verl
build/venv-verl/bin/python -m pytest tests/verl/test_verl_lora.py
"""
import copy
import functools
import os
import tempfile

import grpc
import pytest
import torch

from daemon_fixture import Daemon

import verl  # noqa: F401  (loads the engined plugin)
import verl.utils.tensordict_utils as tu
from verl.trainer.config import CheckpointConfig
from verl.utils.fsdp_utils import collect_lora_params, replace_lora_wrapper
from verl.workers.engine import EngineRegistry
from verl.workers.utils.losses import sft_loss

import peft
from peft import LoraConfig, TaskType, get_peft_model

from engined_client import GroupError

import verl_batches as vb

torch.set_num_threads(2)
ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def daemon():
    """With a share socket: weight_transport "auto" maps the views from
    shared memory (ShareWeights' adapter_view)."""
    with tempfile.TemporaryDirectory() as tmp:
        d = Daemon("--share-socket", os.path.join(tmp, "share.sock"))
        yield d
        d.stop()


def lora_engine(daemon, tmp, rank=4, alpha=8, targets="all-linear", exclude=None, merge=False,
                adapter_path=None, model_type="language_model", **kw):
    mc = vb.model_config(tmp, value=model_type == "value_model", lora_rank=rank,
                         lora_alpha=alpha, target_modules=targets, exclude_modules=exclude,
                         lora_adapter_path=adapter_path, lora={"merge": True} if merge else {})
    eng = EngineRegistry.new(
        model_type=model_type, backend="engined", model_config=mc,
        engine_config=vb.engine_config([daemon.addr], daemon.ckpt_root,
                                       model_local_root=daemon.model_root, **kw),
        optimizer_config=vb.optimizer_config(), checkpoint_config=CheckpointConfig())
    eng.initialize()
    return eng


def tensors(eng, base_sync_done):
    gen, cfg = eng.get_per_tensor_param(layered_summon=False, base_sync_done=base_sync_done)
    return {k: v.clone() for k, v in gen}, cfg


def verl_peft_model(base_state, rank, alpha, targets, exclude):
    """transformers' Llama with the engine's base weights, made LoRA as
    verl's FSDP engine makes it (_build_lora_module)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(**{k: v for k, v in vb.HF_CONFIG.items() if k != "architectures"})
    cfg._attn_implementation = "eager"
    m = LlamaForCausalLM(cfg).to(torch.float32)
    m.load_state_dict(base_state, strict=True)
    return get_peft_model(m, LoraConfig(task_type=TaskType.CAUSAL_LM, r=rank, lora_alpha=alpha,
                                        target_modules=targets, exclude_modules=exclude,
                                        bias="none"))


def plain(base_view):
    """The base view's tensors under their HF names."""
    return {k.replace(".base_layer.", "."): v for k, v in base_view.items()}


def outputs(model, data):
    """verl-aligned log-probs (entry k predicts token k + 1, a sequence's
    last entry 0), float32 with autograd, as a jagged nested tensor."""
    lps = []
    for seq in data["input_ids"].unbind():
        logp = torch.log_softmax(model(input_ids=seq[None].long()).logits[0].float(), -1)
        lp = logp[:-1].gather(1, seq[1:, None].long())[:, 0]
        lps.append(torch.cat([lp, lp.new_zeros(1)]))
    return {"log_probs": torch.nested.as_nested_tensor(lps, layout=torch.jagged)}


def engine_log_probs(eng, data):
    with eng.eval_mode():
        return eng.infer_batch(data)["model_output"]["log_probs"].values()


def with_global(data):
    tu.assign_non_tensor(data, batch_num_tokens=int(data["loss_mask"].sum()), dp_size=1)
    return data


def max_diff(a, b):
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def lora_state(pmodel):
    return {k: v.detach().clone() for k, v in
            peft.get_peft_model_state_dict(pmodel).items()}


@pytest.mark.parametrize("targets,exclude", [
    ("all-linear", None),
    (["q_proj", "v_proj", "up_proj", "down_proj"], ["up_proj"]),
])
def test_views_and_an_update_against_verl_and_peft(daemon, targets, exclude):
    with tempfile.TemporaryDirectory() as tmp:
        eng = lora_engine(daemon, tmp, targets=targets, exclude=exclude)
        base, cfg = tensors(eng, base_sync_done=False)
        ref = verl_peft_model(plain(base), 4, 8, targets, exclude)
        # The base view: verl's own first sync of that model, bit for bit.
        want = {replace_lora_wrapper(k, ref.peft_config["default"]): v for k, v in
                collect_lora_params(ref, layered_summon=False, base_sync_done=False).items()}
        assert set(base) == set(want)
        assert all(torch.equal(base[k], want[k]) for k in want)
        # peft_config: the adapter's, as peft resolved verl's settings.
        kept = set(ALL_LINEAR if targets == "all-linear" else targets) - set(exclude or ())
        assert isinstance(cfg, LoraConfig) and cfg.task_type == TaskType.CAUSAL_LM
        assert (cfg.r, cfg.lora_alpha, set(cfg.target_modules)) == (4, 8, kept)
        # peft resolves all-linear to module paths; the modules are the same
        # (vLLM and SGLang match target_modules by suffix).
        assert {m.rsplit(".", 1)[-1] for m in ref.peft_config["default"].target_modules} \
            - set(exclude or ()) == kept
        # The adapter view: peft's names and shapes; its values into peft.
        ad, cfg2 = tensors(eng, base_sync_done=True)
        pstate = collect_lora_params(ref, layered_summon=False, base_sync_done=True)
        assert set(ad) == set(pstate) and cfg2.r == 4
        assert all(ad[k].shape == pstate[k].shape for k in ad)
        assert all(float(ad[k].abs().max()) == 0 for k in ad if ".lora_B." in k)
        peft.set_peft_model_state_dict(ref, ad)

        # One SFT update through verl's loss, and the same by torch on peft.
        data = vb.sft_batch(3)
        loss_fn = functools.partial(sft_loss, config=None)
        with eng.train_mode():
            out = eng.train_batch(vb.sft_batch(3), loss_fn)
        oc = vb.optimizer_config()
        params = [p for n, p in ref.named_parameters() if p.requires_grad]
        assert len(params) == len(ad)
        opt = torch.optim.AdamW(params, lr=oc.lr, betas=tuple(oc.betas),
                                weight_decay=oc.weight_decay)
        want_loss, _ = sft_loss(None, outputs(ref, with_global(copy.deepcopy(data))),
                                with_global(copy.deepcopy(data)))
        want_loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, oc.clip_grad)
        opt.step()
        print("lora %s exclude %s: loss engined %.9g verl+peft %.9g; grad norm %.6g / %.6g"
              % (targets, exclude, out["loss"][0], float(want_loss), out["metrics"]["grad_norm"],
                 float(norm)))
        assert abs(out["loss"][0] - float(want_loss)) <= 1e-5 * max(1.0, abs(float(want_loss)))
        after, _ = tensors(eng, base_sync_done=True)
        d = max_diff(after, lora_state(ref))
        print("  adapter after the step: max |engined - torch| %.3g" % d)
        assert d <= 1e-6
        assert max_diff(after, ad) > 1e-4           # it trained
        # Log-probs of the trained adapter, of the base, the base unchanged.
        rb = vb.rollout_batch(2)
        with torch.no_grad():
            want_lp = outputs(ref, rb)["log_probs"].values()
            with ref.disable_adapter():
                want_base = outputs(ref, rb)["log_probs"].values()
        got = engine_log_probs(eng, rb)
        with eng.disable_adapter():
            got_base = engine_log_probs(eng, rb)
        print("  log-probs: adapter %.3g, disable_adapter() %.3g; adapter moved them %.3g"
              % (float((got - want_lp).abs().max()), float((got_base - want_base).abs().max()),
                 float((got - got_base).abs().max())))
        assert float((got - want_lp).abs().max()) <= 1e-5
        assert float((got_base - want_base).abs().max()) <= 1e-5
        assert float((got - got_base).abs().max()) > 1e-4
        b2, _ = tensors(eng, base_sync_done=False)
        assert all(torch.equal(b2[k], base[k]) for k in base)


def test_merge_gives_merged_weights_and_no_peft_config(daemon):
    with tempfile.TemporaryDirectory() as tmp:
        eng = lora_engine(daemon, tmp, merge=True)
        with eng.train_mode():
            eng.train_batch(vb.sft_batch(5), functools.partial(sft_loss, config=None))
        merged, cfg = tensors(eng, base_sync_done=True)
        assert cfg is None
        # The same through base_sync_done=False: merge wins (the rollout has no LoRA).
        assert max_diff(tensors(eng, base_sync_done=False)[0], merged) == 0
        # The reference: peft's merge of the engine's base and adapter.
        eng.lora.merge = False
        base, _ = tensors(eng, base_sync_done=False)
        ad, _ = tensors(eng, base_sync_done=True)
        ref = verl_peft_model(plain(base), 4, 8, "all-linear", None)
        peft.set_peft_model_state_dict(ref, ad)
        want = ref.merge_and_unload().state_dict()
        d = max_diff(merged, {k: want[k] for k in merged})
        moved = max_diff(merged, plain(base))
        print("merged vs peft merge_and_unload: %.3g (the merge moved W by %.3g)" % (d, moved))
        assert moved > 1e-6
        assert set(merged) == set(want) and d <= 1e-6


def test_adapter_path_and_checkpoints(daemon):
    """Start from a PEFT directory (lora_adapter_path, under the daemon's
    model root); train; save through verl's arguments; peft loads the
    save; loading it restores the adapter."""
    from transformers import LlamaConfig, LlamaForCausalLM
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(11)
        cfg = LlamaConfig(**{k: v for k, v in vb.HF_CONFIG.items() if k != "architectures"})
        base = LlamaForCausalLM(cfg).to(torch.float32)
        base_dir = os.path.join(daemon.model_root, "lora-base")
        base.save_pretrained(base_dir)
        pm = get_peft_model(copy.deepcopy(base), LoraConfig(
            task_type=TaskType.CAUSAL_LM, r=6, lora_alpha=12,
            target_modules=["q_proj", "o_proj", "gate_proj"], init_lora_weights=False))
        adir = os.path.join(daemon.model_root, "lora-start")
        pm.save_pretrained(adir)
        # verl's settings besides the path are not the file's: the file wins.
        eng = lora_engine(daemon, tmp, rank=16, alpha=32, adapter_path=adir,
                          model_path="lora-base")
        rb = vb.rollout_batch(4)
        pm.eval()
        with torch.no_grad():
            want = outputs(pm, rb)["log_probs"].values()
        d = float((engine_log_probs(eng, rb) - want).abs().max())
        print("from lora_adapter_path: log-probs vs peft %.3g" % d)
        assert d <= 1e-5
        cfg = tensors(eng, base_sync_done=True)[1]
        assert (cfg.r, cfg.lora_alpha, set(cfg.target_modules)) == \
            (6, 12, {"q_proj", "o_proj", "gate_proj"})

        loss_fn = functools.partial(sft_loss, config=None)
        with eng.train_mode():
            eng.train_batch(vb.sft_batch(6), loss_fn)
        path = os.path.join(daemon.ckpt_root, "exp", "global_step_1", "actor")
        eng.save_checkpoint(path, global_step=1, max_ckpt_to_keep=2)
        saved, _ = tensors(eng, base_sync_done=True)
        assert os.path.isfile(os.path.join(path, "adapter_config.json"))
        loaded = peft.PeftModel.from_pretrained(copy.deepcopy(base), path).eval()
        with torch.no_grad():
            want = outputs(loaded, rb)["log_probs"].values()
        d = float((engine_log_probs(eng, rb) - want).abs().max())
        print("checkpoint loaded by peft: log-probs vs engined %.3g" % d)
        assert d <= 1e-5
        with eng.train_mode():
            eng.train_batch(vb.sft_batch(7), loss_fn)
        assert max_diff(tensors(eng, base_sync_done=True)[0], saved) > 0
        assert eng.load_checkpoint(path) == 1
        assert max_diff(tensors(eng, base_sync_done=True)[0], saved) == 0


def test_value_model_adapter_trains_its_score_head(daemon):
    from verl.workers.utils.losses import value_loss
    with tempfile.TemporaryDirectory() as tmp:
        eng = lora_engine(daemon, tmp, model_type="value_model")
        ad, _ = tensors(eng, base_sync_done=True)
        assert "base_model.model.score.weight" in ad
        with eng.train_mode():
            eng.train_batch(vb.rollout_batch(9), functools.partial(
                value_loss, config=vb.critic_config(cliprange_value=0.2)))
        after, _ = tensors(eng, base_sync_done=True)
        assert float((after["base_model.model.score.weight"] -
                      ad["base_model.model.score.weight"]).abs().max()) > 0


def test_refusals(daemon):
    with tempfile.TemporaryDirectory() as tmp:
        with pytest.raises(ValueError, match="target_modules"):
            lora_engine(daemon, tmp, targets=["lm_head"])
        with pytest.raises(NotImplementedError, match="different layers"):
            lora_engine(daemon, tmp, exclude=r"model\.layers\.0\..*")
        with pytest.raises(ValueError, match="not under model_local_root"):
            lora_engine(daemon, tmp, adapter_path="/elsewhere/adapter")
        eng = lora_engine(daemon, tmp)
        with pytest.raises(ValueError, match="layered_summon needs base_sync_done"):
            eng.get_per_tensor_param(layered_summon=True, base_sync_done=False)
        # The base is frozen: training it (inside disable_adapter) is refused.
        with eng.disable_adapter(), eng.train_mode():
            with pytest.raises(GroupError, match="frozen_base") as e:
                eng.train_batch(vb.sft_batch(1), functools.partial(sft_loss, config=None))
        assert e.value.codes() == {0: grpc.StatusCode.FAILED_PRECONDITION}
        # ... and the engine goes on.
        with eng.train_mode():
            eng.train_batch(vb.sft_batch(1), functools.partial(sft_loss, config=None))
