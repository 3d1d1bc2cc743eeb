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
from typing import Callable

KEY = "patience"

def _counter():
    train = sys.modules.get("fairseq_cli.train")
    return getattr(train, "should_stop_early", None)


def saving_patience(original_save: Callable) -> Callable:
    """``Trainer.save_checkpoint`` that adds the patience count to
    ``extra_state``."""

    def save_checkpoint(self, filename, extra_state):
        counter = _counter()
        if counter is not None and getattr(counter, "best", None) is not None:
            extra_state = dict(extra_state, **{KEY: {"best": counter.best, "num_runs": counter.num_runs}})
        return original_save(self, filename, extra_state)

    return save_checkpoint


def loading_patience(original_load: Callable) -> Callable:
    """``Trainer.load_checkpoint`` that gives fairseq's counter back the
    saved count."""

    def load_checkpoint(self, filename, reset_optimizer=False, reset_lr_scheduler=False, optimizer_overrides=None,
                        reset_meters=False, *args, **kwargs):
        extra_state = original_load(self, filename, reset_optimizer, reset_lr_scheduler, optimizer_overrides,
                                    reset_meters, *args, **kwargs)
        counter = _counter()
        if extra_state and KEY in extra_state and counter is not None and not reset_optimizer and not reset_meters:
            counter.best = extra_state[KEY]["best"]
            counter.num_runs = extra_state[KEY]["num_runs"]
        return extra_state

    return load_checkpoint
