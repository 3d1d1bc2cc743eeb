"""Gradient bytes by device: what an all-reduce moves, and what each
device of a group owns where ``HybridGroup.place`` puts it (what its twin
in another group reduces with it under DDP; what a stage in a process of
its own copies to the trainer at the end of its backward pass)."""

from __future__ import annotations

from typing import List


def gradient_bytes(module) -> float:
    """Bytes of ``module``'s gradients in fp32: what an all-reduce moves."""
    return 4.0 * sum(p.numel() for p in module.parameters())


def plan_owned_bytes(model, plan, attention_softmax: bool = True) -> List[float]:
    """Gradient bytes (fp32) of the parameters each device of ``plan``
    owns; ``attention_softmax=False`` leaves that part out (a stage hands
    its gradients over in the middle of its backward pass)."""
    encoder, decoder = model.encoder.stack, model.decoder.stack
    owned = [0.0] * plan.size

    def add(module, worker):
        owned[worker] += gradient_bytes(module)

    add(encoder.embed_tokens, plan.encoder[0])
    for layer, module in enumerate(encoder.layers):
        add(module, plan.encoder[layer])
    add(decoder.embed_tokens, plan.decoder[0])
    for layer, module in enumerate(decoder.layers):
        for part in (module, decoder.bridges_h[layer], decoder.bridges_c[layer]):
            add(part, plan.decoder[layer])
    if attention_softmax:
        add(model.decoder.attention_softmax, plan.decoder[0])
    return owned
