"""What a fairseq-train run's ``train.log`` says about its validations:
the loss (and BLEU, where the run validated with ``--eval-bleu``) at each
update, and fairseq's own ``wall`` meter at that point. The recipe's picture
of a run (``recipes/tatoeba_ja_en/plot_curves.py``) reads runs through it.

The log is fairseq-train's output with ``--log-format simple``, appended to
across resumptions; the ``wall`` meter is kept in the checkpoints, so a
resumed run goes on counting from where it stopped."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional

_FIELD = re.compile(r"(\w+)[ =]([-+0-9.eE]+|inf|nan)(?=\s*(?:,|\||$))")


@dataclass
class Curve:
    """The validation points of one run, by update."""

    name: str
    loss: Dict[int, float] = field(default_factory=dict)
    bleu: Dict[int, float] = field(default_factory=dict)
    minutes: Dict[int, float] = field(default_factory=dict)

    @property
    def updates(self) -> List[int]:
        return sorted(self.loss)


def fields(text: str) -> Dict[str, float]:
    """``key=value`` or ``key value`` pairs of a fairseq progress line."""
    return {key: float(value) for key, value in _FIELD.findall(text)}


def read_curve(run: str, name: Optional[str] = None) -> Curve:
    """Parse ``run/train.log``; a later line for the same update (a resumed
    or repeated run) replaces an earlier one."""
    path = os.path.join(run, "train.log")
    curve = Curve(name or os.path.basename(os.path.normpath(run)))
    last_wall = None
    with open(path, encoding="utf-8", errors="replace") as log:
        for line in log:
            if "| train_inner |" in line:
                wall = fields(line.split("| train_inner |", 1)[1]).get("wall")
                if wall is not None:
                    last_wall = wall
            elif "valid on 'valid' subset" in line:
                values = fields(line.split("valid on 'valid' subset", 1)[1])
                update = values.get("num_updates")
                if update is None or "loss" not in values:
                    continue
                update = int(update)
                curve.loss[update] = values["loss"]
                if "bleu" in values:
                    curve.bleu[update] = values["bleu"]
                if last_wall is not None:
                    curve.minutes[update] = last_wall / 60
    if not curve.loss:
        raise ValueError(f"{path}: no validation lines (\"valid on 'valid' subset\") to plot")
    return curve
