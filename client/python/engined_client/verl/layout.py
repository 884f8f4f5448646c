"""layout.py — verl's TensorDict batches in engined's packed layout and
back: the one place for the alignment rules.

verl's engines take a batch in NO_PADDING mode (verl.workers.utils.padding.
left_right_2_no_padding): `input_ids`, `position_ids` and `loss_mask` are
jagged nested tensors [bsz, j] (each sequence's prompt then response,
without padding); the rollout fields (`response_mask`, `old_log_probs`,
`advantages`, `ref_log_prob`, `rollout_is_weights`, `values`, `returns`)
are [bsz, max_response_len], right-padded (or nested), and `prompts` /
`responses` (nested) or `attention_mask` (padded) give each sequence's
prompt and response lengths.

Alignment. verl's per-token model outputs are indexed by the position that
predicts: entry k of a sequence is log p(token k+1 | tokens <= k) (labels
rolled by -1, verl's `input_ids_rmpad_rolled`), its entropy is that
position's, and its value is V(h_k); the last entry of a sequence predicts
nothing real (verl rolls the next sequence's first token into it). engined
is target-aligned: entry t is about token t predicted from tokens < t, and
entry 0 has no prediction. So verl[k] = engined[k + 1] inside a sequence,
and verl's last entry, which engined has no value for, is 0 here with no
gradient. Response token j of a sequence with prompt length p is engined's
entry p + j (verl's no_padding_2_padding takes verl's entries p - 1 + j).

A loss mask over whole sequences (sft_loss's `loss_mask`, which verl rolls
by -1 to weight token k + 1 at entry k) is engined's mask as it is, except
that each sequence's first token is never a target (verl would weight the
cross-sequence entry); a mask over responses goes to their entries.
"""
from dataclasses import dataclass

import numpy as np
import torch


def padded(x, fill=0.0):
    """A nested tensor as a right-padded dense one; a dense one as it is."""
    if isinstance(x, torch.Tensor) and x.is_nested:
        return torch.nested.to_padded_tensor(x, fill)
    return x


def _lengths(t):
    return t.offsets().diff() if t.is_nested else None


