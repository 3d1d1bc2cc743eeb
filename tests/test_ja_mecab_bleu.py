"""Validation BLEU on Japanese output (fairseq_hybrid/translation/ja_mecab_bleu.py):
the same number as sacrebleu's ja-mecab BLEU, and fairseq-train's
--eval-bleu using it on an en-ja run, on one device and on a group."""

import os
import re

import pytest
import sacrebleu
from fairseq.data import encoders

from conftest import BIN, USER_DIR, run

HYPOTHESES = ["猫が好きです。", "これはペンです。", "明日は雨が降るでしょう。"]
REFERENCES = ["猫がとても好きです。", "これは本です。", "明日は雨が降るだろう。"]


def test_bleu_over_its_tokens_is_sacrebleus_ja_mecab_bleu():
    from argparse import Namespace

    tokenizer = encoders.build_tokenizer(Namespace(tokenizer="ja_mecab"))
    ours = sacrebleu.corpus_bleu([tokenizer.decode(h) for h in HYPOTHESES],
                                 [[tokenizer.decode(r) for r in REFERENCES]], tokenize="none")
    reference = sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES], tokenize="ja-mecab")
    assert ours.score == pytest.approx(reference.score, abs=1e-9) and reference.score > 0
    # what fairseq's default scoring gives: one "word" a sentence
    assert sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES]).score != pytest.approx(reference.score)


@pytest.mark.slow
@pytest.mark.parametrize("group", [[], ["--hybrid-devices", "cpu,cpu"]], ids=["one device", "group"])
def test_en_ja_validation_bleu_with_ja_mecab(binarized, tmp_path, group):
    result = run(
        os.path.join(BIN, "fairseq-train"), binarized / "bin", "--user-dir", USER_DIR, "--cpu",
        "--source-lang", "en", "--target-lang", "ja", "--arch", "hybrid_lstm_tiny",
        "--criterion", "hybrid_cross_entropy", "--optimizer", "adam", "--lr", "0.005", "--max-tokens", "600",
        "--max-update", "3", "--save-dir", tmp_path / "run", "--no-epoch-checkpoints", "--no-progress-bar",
        "--log-format", "simple", "--eval-bleu", "--eval-bleu-remove-bpe", "sentencepiece",
        "--eval-bleu-detok", "ja_mecab", "--eval-tokenized-bleu", "--eval-bleu-print-samples", "--eval-bleu-args", '{"beam": 2, "max_len_b": 20}',
        "--validate-interval-updates", "3", "--best-checkpoint-metric", "bleu", "--maximize-best-checkpoint-metric",
        *group)
    log = result.stdout + result.stderr
    assert re.search(r"\| valid \|.*\| bleu [\d.]+ ", log), log[-3000:]
    # what was scored is MeCab's segmentation: the reference's words stand apart
    reference = re.search(r"example reference: (.*)", log).group(1)
    assert re.search(r"[\u3040-\u30ff\u4e00-\u9fff] [\u3040-\u30ff\u4e00-\u9fff。]", reference), reference
