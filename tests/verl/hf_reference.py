"""hf_reference.py — what the tests against transformers models share
(test_lora_peft.py, test_moe_transformers.py): a packed batch of random
tokens with a weight per token, and a model's log-probs of it laid out as
engined returns them (target-aligned: entry t is log p(ids[t] | ids[<t])
within its sequence, entry 0 of each sequence 0)."""
import numpy as np
import torch


def batch(seed, lens, vocab):
    """Token ids [sum(lens)] in [0, vocab) and N(0, 1) weights."""
    rng = np.random.default_rng(seed)
    n = sum(lens)
    return (rng.integers(0, vocab, n).astype(np.int32),
            rng.normal(0, 1, n).astype(np.float32))


def torch_logprobs(model, ids, lens):
    """The model's target-aligned log-probs of the packed sequences, one
    forward per sequence, as a (differentiable) float32 tensor."""
    out, off = [], 0
    for n in lens:
        x = torch.as_tensor(ids[off:off + n], dtype=torch.long)[None]
        lp = torch.log_softmax(model(input_ids=x).logits[0].float(), -1)
        out.append(torch.zeros(1))
        out.append(lp[:-1].gather(1, x[0, 1:, None])[:, 0])
        off += n
    return torch.cat(out)
