"""fairseq's optimizer wrappers made correct for parameters on several devices.

A hybrid group keeps each layer on its own device, so the optimizer sees
parameters (and gradients) on K devices.  Two places in fairseq 0.12.3.1
assume one device:

* ``fairseq.utils.clip_grad_norm_`` (every recipe's ``--clip-norm``)
  computes the total norm on one device, then multiplies every gradient
  by that 0-dim tensor with a single ``torch._foreach_mul_``; on CUDA a
  gradient on another device than the coefficient raises.  Here the total
  norm is computed exactly as fairseq computes it (the per-gradient norms,
  in the same order, stacked on one device), and the coefficient is moved
  to each device for the multiplication, as PyTorch's own
  ``torch.nn.utils.clip_grad_norm_`` does; with one device the original
  runs unchanged.
* ``FP16Optimizer`` (``--fp16``) flattens by default: ``build_fp32_params``
  copies all parameters into one fp32 buffer on
  ``torch.cuda.current_device()``, but ``_sync_fp16_grads_to_fp32`` and
  ``_sync_fp32_params_to_fp16`` copy only the parameters whose
  ``device.index`` is that device, with offsets from 0: parameters on the
  other devices would never be updated.  Its per-parameter path
  (``--fp16-no-flatten-grads``, also what ``--bf16`` uses) keeps each fp32
  copy beside its parameter and is correct on any number of devices; when
  the parameters span several devices it is taken here, with a log line.

``--memory-efficient-fp16`` and ``--amp`` need nothing beyond the clipping:
they scale gradients with ``FairseqOptimizer.multiply_grads``, which
already moves the factor to each gradient's device, and ``--amp``'s
``torch.amp.GradScaler`` handles several devices itself
(``_MultiDeviceReplicator`` in ``torch/amp/grad_scaler.py``).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Callable, List

import torch

logger = logging.getLogger(__name__)

def _devices(tensors) -> List[torch.device]:
    return list(OrderedDict.fromkeys(t.device for t in tensors))


def multi_device_clip_grad_norm(single_device_clip: Callable) -> Callable:
    """fairseq's ``utils.clip_grad_norm_`` (``single_device_clip``), kept
    for gradients on one device, and correct for gradients on several."""

    @torch.no_grad()
    def clip_grad_norm_(params, max_norm, aggregate_norm_fn=None) -> torch.Tensor:
        if isinstance(params, torch.Tensor):
            params = [params]
        params = list(params)
        with_grads = [p for p in params if p is not None and getattr(p, "grad", None) is not None]
        if len(_devices(p.grad for p in with_grads)) <= 1:
            return single_device_clip(params, max_norm, aggregate_norm_fn)
        grads = [p.grad.detach() for p in with_grads if not hasattr(p, "expert")]
        expert_grads = [p.grad.detach() for p in with_grads if hasattr(p, "expert")]
        device = grads[0].device if grads else expert_grads[0].device
        total_norm = torch.norm(torch.stack([torch.norm(g, p=2, dtype=torch.float32).to(device) for g in grads]))
        if aggregate_norm_fn is not None:
            total_norm = aggregate_norm_fn(total_norm)
        if max_norm > 0:
            clip_coef = (float(max_norm) / (total_norm + 1e-6)).clamp_(max=1)
            everything = grads + expert_grads
            for where in _devices(everything):
                torch._foreach_mul_([g for g in everything if g.device == where], clip_coef.to(where))
        return total_norm

    return clip_grad_norm_


def multi_device_fp16_build(single_device_build: Callable) -> classmethod:
    """``FP16Optimizer.build_optimizer`` (its function,
    ``single_device_build``) taking the per-parameter path when the
    parameters span several devices."""
    from fairseq import optim

    def build_optimizer(cls, cfg, params, **kwargs):
        params = list(params)
        flatten = not getattr(cfg.common, "fp16_no_flatten_grads", False) and not getattr(cfg.common, "bf16", False)
        devices = _devices(params)
        if not flatten or len(devices) <= 1:
            return single_device_build(cls, cfg, params, **kwargs)
        logger.info("--fp16: the parameters live on %d devices (%s), so each keeps its fp32 copy on its own device "
                    "(as with --fp16-no-flatten-grads): fairseq's flat buffer holds one device's parameters only",
                    len(devices), ", ".join(str(d) for d in devices))
        fp32_params = cls.build_fp32_params(cfg.optimizer, params, flatten=False)
        fp32_optimizer = optim.build_optimizer(cfg.optimizer, fp32_params)
        return cls(cfg, params, fp32_optimizer, fp32_params, **kwargs)

    return classmethod(build_optimizer)
