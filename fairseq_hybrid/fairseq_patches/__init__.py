"""Every change this package makes to fairseq, installed once by
:func:`install` (importing ``fairseq_hybrid`` calls it).

fairseq 0.12 has no hooks for these, so each replaces one fairseq function
with a wrapper around the original; the wrappers live in the modules
named, one idea each:

* ``checkpoint_utils.load_checkpoint_to_cpu``, one composed wrapper:
  torch's safe ``weights_only`` loading kept on with fairseq's classes
  allowlisted and a clear refusal of anything else
  (:mod:`.checkpoint_safety`), then a group's checkpoint made loadable
  where its devices are missing (:mod:`.checkpoint_portability`);
* ``checkpoint_utils.PathManager``: copies to ``checkpoint_last.pt`` and
  the other names made atomic (:mod:`.atomic_checkpoint_copy`);
* ``utils.clip_grad_norm_`` and ``FP16Optimizer.build_optimizer``: correct
  for parameters on several devices (:mod:`.multi_device_optim`);
* ``Trainer.save_checkpoint`` / ``load_checkpoint``: ``--patience``'s count
  kept in checkpoints (:mod:`.patience_state`);
* ``Trainer.__init__``: options a group cannot serve refused before
  training (:mod:`.trainer_checks`);
* ``Trainer._prepare_sample``: a group's batch kept, pinned, on the host
  beside fairseq's copy on ``cuda:0`` (:mod:`.batch_on_host`).
"""

from __future__ import annotations

import functools

import torch

from . import atomic_checkpoint_copy, checkpoint_portability, checkpoint_safety, multi_device_optim, patience_state
from . import batch_on_host, trainer_checks

_installed = False


def install() -> None:
    global _installed
    if _installed:
        return
    from fairseq import checkpoint_utils, utils
    from fairseq.optim.fp16_optimizer import FP16Optimizer
    from fairseq.trainer import Trainer

    torch.serialization.add_safe_globals(checkpoint_safety.allowed_globals())
    original_load = checkpoint_utils.load_checkpoint_to_cpu
    safe_load = checkpoint_safety.refusing_unsafe(original_load)

    @functools.wraps(original_load)
    def load_checkpoint_to_cpu(path, *args, **kwargs):
        return checkpoint_portability.make_portable(safe_load(path, *args, **kwargs))

    checkpoint_utils.load_checkpoint_to_cpu = load_checkpoint_to_cpu
    checkpoint_utils.PathManager = atomic_checkpoint_copy.AtomicCopyPathManager(checkpoint_utils.PathManager)

    utils.clip_grad_norm_ = multi_device_optim.multi_device_clip_grad_norm(utils.clip_grad_norm_)
    FP16Optimizer.build_optimizer = multi_device_optim.multi_device_fp16_build(FP16Optimizer.build_optimizer.__func__)

    Trainer.save_checkpoint = patience_state.saving_patience(Trainer.save_checkpoint)
    Trainer.load_checkpoint = patience_state.loading_patience(Trainer.load_checkpoint)
    Trainer.__init__ = trainer_checks.checking_init(Trainer.__init__)
    Trainer._prepare_sample = batch_on_host.keeping_host_batch(Trainer._prepare_sample)
    _installed = True
