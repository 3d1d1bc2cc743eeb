"""What one step of the user's fairseq-train command trains, read as
fairseq reads it (its data folder's dictionaries and batches, or the
shape given) with the twin model it prices: the workload
``fairseq-hybrid-plan`` forecasts, with one-line refusals of input it
cannot serve."""

from __future__ import annotations

import os
import warnings
from typing import List, NamedTuple, Optional, Tuple

from ..command_lines.train_command import PlanError


class Batch(NamedTuple):
    """One of the command's batches as the simulator prices it: each
    sentence's source length, the target width and each target length."""

    sources: List[int]
    width: int
    targets: List[int]


class Workload:
    """What one step of the user's command trains: a global batch of
    ``sentences`` sentences of ``source`` + ``target`` tokens, the model
    (a parameter-free twin) and its options."""

    def __init__(self, model, cfg, sentences: int, source: int, target: int, where: str,
                 fewest: Optional[int] = None, batches: Optional[List[Batch]] = None):
        self.model, self.cfg = model, cfg
        self.sentences, self.source, self.target = sentences, source, target
        self.where = where  # how the shape was found, said in the output
        self.fewest = fewest  # the fewest sentences of the drawn batches (with data)
        # the drawn batches themselves (with data, without --update-freq): what each candidate is priced on
        self.batches = batches


def quietly(function, *args):
    """``function(*args)`` without the warnings fairseq's hydra configs
    print on every conversion (deprecations, not the user's doing)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return function(*args)


def vocabulary_sizes(args, data: Optional[str], default: int) -> Tuple[int, int]:
    """The source and target vocabularies of the data's dictionaries (as
    fairseq loads them), else ``default`` for both."""
    if not data:
        return default, default
    from fairseq.data import Dictionary

    pair = (args.source_lang, args.target_lang)
    if not all(pair):  # as fairseq's translation task infers them: from the split files' names
        from fairseq.data.data_utils import infer_language_pair

        pair = infer_language_pair(data)
        if not all(pair):
            raise PlanError(f"{data}: no language pair found (no SPLIT.SRC-TGT files): give --source-lang and "
                            "--target-lang, or a folder fairseq-preprocess wrote")
    sizes = []
    for lang in pair:
        path = os.path.join(data, f"dict.{lang}.txt")
        if not os.path.exists(path):
            raise PlanError(f"{data}: no dict.{lang}.txt (a folder fairseq-preprocess wrote, with "
                            "--source-lang and --target-lang given?)")
        sizes.append(len(Dictionary.load(path)))
    return sizes[0], sizes[1]


def data_shape(args, count: int) -> Tuple[float, float, float, int, List[Batch]]:
    """Mean sentences per batch and mean source and target lengths (padded
    width, as the simulator pads) of ``count`` training batches drawn by
    fairseq's batch sampler at the command's ``--max-tokens`` (seed 1, the
    batches ``--measure`` trains on), the fewest sentences of them, and the
    batches' lengths."""
    from fairseq import tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from ..command_lines.train_command import command_batches

    cfg = quietly(convert_namespace_to_omegaconf, args)
    task = tasks.setup_task(cfg.task)
    try:
        task.load_dataset(cfg.dataset.train_subset)
    except FileNotFoundError as error:  # fairseq's "Dataset not found: train (...)"
        raise PlanError(f"{args.data}: no {cfg.dataset.train_subset} split to draw batches from ({error})") from error
    try:
        drawn = command_batches(task, args.max_tokens, args.batch_size, count, subset=cfg.dataset.train_subset)
    except AssertionError as error:  # fairseq's sampler: a sentence longer than --max-tokens (fairseq-train too)
        raise PlanError(f"{args.data}: fairseq's batch sampler refuses the command: {error}") from error
    shapes = [(sample["net_input"]["src_tokens"].size(0), sample["net_input"]["src_tokens"].size(1),
               sample["target"].size(1)) for sample in drawn]
    if not shapes:
        raise PlanError(f"{args.data}: no training batches at --max-tokens {args.max_tokens}")
    means = tuple(sum(shape[i] for shape in shapes) / len(shapes) for i in range(3))
    pad = task.target_dictionary.pad()
    batches = [Batch(sample["net_input"]["src_lengths"].tolist(), sample["target"].size(1),
                     sample["target"].ne(pad).sum(1).tolist()) for sample in drawn]
    return means + (min(shape[0] for shape in shapes), batches)


def twin_of(args, source_words: int, target_words: int):
    """The command's model (``args``: its parsed fairseq-train options) as a
    twin of meta tensors, and its config: what the simulator prices."""
    from ..planning.twin_model import build_registered, VocabularyOfSize

    import torch

    options = {key: value for key, value in vars(args).items() if key != "arch"}
    options.update(hybrid_devices="", hybrid_placement="")
    with torch.device("meta"):
        return build_registered(args.arch, VocabularyOfSize(source_words), VocabularyOfSize(target_words),
                                **options)


def workload(args, own) -> Workload:
    """The global batch of the user's command and its twin model."""
    data = args.data if getattr(args, "data", None) else None
    if data and not os.path.isdir(data):
        raise PlanError(f"{data}: no such data folder")
    update_freq = args.update_freq[0] if args.update_freq else 1
    model, cfg = twin_of(args, *vocabulary_sizes(args, data, own.vocabulary))
    if data:
        per_batch, source, target, fewest, batches = data_shape(args, own.batches)
        where = (f"{own.batches} batches of {data} at --max-tokens {args.max_tokens}: {per_batch:.1f} sentences "
                 f"of {source:.1f} + {target:.1f} tokens (padded) on average")
        source, target = round(source), round(target)
    else:
        fewest, batches = None, None
        source, target = own.sentence_length
        if args.batch_size:
            per_batch = args.batch_size
        elif args.max_tokens:
            per_batch = args.max_tokens // max(source, target)  # fairseq counts the longer side, padded
        else:
            raise PlanError("give --max-tokens or --batch-size in the fairseq-train command")
        where = f"sentences of {source} + {target} tokens (--sentence-length), {per_batch} a batch"
    sentences = int(per_batch) * update_freq
    if sentences < own.gpus:
        raise PlanError(f"a global batch of {sentences} sentences cannot be split over {own.gpus} GPUs")
    devices = getattr(own, "devices", None)
    if devices and fewest is not None and fewest < len(devices):
        raise PlanError(f"--measure splits each batch's sentences over up to {len(devices)} DDP ranks, but one "
                        f"of the {own.batches} batches at --max-tokens {args.max_tokens} has {fewest}: give a larger "
                        "--max-tokens")
    return Workload(model, cfg, sentences - sentences % own.gpus, source, target,
                    where + (f", x {update_freq} (--update-freq)" if update_freq > 1 else ""), fewest,
                    batches if update_freq == 1 else None)
