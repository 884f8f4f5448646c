"""custom.py — a loss the controller writes in torch, trained exactly.

forward_backward_custom runs a forward-only call for the model's per-token
outputs (log-probs and entropy of a language model, values of a value
model), evaluates loss_fn on them with torch autograd on the client, and
sends the gradients dL/d(output) back as the server's "custom" loss: the
engine backpropagates exactly those gradients into the weights, so any loss
that is a function of those outputs trains as if the server computed it.
Needs torch on the client."""
import numpy as np

_OUTPUTS = {"language_model": ("log_probs", "entropy"), "value_model": ("values",)}
_GRAD_FIELD = {"log_probs": "grad_log_probs", "entropy": "grad_entropy",
               "values": "grad_values"}


def forward_backward_custom(client, input_ids, seq_lens, loss_fn, *, model_type="language_model",
                            temperature=1.0, target_ids=None, max_tokens_per_micro_batch=0,
                            reduce_gradients=False, timeout=None, request_id=None):
    """loss_fn(outputs) -> a 0-dim torch tensor, where outputs maps
    "log_probs" and "entropy" (language model) or "values" (value model)
    to float64 [N] tensors (target-aligned, engine order). Returns
    (loss value, the training call's result). The gradients accumulate like
    any ForwardBackward's until OptimizerStep; reduce_gradients is the
    training call's (forward_backward's)."""
    import torch

    names = _OUTPUTS[model_type]
    fwd = client.forward_backward(
        input_ids, seq_lens, forward_only=True, temperature=temperature,
        target_ids=target_ids, max_tokens_per_micro_batch=max_tokens_per_micro_batch,
        return_log_probs="log_probs" in names, return_entropy="entropy" in names,
        return_values="values" in names, timeout=timeout)
    outputs = {k: torch.tensor(np.asarray(fwd[k], dtype=np.float64), requires_grad=True)
               for k in names}
    loss = loss_fn(outputs)
    loss.backward()
    grads = {_GRAD_FIELD[k]: t.grad.detach().numpy().astype(np.float32)
             for k, t in outputs.items() if t.grad is not None}
    res = client.forward_backward(
        input_ids, seq_lens, loss="custom", temperature=temperature, target_ids=target_ids,
        max_tokens_per_micro_batch=max_tokens_per_micro_batch,
        reduce_gradients=reduce_gradients, timeout=timeout, request_id=request_id, **grads)
    return float(loss.detach()), res
