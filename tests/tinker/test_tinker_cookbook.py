"""test_tinker_cookbook.py — tinker-cookbook 0.6.1's own training loops,
unchanged, against engined-tinker (issue 29) on a 2-core machine:
  - supervised: tinker_cookbook.supervised.train.main with the cookbook's
    FromConversationFileBuilder over a local JSONL of conversations, the
    llama3 renderer, a held-out split (so the loop runs its
    SamplerNLLEvaluator: sampler snapshots and compute_logprobs) and
    periodic checkpoints; LoRA and full fine-tuning. The train NLL falls.
  - RL: tinker_cookbook.rl.train.main (sync, on-policy) over an environment
    written here on the cookbook's Env / RLDataset / RLDatasetBuilder
    interfaces, grouped by its ProblemGroupBuilder: one prompt, reward =
    the fraction of sampled tokens in a fixed eighth of the vocabulary (a
    random policy scores 0.125). The mean reward rises; the cookbook's
    kl_sample_train (sampler log-probs vs the trainer's) stays ~0. Also the
    async loop (one step off-policy, ppo), which samples snapshots.
What is configured around the loops: the tokenizer and model (built here,
cookbook_model.py), the dataset, the environment, base_url and the key."""
import asyncio
import json
import os
import random
from collections.abc import Sequence

import chz
import pytest

import tinker
from tinker_cookbook import renderers
from tinker_cookbook.rl import train as rl_train
from tinker_cookbook.rl.problem_env import ProblemGroupBuilder
from tinker_cookbook.rl.types import Env, EnvGroupBuilder, RLDataset, RLDatasetBuilder, StepResult
from tinker_cookbook.supervised import train as sl_train
from tinker_cookbook.supervised.data import FromConversationFileBuilder
from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig
from tinker_cookbook.tokenizer_utils import get_tokenizer

import cookbook_model
import gateway_fixture as gf
from daemon_fixture import Daemon, make_tmp

TARGET = frozenset(range(300, 350))  # 50 of the 400 token ids
QA = [("what is the color of the sky", "the sky is blue"),
      ("what is the color of the grass", "the grass is green"),
      ("what is the color of the sun", "the sun is red"),
      ("is the cat big", "yes the cat is big"),
      ("is the dog small", "no the dog is big"),
      ("what is one and one", "two"),
      ("hello", "hello you"),
      ("what does the bird eat", "the bird eats")]


@pytest.fixture(scope="module")
def stack():
    daemons = [Daemon()]
    model_dir = os.path.abspath(os.path.join(daemons[0].model_root, gf.MODEL))
    cookbook_model.save(model_dir)
    daemons.append(Daemon("--model-root", daemons[0].model_root, "--checkpoint-root",
                          daemons[0].ckpt_root))
    # --seed: the seeds the cookbook leaves unset (samples, LoRA's A) are
    # derived, so a run repeats.
    seed = os.environ.get("COOKBOOK_SEED", "0")
    gw = gf.Gateway(daemons, model_dir, extra=("--model-name", model_dir, "--seed", seed))
    os.environ.update(TINKER_BASE_URL=gw.url, TINKER_API_KEY=gf.KEY, TINKER_TELEMETRY="0")
    try:
        yield model_dir, gw
    finally:
        gw.stop()
        for d in daemons:
            d.stop()


def metrics(log_path):
    return [json.loads(ln) for ln in open(os.path.join(log_path, "metrics.jsonl"))]


@pytest.mark.parametrize("lora_rank", [8, 0])
def test_supervised_loop(stack, lora_rank):
    model_dir, gw = stack
    work = make_tmp(prefix="cookbook-sl-")
    data = os.path.join(work, "conversations.jsonl")
    rng = random.Random(0)
    with open(data, "w") as f:
        for _ in range(72):
            q, a = rng.choice(QA)
            f.write(json.dumps({"messages": [{"role": "user", "content": q},
                                             {"role": "assistant", "content": a}]}) + "\n")
    log_path = os.path.join(work, "log")
    config = sl_train.Config(
        log_path=log_path, model_name=model_dir, recipe_name="engined_sl",
        renderer_name="llama3",
        dataset_builder=FromConversationFileBuilder(
            file_path=data, test_size=8,
            common_config=ChatDatasetBuilderCommonConfig(
                model_name_for_tokenizer=model_dir, renderer_name="llama3", max_length=128,
                batch_size=8)),
        learning_rate=1e-2 if lora_rank else 1e-3, lr_schedule="constant", num_epochs=2,
        lora_rank=lora_rank, base_url=gw.url, save_every=5, eval_every=4,
        infrequent_eval_every=0, ttl_seconds=3600, wandb_project=None)
    asyncio.run(sl_train.main(config))
    rows = metrics(log_path)
    nll = [r["train_mean_nll"] for r in rows if "train_mean_nll" in r]
    held_out = [r[k] for r in rows for k in r if k.startswith("test/") and "nll" in k]
    assert len(nll) == 16 and nll[-1] < 0.6 * nll[0], nll
    assert len(held_out) >= 3 and held_out[-1] < held_out[0], held_out
    saved = [json.loads(ln) for ln in open(os.path.join(log_path, "checkpoints.jsonl"))]
    assert any(c.get("state_path") for c in saved) and any(c.get("sampler_path") for c in saved)


