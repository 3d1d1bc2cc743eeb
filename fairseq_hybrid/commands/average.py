"""Average the parameters of several checkpoints of one model.

The mean of the last few checkpoints of a run often translates better than
the last one alone; fairseq's ``scripts/average_checkpoints.py`` does this
but is not part of the installed package.  This is the same operation as a
console script (``fairseq-hybrid-average``, or ``python -m
fairseq_hybrid.commands.average``), for ``hybrid_lstm`` and any other fairseq model:

  fairseq-hybrid-average a.pt b.pt c.pt --output averaged.pt
  fairseq-hybrid-average --last 5 CHECKPOINT_DIR --output averaged.pt

``--last N`` takes the N checkpoints with the most updates among
``checkpoint_*_<updates>.pt`` (``--save-interval-updates``), else the N
latest epochs (``checkpoint<epoch>.pt``).  Parameters are averaged in
float64 and stored in their own dtype; everything else (configuration,
training history) comes from the last input, without optimizer state (an
average is for translating, not for resuming).  Checkpoints of different
architectures or parameter shapes are refused, naming what differs.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Dict, List, Sequence

import torch


class AverageError(ValueError):
    """Checkpoints that cannot be averaged."""


def _architecture(state) -> str:
    cfg = state.get("cfg")
    model = cfg.get("model") if cfg is not None else None
    if model is None:
        model = state.get("args")
    if hasattr(model, "get"):
        return str(model.get("_name") or model.get("arch"))
    return str(getattr(model, "_name", None) or getattr(model, "arch", None))


def average_states(paths: Sequence[str]) -> Dict:
    """The averaged checkpoint of ``paths`` (at least one)."""
    if not paths:
        raise AverageError("no checkpoints to average")
    totals: Dict[str, torch.Tensor] = {}
    first_arch = first_shapes = None
    state = None
    for path in paths:
        state = torch.load(path, map_location="cpu", weights_only=True)
        if "model" not in state:
            raise AverageError(f"{path} is not a fairseq checkpoint (it has no 'model' entry)")
        model = state["model"]
        arch = _architecture(state)
        shapes = {name: tuple(value.shape) for name, value in model.items()}
        if first_arch is None:
            first_arch, first_shapes = arch, shapes
        elif arch != first_arch:
            raise AverageError(f"{path} is a {arch} model, {paths[0]} a {first_arch} model: only checkpoints of "
                               "one model can be averaged")
        elif shapes != first_shapes:
            missing = sorted(set(first_shapes) ^ set(shapes))
            differ = sorted(n for n in set(first_shapes) & set(shapes) if first_shapes[n] != shapes[n])
            raise AverageError(f"{path} does not have the parameters of {paths[0]} (" + "; ".join(
                part for part in (f"not in both: {', '.join(missing[:5])}" if missing else "",
                                  f"other shapes: {', '.join(differ[:5])}" if differ else "") if part) + ")")
        for name, value in model.items():
            value = value.to(torch.float64) if value.is_floating_point() else value
            if name not in totals:
                totals[name] = value.clone()
            elif value.is_floating_point():
                totals[name] += value
    averaged = {}
    for name, reference in state["model"].items():
        total = totals[name]
        averaged[name] = (total / len(paths)).to(reference.dtype) if reference.is_floating_point() else reference
    state["model"] = averaged
    state.pop("last_optimizer_state", None)
    return state


def last_checkpoints(directory: str, count: int) -> List[str]:
    """The ``count`` newest checkpoints of a run's checkpoint folder."""
    names = os.listdir(directory)
    by_update = sorted(((int(m.group(1)), n) for n in names for m in [re.fullmatch(r"checkpoint_\d+_(\d+)\.pt", n)]
                        if m), reverse=True)
    by_epoch = sorted(((int(m.group(1)), n) for n in names for m in [re.fullmatch(r"checkpoint(\d+)\.pt", n)] if m),
                      reverse=True)
    chosen = by_update or by_epoch
    if len(chosen) < count:
        raise AverageError(f"{directory} holds {len(chosen)} numbered checkpoint(s), fewer than --last {count}")
    return [os.path.join(directory, name) for _, name in reversed(chosen[:count])]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="fairseq-hybrid-average", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("inputs", nargs="+", help="checkpoints, or with --last one checkpoint folder")
    parser.add_argument("--last", type=int, default=0, help="average the N newest checkpoints of the folder")
    parser.add_argument("--output", required=True)
    args = parser.parse_args(argv)
    try:
        if args.last:
            if len(args.inputs) != 1 or not os.path.isdir(args.inputs[0]):
                raise AverageError("--last N takes one checkpoint folder")
            paths = last_checkpoints(args.inputs[0], args.last)
        else:
            paths = args.inputs
        for path in paths:
            if not os.path.isfile(path):
                raise AverageError(f"no checkpoint at {path}")
        state = average_states(paths)
    except AverageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    temporary = args.output + ".tmp"
    torch.save(state, temporary)
    os.replace(temporary, args.output)
    print(f"averaged {len(paths)} checkpoint(s) into {args.output}: {', '.join(os.path.basename(p) for p in paths)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