@dataclass
class Packed:
    """A batch as engined takes it: input_ids int32 [N], seq_lens [bsz];
    offsets [bsz + 1] (int64) where each sequence starts; and, when the
    batch has prompts and responses, resp_index [bsz, R] (engined's entry
    of response token j of sequence i) and resp_valid [bsz, R]."""
    input_ids: np.ndarray
    seq_lens: list
    offsets: np.ndarray
    resp_index: np.ndarray = None
    resp_valid: np.ndarray = None

    @property
    def num_tokens(self):
        return int(self.offsets[-1])

    # --- engined's per-token arrays as verl's -----------------------------

    def shift_to_verl(self, x):
        """engined's [N] array (target-aligned) as verl's flat float32 [N]
        one (prediction-aligned; each sequence's last entry 0)."""
        x = np.asarray(x, dtype=np.float32).reshape(-1)
        y = np.zeros_like(x)
        y[:-1] = x[1:]
        y[self.offsets[1:] - 1] = 0.0
        return y

    def nested(self, flat):
        """A flat [N] torch tensor as a jagged nested tensor of this batch
        (a view: gradients reach flat)."""
        return torch.nested.nested_tensor_from_jagged(
            flat, offsets=torch.from_numpy(self.offsets.astype(np.int64)))

    def routes(self, routed):
        """verl's routed_experts (nested [bsz, j, layers, k], or flat [N,
        layers, k]) as engined's int32 [N, layers, k]. A sequence with one
        row fewer than its tokens (a rollout's: the last token routes
        nothing it generates) gets a last row of experts 0..k-1, which
        only that token's own unused prediction reads."""
        if isinstance(routed, torch.Tensor) and routed.is_nested:
            parts = [p.detach().cpu().numpy() for p in routed.unbind()]
        else:
            flat = np.asarray(routed.detach().cpu().numpy() if isinstance(routed, torch.Tensor)
                              else routed)
            parts = np.split(flat, self.offsets[1:-1])
        if len(parts) != len(self.seq_lens):
            raise ValueError(f"routed_experts: {len(parts)} sequences for "
                             f"{len(self.seq_lens)}")
        out = []
        for i, (p, n) in enumerate(zip(parts, self.seq_lens)):
            if p.ndim != 3:
                raise ValueError(f"routed_experts: sequence {i} of shape {p.shape}, "
                                 "expected [tokens, layers, experts_per_tok]")
            if p.shape[0] == n - 1:
                last = np.broadcast_to(np.arange(p.shape[2]), (1,) + p.shape[1:])
                p = np.concatenate([p, last.astype(p.dtype)])
            if p.shape[0] != n:
                raise ValueError(f"routed_experts: sequence {i} has {p.shape[0]} rows for "
                                 f"{n} tokens")
            out.append(p.astype(np.int32))
        return np.concatenate(out)

    def grad_from_verl(self, g):
        """The gradient of verl's prediction-aligned [N] entries as
        engined's target-aligned one (the transpose of shift_to_verl)."""
        g = np.asarray(g, dtype=np.float32).reshape(-1)
        out = np.zeros_like(g)
        out[1:] = g[:-1]
        out[self.offsets[:-1]] = 0.0
        return out

    # --- response-space arrays ---------------------------------------------

    def _need_responses(self):
        if self.resp_index is None:
            raise ValueError("this batch has no prompts/responses: the loss needs them "
                             "(verl's left_right_2_no_padding layout)")

    def response_to_tokens(self, x):
        """A [bsz, R] (padded or nested) response-space tensor as engined's
        float32 [N] array (0 outside the responses)."""
        self._need_responses()
        x = padded(x).detach().to(torch.float64).cpu().numpy()
        r = self.resp_index.shape[1]
        if x.shape[0] != self.resp_index.shape[0] or x.shape[1] < r:
            raise ValueError(f"response tensor of shape {tuple(x.shape)} for "
                             f"{self.resp_index.shape[0]} sequences of up to {r} "
                             "response tokens")
        out = np.zeros(self.num_tokens, dtype=np.float32)
        out[self.resp_index[self.resp_valid]] = x[:, :r][self.resp_valid]
        return out

    def sequence_mask(self, loss_mask):
        """A mask over whole sequences (jagged [bsz, j] or flat [N]) as
        engined's loss_mask: the same, each sequence's first token 0."""
        m = loss_mask.values() if loss_mask.is_nested else loss_mask.reshape(-1)
        m = m.detach().to(torch.float32).cpu().numpy().copy()
        if m.shape[0] != self.num_tokens:
            raise ValueError(f"loss_mask has {m.shape[0]} entries for {self.num_tokens} tokens")
        m[self.offsets[:-1]] = 0.0
        return m


def pack(data):
    """The Packed layout of a verl TensorDict batch in NO_PADDING mode."""
    ids = data["input_ids"]
    if not (isinstance(ids, torch.Tensor) and ids.is_nested):
        raise ValueError("input_ids: a jagged nested tensor (verl's NO_PADDING batches: "
                         "verl.workers.utils.padding.left_right_2_no_padding)")
    offsets = ids.offsets().to(torch.int64).cpu().numpy()
    seq_lens = np.diff(offsets)
    if (seq_lens <= 0).any():
        raise ValueError("input_ids: an empty sequence")
    p = Packed(ids.values().to(torch.int32).cpu().numpy(), [int(s) for s in seq_lens], offsets)
    if "prompts" in data.keys() and "responses" in data.keys():
        p.resp_index, p.resp_valid = _responses(data, offsets, seq_lens)
    return p


def _responses(data, offsets, seq_lens):
    """verl's no_padding_2_padding rules for each sequence's prompt and
    response lengths; returns (resp_index, resp_valid)."""
    prompts, responses = data["prompts"], data["responses"]
    if prompts.is_nested:
        plen, rlen = _lengths(prompts), _lengths(responses)
        width = int(rlen.max()) if len(rlen) else 0
    else:
        am = data["attention_mask"]
        plen = am[:, :prompts.shape[1]].sum(dim=1)
        rlen = am[:, prompts.shape[1]:].sum(dim=1)
        width = responses.shape[1]
    plen = plen.to(torch.int64).cpu().numpy()
    rlen = rlen.to(torch.int64).cpu().numpy()
    if not np.array_equal(plen + rlen, seq_lens):
        raise ValueError("prompts + responses do not add up to each sequence's input_ids")
    if (plen <= 0).any():
        raise ValueError("a sequence without a prompt token (verl's layout needs one)")
    j = np.arange(width)
    valid = j[None, :] < rlen[:, None]
    index = offsets[:-1, None] + plen[:, None] + j[None, :]
    index = np.where(valid, index, 0)
    return index, valid
