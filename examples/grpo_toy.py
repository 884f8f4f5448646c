"""grpo_toy.py — a complete GRPO loop against engined, small enough to read.

The task (synthetic, with a programmatic reward): each prompt is a few
random tokens; the policy answers with RESPONSE_LEN tokens, and the reward
is the fraction of them that are "good" tokens (ids divisible by GOOD_MOD,
so 1 in 8 of the vocabulary: about 0.125 for a random policy, 1.0 at best).

One iteration is what an RL controller (verl, OpenRLHF) does each step:

  1. weight sync: the engine's weights are streamed (stream_weights, Hugging
     Face names) into the rollout worker;
  2. rollout: the worker samples GROUP responses per prompt (temperature 1);
  3. reward, and group-normalized advantages (GRPO): per prompt,
     (reward - group mean) / (group std + 1e-6), the same for every token of
     the response;
  4. old log-probs: a forward-only call gives the engine's own log-probs of
     the samples, the exact old_log_probs of on-policy GRPO (the worker's
     sampling log-probs must agree with them; the largest difference is
     printed as a check of the weight sync: a few 1e-6 in float32);
  5. PPO_EPOCHS passes of the server-side "ppo" loss (vanilla, clip 0.2,
     token-mean) over the batch, each followed by an AdamW step: the first
     pass is at ratio 1, the second is clipped where the first moved a
     token's probability by more than 20%.

The rollout worker is a stand-in: a transformers LlamaForCausalLM built
from the same config as the engine, sampling with torch. A real one (vLLM,
SGLang) would take the same (name, tensor) pairs through its
load_weights() and serve the rollouts; the training side stays as it is.

Run (from a built tree; examples/README.md has the details):

    build/venv-verl/bin/python examples/grpo_toy.py [--out grpo_toy.png]
    build/venv-verl/bin/python examples/grpo_toy.py --target 127.0.0.1:50051

Without --target it starts its own daemon (--engined, default
build/daemon/engined) on a unix socket in a temporary directory. It prints
one line per iteration, writes the reward and loss curves to --out, and
ends with "reward rose from X to Y" (the means of the first and last five
iterations); --check exits 1 unless Y - X exceeds CHECK_MARGIN.
Needs torch, transformers, matplotlib, numpy and engined_client.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
try:
    from engined_client import EngineClient
except ImportError:  # a source tree: the package and the build's stubs
    sys.path[:0] = [os.path.join(REPO, "client/python"),
                    os.path.join(REPO, "build/client/python")]
    from engined_client import EngineClient

# The engine's model: daemon/presets.c's "tiny" (~0.9M parameters). The
# engine is initialized from this config and the rollout worker built from
# it, so the two are the same model by construction.
CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "vocab_size": 1024, "hidden_size": 128, "intermediate_size": 384,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
    "tie_word_embeddings": True, "initializer_range": 0.02, "torch_dtype": "float32",
}

PROMPTS = 8          # prompts per batch
GROUP = 8            # responses per prompt (the GRPO group)
PROMPT_LEN = 6
RESPONSE_LEN = 10
GOOD_MOD = 8         # good tokens: ids divisible by 8
PPO_EPOCHS = 2
LR = 3e-3
PPO = {"policy_loss": "vanilla", "clip_ratio": 0.2, "loss_agg_mode": "token-mean"}
CHECK_MARGIN = 0.5   # --check: last-5 mean reward minus first-5 mean (seeds 0-9 rose by 0.84-0.86)


def reward(responses):
    """[n, RESPONSE_LEN] token ids -> [n] rewards in [0, 1]."""
    return (responses % GOOD_MOD == 0).mean(axis=1)


def group_advantages(rewards):
    """GRPO: normalize each prompt's GROUP rewards (consecutive entries);
    std is torch.std's (unbiased), as verl's compute_grpo_outcome_advantage."""
    r = rewards.reshape(-1, GROUP)
    adv = (r - r.mean(axis=1, keepdims=True)) / (r.std(axis=1, ddof=1, keepdims=True) + 1e-6)
    return adv.reshape(-1)


class RolloutWorker:
    """Stand-in for vLLM / SGLang: a transformers model that takes the
    engine's weights and samples with its own seeded generator."""

    def __init__(self, config, seed):
        from transformers import LlamaConfig, LlamaForCausalLM
        cfg = {k: v for k, v in config.items() if k not in ("architectures", "torch_dtype")}
        self.model = LlamaForCausalLM(LlamaConfig(**cfg)).eval()
        self.tied = config["tie_word_embeddings"]
        self.gen = torch.Generator().manual_seed(seed)

    def load_weights(self, named_arrays):
        """(HF name, numpy array) pairs, all of the model's parameters."""
        sd = {name: torch.from_numpy(a) for name, a in named_arrays}
        if self.tied:  # the engine streams the embedding once
            sd.setdefault("lm_head.weight", sd["model.embed_tokens.weight"])
        self.model.load_state_dict(sd, strict=True)

    @torch.no_grad()
    def generate(self, prompts, n_new):
        """prompts: [n, P] int64. Returns the [n, n_new] sampled tokens and
        their sampling log-probs [n, n_new] (temperature 1)."""
        out = self.model(input_ids=prompts, use_cache=True)
        tokens, logps = [], []
        for _ in range(n_new):
            logp = torch.log_softmax(out.logits[:, -1].float(), dim=-1)
            tok = torch.multinomial(logp.exp(), 1, generator=self.gen)
            tokens.append(tok)
            logps.append(logp.gather(1, tok))
            out = self.model(input_ids=tok, past_key_values=out.past_key_values, use_cache=True)
        return torch.cat(tokens, 1), torch.cat(logps, 1)


