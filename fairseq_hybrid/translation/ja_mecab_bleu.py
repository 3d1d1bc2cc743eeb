"""Validation BLEU on Japanese output, tokenised by MeCab as sacrebleu's
``ja-mecab`` tokeniser does: ``--eval-bleu-detok ja_mecab
--eval-tokenized-bleu``.

fairseq's ``--eval-bleu`` scores with sacrebleu's default ``13a``
tokeniser, which leaves a Japanese sentence (no spaces) as one or two
"words", so its BLEU says little about Japanese output.  fairseq passes
both hypotheses and references through the ``--eval-bleu-detok`` tokeniser's
``decode`` and, with ``--eval-tokenized-bleu``, scores the result as it
stands (sacrebleu ``tokenize="none"``).  The ``ja_mecab`` tokeniser
registered here makes ``decode`` the MeCab segmentation of sacrebleu's
``ja-mecab``, so that validation BLEU is sacrebleu's ``--tokenize
ja-mecab`` BLEU (the same number: ``tests/test_ja_mecab_bleu.py``).
Needs ``sacrebleu[ja]`` (``scripts/setup.sh`` installs it).
"""

from __future__ import annotations

from fairseq.data.encoders import register_tokenizer
from fairseq.dataclass import FairseqDataclass


@register_tokenizer("ja_mecab", dataclass=FairseqDataclass)
class JaMecabTokenizer:
    def __init__(self, *unused):
        try:
            from sacrebleu.tokenizers.tokenizer_ja_mecab import TokenizerJaMecab
        except ImportError as error:
            raise ImportError("--eval-bleu-detok ja_mecab needs MeCab for sacrebleu: "
                              "pip install 'sacrebleu[ja]' (scripts/setup.sh installs it)") from error
        self.mecab = TokenizerJaMecab()

    def encode(self, x: str) -> str:
        return self.mecab(x)

    def decode(self, x: str) -> str:
        # fairseq scores what decode returns; with --eval-tokenized-bleu,
        # BLEU over these tokens is sacrebleu's ja-mecab BLEU
        return self.mecab(x)
