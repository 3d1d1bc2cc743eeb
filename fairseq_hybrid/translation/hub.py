"""Translating from Python with a trained run: fairseq's hub interface.

``load_translator(RUN_DIR)`` finds what a run of the Tatoeba recipe (or any
run laid out the same way) needs, the checkpoint, the binarized data's
dictionaries and the sentencepiece model, and returns fairseq's
``GeneratorHubInterface``, whose ``translate`` takes raw text:

    from fairseq_hybrid.translation.hub import load_translator
    ja_en = load_translator("work/tatoeba_ja_en/hybrid_lstm_base")
    ja_en.translate("ひとつ質問してもいいですか。")

It is ``HybridLSTMModel.from_pretrained`` with those paths filled in, so
any of fairseq's generation options may be given (``beam=5``).  Several
checkpoints joined with ``:`` (``checkpoint="a.pt:b.pt"``) translate as
an ensemble, as ``fairseq-generate --path a.pt:b.pt`` does.

Its ``translate`` keeps every line in its place, as ``translate.sh`` does
(:mod:`fairseq_hybrid.translation.line_translation`): one value in, one line out; a
blank value gives ""; a value too long for the model is translated
sentence by sentence; bytes are decoded as UTF-8 with replacement; a value
that cannot be translated gives "" and a logged warning naming its place,
never an exception that loses the others.  ``translate_lines`` returns
the full :class:`~fairseq_hybrid.translation.line_translation.LineResult` of each.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from typing import Iterator, List, Optional, Sequence, Union

from fairseq import hub_utils

from .line_input import clean_lines
from .line_translation import LineResult, LineTranslator
from ..models.hybrid_lstm import HybridLSTMModel

logger = logging.getLogger(__name__)

# The recipe's own choice first (docs/search/tatoeba.md: the average scored lower).
CHECKPOINTS = ("checkpoint_best.pt", "checkpoint_last.pt", "checkpoint_average.pt")


def find_checkpoint(run_dir: str) -> str:
    """The checkpoint a run translates with: its best (lowest validation
    loss), as the recipe's score step, else its last, else an average."""
    for folder in (os.path.join(run_dir, "checkpoints"), run_dir):
        for name in CHECKPOINTS:
            if os.path.isfile(os.path.join(folder, name)):
                return os.path.join(folder, name)
    raise FileNotFoundError(f"no checkpoint ({', '.join(CHECKPOINTS)}) in {run_dir} or {run_dir}/checkpoints")


@contextmanager
def fairseq_quiet() -> Iterator[None]:
    """fairseq's own INFO lines (dictionaries loaded, a batch iterator made
    for every call) held back from a Python user's console while the hub
    works, as a library should; warnings still show.  A level the user set
    on the ``fairseq`` logger is kept."""
    fairseq_logger = logging.getLogger("fairseq")
    if fairseq_logger.level != logging.NOTSET:
        yield
        return
    fairseq_logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        fairseq_logger.setLevel(logging.NOTSET)


class LineSafeHubInterface(hub_utils.GeneratorHubInterface):
    """fairseq's hub interface whose ``translate`` never shifts, drops or
    merges lines: one result per value, in order."""

    def translate_lines(self, lines: Sequence[Union[str, bytes]], beam: Optional[int] = None,
                        buffer_size: int = 64, **generation) -> List[LineResult]:
        """One :class:`LineResult` per value (numbered from 1), warnings and
        errors logged with the value's number.  ``beam``: default, the one
        given to :func:`load_translator`."""
        translator = LineTranslator(self, beam=beam or self.cfg.generation.beam, buffer_size=buffer_size,
                                    **generation)
        with fairseq_quiet():
            results = list(translator.translate(clean_lines(lines)))
        for result in results:
            for message in result.messages():
                logger.warning(message)
        return results

    def translate(self, sentences: Union[str, bytes, Sequence[Union[str, bytes]]], beam: Optional[int] = None,
                  verbose: bool = False, **generation):
        """A translation for one value, or a list of them for a list, in order."""
        single = isinstance(sentences, (str, bytes))
        results = self.translate_lines([sentences] if single else sentences, beam=beam, **generation)
        translations = [result.translation for result in results]
        return translations[0] if single else translations


def _work_dir(run_dir: str) -> str:
    folder = os.path.dirname(run_dir)
    while True:
        if os.path.isdir(os.path.join(folder, "bin")) and os.path.isdir(os.path.join(folder, "spm")):
            return folder
        parent = os.path.dirname(folder)
        if parent == folder:
            return os.path.dirname(run_dir)
        folder = parent


def load_translator(run_dir: str, checkpoint: Optional[str] = None, data: Optional[str] = None,
                    sentencepiece_model: Optional[str] = None, beam: int = 5, cpu: bool = True, **options):
    """fairseq's hub interface for a run.  ``checkpoint``: one path, or
    several joined with ``:`` for an ensemble (default: the run's own,
    :func:`find_checkpoint`).  ``data`` (the binarized dictionaries) and
    ``sentencepiece_model`` default to the recipe's layout: ``bin/`` and
    ``spm/spm.model`` in the nearest folder above the run that has them."""
    run_dir = os.path.abspath(run_dir)
    work = _work_dir(run_dir)
    checkpoints = [os.path.abspath(path) for path in (checkpoint or find_checkpoint(run_dir)).split(os.pathsep)]
    for path in checkpoints:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"checkpoint not found: {path}")
    data = os.path.abspath(data or os.path.join(work, "bin"))
    sentencepiece_model = os.path.abspath(sentencepiece_model or os.path.join(work, "spm", "spm.model"))
    for what, path in (("binarized data", os.path.join(data, "dict.ja.txt")),
                       ("sentencepiece model", sentencepiece_model)):
        if not os.path.exists(path):
            raise FileNotFoundError(f"{what} not found at {path}")
    # HybridLSTMModel.from_pretrained with our interface instead of fairseq's;
    # fairseq joins each file to the folder, absolute paths stay as they are
    with fairseq_quiet():
        loaded = hub_utils.from_pretrained(
            os.path.dirname(checkpoints[0]), checkpoint_file=os.pathsep.join(checkpoints), data_name_or_path=data,
            archive_map=HybridLSTMModel.hub_models(), bpe="sentencepiece", sentencepiece_model=sentencepiece_model,
            beam=beam, cpu=cpu, **options)
    return LineSafeHubInterface(loaded["args"], loaded["task"], loaded["models"]).eval()
