"""What one rank of an engined group holds, by the daemon's own byte
accounting (GetStatus's Memory; docs/SCALING.md): an operator's
arithmetic for which model fits where, and the tests' reference.

The state is fp32. A group of W ranks cuts the flat parameter table into
W slices of ceil(P / W) floats: dist.zero_stage 1 shards the two AdamW
moments, 2 the gradients too, 3 the parameters too. Stages 2 and 3 add
the part buffers a pass works in: two layers', the embedding's and the
head's gradients (2, 3), and as many weights (3): a layer's collectives
run while the next one computes. Activations come on top (Memory.activation_bytes)."""

__all__ = ["rank_memory", "llama_parts"]


def rank_memory(P, W, stage, layer, embed, head):
    """(param_bytes, grad_bytes, optimizer_bytes, gathered_bytes) of one
    rank: P parameters, W ranks (1: alone), the stage, and the floats of
    the largest layer, the embedding and the head (final norm and LM or
    value head; 0 for a head tied to the embedding but its norm)."""
    S = -(-P // W) if W > 1 else P
    whole = S * W
    params = 4 * (S if stage == 3 and W > 1 else whole)
    grads = 4 * (S if stage >= 2 and W > 1 else whole)
    parts = 0
    if W > 1 and stage >= 2:
        parts += 4 * (2 * layer + embed + head)
    if W > 1 and stage == 3:
        parts += 4 * (2 * layer + embed + head)
    return params, grads, 8 * S, parts


def llama_parts(hidden, intermediate, layers, heads, kv_heads, vocab, head_dim=None,
                qkv_bias=False, qk_norm=False, tied=False):
    """(P, layer, embed, head) in floats of a Llama-family model (the
    parameter table engined builds: Llama, Qwen2 with q/k/v biases, Qwen3
    with q/k norms, Mistral)."""
    D = head_dim or hidden // heads
    q, kv = heads * D, kv_heads * D
    layer = (2 * hidden + hidden * q + 2 * hidden * kv + q * hidden
             + 3 * hidden * intermediate)
    if qkv_bias:
        layer += q + 2 * kv
    if qk_norm:
        layer += 2 * D
    embed = vocab * hidden
    head = hidden + (0 if tied else vocab * hidden)
    return layers * layer + embed + head, layer, embed, head
