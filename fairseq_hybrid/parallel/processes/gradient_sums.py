"""The stages' gradient parts of each parameter, added in one fixed order
as soon as that order allows, while the other stages still run backward.

A stage hands over a replicated part's gradients (the attention-softmax's,
on a replica or on its master) as soon as its last cell on the part has
run backward, at most once a pass, and the rest with its backward reply.
The parts of a parameter are added in the order: every stage's hand-over
in the middle of its pass, in stage order, then every stage's reply, in
stage order; each the moment every part before it in that order is in or
known to be absent (its stage handed that parameter over already, or ended
its pass).  So the sum is the same, bit for bit, whatever order the
messages arrive in.  A parameter that only one part filled gets that
stage's buffer itself as its gradient (lent until the stage's next
backward pass), with no copy.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Set, Tuple

import torch
from torch import Tensor


class StageOrderSums:
    """One backward pass's gradient sums over ``stages`` stages."""

    def __init__(self, params: Sequence[Tensor], stages: int, kept: Dict[int, Tensor]):
        """``kept``: sum tensors kept from step to step, by parameter
        position (filled in here as needed)."""
        self.params, self.stages, self.kept = params, stages, kept
        # the order of the parts: (stage, handed over mid-pass), the mid-pass ones first
        self.slots: List[Tuple[int, bool]] = [(stage, True) for stage in range(stages)] + [
            (stage, False) for stage in range(stages)]
        self.parts: Dict[int, Dict[Tuple[int, bool], Tensor]] = {}  # position -> slot -> part not yet added
        self.cursor: Dict[int, int] = {}  # position -> the first slot not yet added or skipped
        self.first: Dict[int, Tensor] = {}  # position -> its only part so far (lent if it stays alone)
        self.total: Dict[int, Tensor] = {}  # position -> the running sum
        self.ended: Set[int] = set()
        self.added_early = 0  # parts added while some stage still ran its backward pass

    def offer(self, stage: int, positions: Sequence[int], parts: Sequence[Tensor], mid_pass: bool) -> None:
        """``stage``'s parts of the parameters at ``positions``, handed
        over in the middle of its pass or with its reply."""
        for position, part in zip(positions, parts):
            slots = self.parts.setdefault(position, {})
            if (stage, mid_pass) in slots or (mid_pass and self._closed(position, (stage, True))):
                raise ValueError(f"stage {stage} handed over parameter {position} twice in one pass")
            slots[stage, mid_pass] = part
            self._advance(position)

    def end(self, stage: int) -> None:
        """``stage`` has ended its backward pass: it hands over nothing more."""
        self.ended.add(stage)
        for position in list(self.parts):
            self._advance(position)

    def _closed(self, position: int, slot: Tuple[int, bool]) -> bool:
        return self.cursor.get(position, 0) > self.slots.index(slot)

    def _advance(self, position: int) -> None:
        waiting = self.parts[position]
        cursor = self.cursor.get(position, 0)
        while cursor < len(self.slots):
            slot = self.slots[cursor]
            if slot in waiting:
                self._add(position, waiting.pop(slot))
            elif slot[0] not in self.ended:
                break
            cursor += 1
        self.cursor[position] = cursor

    def _add(self, position: int, part: Tensor) -> None:
        param = self.params[position]
        early = len(self.ended) < self.stages
        if param.grad is not None and position not in self.total:  # a second backward before the optimizer's step
            self.total[position] = param.grad
        if position in self.total:
            self.total[position].add_(part.to(param.device))
            self.added_early += early
            return
        if position not in self.first:
            self.first[position] = part
            return
        first = self.first.pop(position)
        total = self.kept.get(position)
        if total is None or total.shape != param.shape or total.dtype != param.dtype:
            total = self.kept[position] = torch.empty_like(param)
        if first.device == param.device and part.device == param.device:
            torch.add(first, part, out=total)  # one pass over the memory, not two
        else:
            total.copy_(first)
            total.add_(part.to(param.device))
        self.total[position] = total
        self.added_early += early

    def into_params(self) -> Dict[int, Tensor]:
        """Every stage has ended: the sums become the parameters'
        gradients; the tensors lent (a stage's buffer, or a kept sum), by
        position."""
        if len(self.ended) < self.stages or any(self.parts.values()):
            raise ValueError("gradients asked for before every stage ended its backward pass")
        lent: Dict[int, Tensor] = {}
        for position, first in self.first.items():
            param = self.params[position]
            if first.device == param.device:
                param.grad = lent[position] = first
            else:
                total = self.kept.get(position)
                if total is None or total.shape != param.shape or total.dtype != param.dtype:
                    total = self.kept[position] = torch.empty_like(param)
                param.grad = lent[position] = total.copy_(first)
        for position, total in self.total.items():
            param = self.params[position]
            if param.grad is not total:
                param.grad = lent[position] = total
        return lent