def start_daemon(binary, tmp):
    """engined on a unix socket in tmp (checkpoint/model roots there too);
    returns (process, address) once it answers Health."""
    sock = "unix:" + os.path.join(tmp, "engined.sock")
    with open(os.path.join(tmp, "engined.log"), "wb") as log:
        proc = subprocess.Popen(
            [binary, "--listen", sock, "--checkpoint-root", os.path.join(tmp, "checkpoints"),
             "--model-root", os.path.join(tmp, "models"),
             "--dist-store-root", os.path.join(tmp, "dist"), "--log-level", "warn"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    with EngineClient(sock) as c:
        deadline = time.time() + 30
        while True:
            try:
                if c.health(timeout=1) == "SERVING":
                    return proc, sock
            except Exception:
                pass
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                proc.wait()
                sys.exit("engined did not start:\n" +
                         open(os.path.join(tmp, "engined.log")).read())
            time.sleep(0.05)


def pack(prompts, responses):
    """Whole sequences, packed: input_ids [n*L], seq_lens, and the loss
    mask (1 on response tokens; entry t is token t predicted from < t)."""
    seqs = np.concatenate([prompts, responses], axis=1).astype(np.int32)
    n, L = seqs.shape
    mask = np.zeros((n, L), np.float32)
    mask[:, PROMPT_LEN:] = 1
    return seqs.reshape(-1), [L] * n, mask.reshape(-1)


def train(client, args):
    client.initialize(replace=True, hf_config_json=CONFIG, seed=args.seed,
                      optimizer={"lr": LR, "weight_decay": 0.0, "clip_grad": 1.0})
    client.set_mode("train")
    worker = RolloutWorker(CONFIG, args.seed)
    rng = np.random.default_rng(args.seed)
    history = {"reward": [], "loss": []}
    sync_diff = 0.0
    for it in range(1, args.iterations + 1):
        worker.load_weights(client.stream_weights())                      # 1
        prompts = rng.integers(0, CONFIG["vocab_size"], (PROMPTS, PROMPT_LEN))
        prompts = torch.from_numpy(prompts).repeat_interleave(GROUP, 0)
        responses, sample_logp = worker.generate(prompts, RESPONSE_LEN)   # 2
        rewards = reward(responses.numpy())                               # 3
        adv = np.zeros((len(rewards), PROMPT_LEN + RESPONSE_LEN), np.float32)
        adv[:, PROMPT_LEN:] = group_advantages(rewards)[:, None]
        ids, lens, mask = pack(prompts.numpy(), responses.numpy())
        old = client.forward_backward(ids, lens, forward_only=True,       # 4
                                      return_log_probs=True).log_probs
        engine_logp = old.reshape(len(lens), -1)[:, PROMPT_LEN:]
        diff = float(np.max(np.abs(engine_logp - sample_logp.numpy())))
        sync_diff = max(sync_diff, diff)
        for _ in range(PPO_EPOCHS):                                       # 5
            fb = client.forward_backward(ids, lens, loss="ppo", loss_options=PPO,
                                         loss_mask=mask, old_log_probs=old,
                                         advantages=adv.reshape(-1))
            step = client.optimizer_step()
        history["reward"].append(float(rewards.mean()))
        history["loss"].append(fb.loss)
        print("iter %3d  reward %.3f  loss %+.4f  grad_norm %.4f  clipfrac %.3f  "
              "sync |dlogp| %.1e" % (it, rewards.mean(), fb.loss, step.grad_norm,
                                     fb.metrics.get("pg_clipfrac", 0.0), diff), flush=True)
    return history, sync_diff


def plot(history, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax_r, ax_l) = plt.subplots(1, 2, figsize=(10, 3.8))
    x = np.arange(1, len(history["reward"]) + 1)
    ax_r.plot(x, history["reward"], marker="o", ms=3)
    ax_r.axhline(1 / GOOD_MOD, color="gray", ls=":", label="random policy")
    ax_r.set(title="mean reward", xlabel="iteration", ylim=(0, 1.05))
    ax_r.legend(loc="lower right")
    ax_l.plot(x, history["loss"], marker="o", ms=3, color="C1")
    ax_l.set(title="PPO loss (last epoch)", xlabel="iteration")
    fig.suptitle("GRPO on engined (tiny preset)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", help="address of a running daemon (default: start one)")
    p.add_argument("--engined", default=os.path.join(REPO, "build/daemon/engined"),
                   help="daemon binary to start when no --target")
    p.add_argument("--iterations", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="grpo_toy.png", help="PNG of the curves")
    p.add_argument("--check", action="store_true",
                   help="exit 1 unless the reward rose by more than %.2f" % CHECK_MARGIN)
    args = p.parse_args()
    # The worker's model is tiny: one thread samples fastest and leaves the
    # other CPUs to the daemon (two threads were 2.5x slower on a busy 2-core host).
    torch.set_num_threads(1)

    t0 = time.time()
    tmp = proc = None
    if not args.target and not os.access(args.engined, os.X_OK):
        sys.exit("no daemon binary at %s: build it, or pass --engined or --target"
                 % args.engined)
    try:
        if args.target:
            target = args.target
        else:
            tmp = tempfile.mkdtemp(prefix="grpo-toy-")
            proc, target = start_daemon(args.engined, tmp)
        with EngineClient(target) as client:
            history, sync_diff = train(client, args)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    plot(history, args.out)

    first = float(np.mean(history["reward"][:5]))
    last = float(np.mean(history["reward"][-5:]))
    print("weight sync: max |rollout log-prob - engine log-prob| = %.2e" % sync_diff)
    print("wrote %s (%.1f s)" % (args.out, time.time() - t0))
    print("reward rose from %.3f to %.3f" % (first, last) if last > first else
          "reward did not rise: %.3f to %.3f" % (first, last))
    if args.check and not last - first > CHECK_MARGIN:
        sys.exit("check failed: the reward rose by %.3f, not more than %.2f"
                 % (last - first, CHECK_MARGIN))


if __name__ == "__main__":
    main()
