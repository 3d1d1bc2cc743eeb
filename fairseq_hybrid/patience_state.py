"""``--patience`` that survives a restart.

fairseq counts validations without improvement in attributes of
``fairseq_cli.train.should_stop_early`` (``best``, ``num_runs``) and never
saves them (fairseq issue 3531): a run killed and restarted starts counting
from zero and trains past the point where the uninterrupted run stopped.
Here the count is written into every checkpoint's ``extra_state`` and read
back when training resumes from it (not with ``--reset-optimizer`` or
``--reset-meters``, as fairseq treats its own best score).
"""

from __future__ import annotations

import sys

KEY = "patience"

_installed = False


def _counter():
    train = sys.modules.get("fairseq_cli.train")
    return getattr(train, "should_stop_early", None)


def install() -> None:
    global _installed
    if _installed:
        return
    from fairseq.trainer import Trainer

    original_save, original_load = Trainer.save_checkpoint, Trainer.load_checkpoint

    def save_checkpoint(self, filename, extra_state):
        counter = _counter()
        if counter is not None and getattr(counter, "best", None) is not None:
            extra_state = dict(extra_state, **{KEY: {"best": counter.best, "num_runs": counter.num_runs}})
        return original_save(self, filename, extra_state)

    def load_checkpoint(self, filename, reset_optimizer=False, reset_lr_scheduler=False, optimizer_overrides=None,
                        reset_meters=False, *args, **kwargs):
        extra_state = original_load(self, filename, reset_optimizer, reset_lr_scheduler, optimizer_overrides,
                                    reset_meters, *args, **kwargs)
        counter = _counter()
        if extra_state and KEY in extra_state and counter is not None and not reset_optimizer and not reset_meters:
            counter.best = extra_state[KEY]["best"]
            counter.num_runs = extra_state[KEY]["num_runs"]
        return extra_state

    Trainer.save_checkpoint, Trainer.load_checkpoint = save_checkpoint, load_checkpoint
    _installed = True