class TargetTokenEnv(Env):
    """One turn: reward = the fraction of the sampled tokens in TARGET."""

    def __init__(self, renderer):
        self.renderer = renderer

    async def initial_observation(self):
        ob = self.renderer.build_generation_prompt([{"role": "user", "content": "say a word"}])
        return ob, self.renderer.get_stop_sequences()

    async def step(self, action, *, extra=None):
        stop = set(self.renderer.get_stop_sequences())
        toks = [t for t in action if t not in stop]
        hit = sum(t in TARGET for t in toks) / max(1, len(toks))
        return StepResult(reward=hit, episode_done=True,
                          next_observation=tinker.ModelInput.empty(),
                          next_stop_condition=self.renderer.get_stop_sequences(),
                          metrics={"target_frac": hit})


class TargetTokenDataset(RLDataset):
    def __init__(self, renderer, n_batches, groups, group_size):
        self.renderer, self.n_batches = renderer, n_batches
        self.groups, self.group_size = groups, group_size

    def get_batch(self, index) -> Sequence[EnvGroupBuilder]:
        return [ProblemGroupBuilder(env_thunk=lambda: TargetTokenEnv(self.renderer),
                                    num_envs=self.group_size, dataset_name="target_tokens")
                for _ in range(self.groups)]

    def __len__(self):
        return self.n_batches


@chz.chz
class TargetTokenDatasetBuilder(RLDatasetBuilder):
    model_name_for_tokenizer: str
    n_batches: int = 20
    groups: int = 4
    group_size: int = 8

    async def __call__(self):
        renderer = renderers.get_renderer("llama3", get_tokenizer(self.model_name_for_tokenizer))
        return TargetTokenDataset(renderer, self.n_batches, self.groups, self.group_size), None


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_rl_loop(stack, mode):
    model_dir, gw = stack
    log_path = os.path.join(make_tmp(prefix="cookbook-rl-"), "log")
    config = rl_train.Config(
        learning_rate=2e-2,
        dataset_builder=TargetTokenDatasetBuilder(model_name_for_tokenizer=model_dir,
                                                  n_batches=20 if mode == "sync" else 30),
        model_name=model_dir, recipe_name="engined_rl", max_tokens=8, log_path=log_path,
        renderer_name="llama3", lora_rank=8,
        loss_fn="importance_sampling" if mode == "sync" else "ppo",
        async_config=(rl_train.AsyncConfig(max_steps_off_policy=1, groups_per_batch=4,
                                           loss_fn="ppo") if mode == "async" else None),
        eval_every=0, save_every=5, ttl_seconds=3600, base_url=gw.url, num_groups_to_log=0)
    asyncio.run(rl_train.main(config))
    rows = metrics(log_path)
    reward = [r["env/all/reward/total"] for r in rows if "env/all/reward/total" in r]
    print("mean reward by iteration (%s):" % mode, " ".join("%.3f" % r for r in reward))
    assert len(reward) >= 16, reward
    first, last = sum(reward[:5]) / 5, sum(reward[-5:]) / 5
    # Seeds 0-3 (COOKBOOK_SEED): sync rises from 0.10-0.15 to 0.54-0.81 in
    # 20 iterations. One step off-policy (ppo on stale samples) rose from
    # 0.11-0.13 to 0.39-0.47 in 30, but once from 0.135 to 0.272 only: which
    # samples are stale depends on when the cookbook's sampling and training
    # tasks interleave (the machine's speed), so async asserts that the
    # reward rises, not by how much.
    assert last > first + (0.2 if mode == "sync" else 0.0), reward
    if mode == "sync":
        kl = [abs(r["optim/kl_sample_train_v1"]) for r in rows if "optim/kl_sample_train_v1" in r]
        assert kl and max(kl) < 1e-5, kl


def test_stop_strings(stack):
    """sampling_params.stop as strings (the cookbook's role_colon renderer
    stops on "\\n\\nUser:"): a completion ends at the token whose text
    completes the first stop string, and is otherwise the same draw as
    without the stop (same seed: the same tokens up to there)."""
    from transformers import AutoTokenizer
    model_dir, gw = stack
    tok = AutoTokenizer.from_pretrained(model_dir)
    with tinker.ServiceClient(base_url=gw.url, api_key=gf.KEY) as sc:
        sampler = sc.create_sampling_client(base_model=model_dir)
        prompt = tinker.ModelInput.from_ints(tok.encode("the cat sees"))
        free = sampler.sample(prompt, 4, tinker.SamplingParams(
            max_tokens=32, seed=5, temperature=1.0, stop=[])).result().sequences
        cut = sampler.sample(prompt, 4, tinker.SamplingParams(
            max_tokens=32, seed=5, temperature=1.0, stop=["e", "zz"])).result().sequences
    stopped = 0
    for f, c in zip(free, cut):
        text = [tok.decode(f.tokens[:n]) for n in range(len(f.tokens) + 1)]
        first = next((n for n, t in enumerate(text) if "e" in t), None)
        if first is None:
            assert c.tokens == f.tokens and c.stop_reason == "length"
        else:
            assert c.tokens == f.tokens[:first] and c.stop_reason == "stop"
            assert c.logprobs == f.logprobs[:first]
            stopped += 1
    assert stopped >= 2, [tok.decode(f.tokens) for f in free]
