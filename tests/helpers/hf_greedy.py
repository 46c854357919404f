"""transformers' own greedy continuation of prompts, the oracle of the tests that run an
imported checkpoint over party processes (GPT-2, LLaMA): imported by them after their
``pytest.importorskip("torch")``."""
import numpy as np


def reference(model, prompts, n):
    """transformers' greedy continuation: tokens (B, n) and float64 logits (B, n, V) of
    every step, token by token with the whole sequence (no cache of ours)."""
    import torch
    m = model.double()
    seq, logits = torch.tensor(prompts), []
    with torch.no_grad():
        for _ in range(n):
            step = m(input_ids=seq).logits[:, -1]
            logits.append(step.numpy())
            seq = torch.cat([seq, step.argmax(-1)[:, None]], dim=1)
    model.float()
    return seq[:, len(prompts[0]):].numpy(), np.stack(logits, axis=1)
