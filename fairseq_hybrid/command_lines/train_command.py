"""The user's fairseq-train command line, as the package's commands take
it: split off after ``--``, parsed as fairseq parses it, with the options
a command sets itself dropped or replaced, and the batches fairseq's
sampler draws for it."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
from typing import List, Optional, Sequence, Tuple

from .owned_options import SET_BY_MEASURE

# the package's folder: fairseq imports it as --user-dir (and checkpoints record it)
USER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the package folder
NO_DATA = "-"  # the data folder in a command planned without data
# criteria whose loss hybrid_cross_entropy computes (with the command's --label-smoothing, 0 by default): a
# group runs its cells through it, and on one device and under DDP its fused output layer is faster, so every
# candidate is timed and printed with it in their place
GROUP_CRITERION = "hybrid_cross_entropy"
SAME_LOSS = (GROUP_CRITERION, "cross_entropy", "label_smoothed_cross_entropy")


class PlanError(ValueError):
    """Input the plan cannot serve: one line for the user, exit status 2."""


class OneLineParser(argparse.ArgumentParser):
    """Bad input: one line on stderr and exit status 2 (argparse prints its
    usage first)."""

    def error(self, message):
        raise PlanError(message)


def split_command(argv: Sequence[str]) -> Tuple[List[str], List[str]]:
    """The command's own options and the fairseq-train command after
    ``--`` (its program name, if given, dropped)."""
    argv = list(argv)
    if "--" not in argv:
        raise PlanError("give your fairseq-train command after --, e.g. fairseq-hybrid-plan --gpus 4 -- "
                        "fairseq-train DATA --arch hybrid_lstm_paper --max-tokens 6400")
    cut = argv.index("--")
    train = argv[cut + 1:]
    if train and os.path.basename(train[0]) in ("fairseq-train", "fairseq-hybrid-train"):
        train = train[1:]
    if not train:
        raise PlanError("the fairseq-train command after -- is empty")
    return argv[:cut], train


def parse_training(train: List[str]):
    """The user's command as fairseq parses it (``fairseq_hybrid`` imported
    first, so its architectures and options are registered)."""
    from .. import models  # noqa: F401  (registers hybrid_lstm)
    from fairseq import options

    parser = options.get_training_parser()
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            args = options.parse_args_and_arch(parser, train)
    except SystemExit as exit_:
        lines = [line for line in said.getvalue().splitlines() if line.strip()]
        message = lines[-1].split("error:", 1)[-1].strip() if lines else "it exits"
        raise PlanError(f"fairseq-train refuses the command: {message}") from exit_
    if args.data == NO_DATA:
        args.data = ""
    return args


def without(train: List[str], names: Sequence[str]) -> List[str]:
    """``train`` without the options ``names`` and their values."""
    out, skip = [], False
    for token in train:
        if skip:
            skip = False
            continue
        name = token.split("=", 1)[0]
        if name in names:
            skip = "=" not in token
            continue
        out.append(token)
    return out


def measured_command(train: List[str], args, what: str) -> List[str]:
    """The user's command as ``what`` (``--measure``, ``calibrate``) runs
    it, each candidate setting its own devices and choices, refused in one
    line where it cannot time it: the data folder is needed, one batch a
    step."""
    if not args.data:
        raise PlanError(f"{what} trains on the command's data: give the data folder, not -")
    if not os.path.isdir(args.data):
        raise PlanError(f"{args.data}: no such data folder")
    if args.update_freq and args.update_freq[0] > 1:
        raise PlanError(f"{what} times one batch a step: give --update-freq 1 (and the global batch as "
                        "--max-tokens or --batch-size)")
    return with_group_criterion(without(train, SET_BY_MEASURE))


def with_group_criterion(train: List[str]) -> List[str]:
    """``train`` with the criterion a group runs its cells through (the
    same loss as the command's, :data:`SAME_LOSS`), which every candidate
    runs."""
    return without(train, ("--criterion",)) + ["--criterion", GROUP_CRITERION]


def command_batches(task, max_tokens: Optional[int], batch_size: Optional[int], count: int, seed: int = 1,
                    subset: str = "train", max_positions=(1024, 1024)) -> List:
    """The first ``count`` training batches fairseq's sampler draws for a
    command's ``--max-tokens`` and ``--batch-size`` (shuffled with
    ``seed``): what ``fairseq-hybrid-plan`` reads the batch's shape from and
    what its ``--measure`` trains on."""
    import warnings

    epoch = task.get_batch_iterator(task.dataset(subset), max_tokens=max_tokens, max_sentences=batch_size,
                                    max_positions=max_positions, ignore_invalid_inputs=True, seed=seed)
    with warnings.catch_warnings():  # torch: no accelerator to pin memory on
        warnings.simplefilter("ignore")
        iterator = epoch.next_epoch_itr(shuffle=True)
        return [next(iterator) for _ in range(min(count, len(iterator)))]
