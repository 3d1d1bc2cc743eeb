"""Translating any input: line N out is the translation of line N in,
whatever the bytes, from the shell (recipes/tatoeba_ja_en/translate.sh)
and from Python (fairseq_hybrid.translation.hub).

The model is the fixture run's hybrid_lstm_tiny with every weight drawn
afresh from N(0, 1) (seeded): a dozen training updates leave the tiny
model saying the same word to every input, which would let a shifted line
pass unseen, while random weights give every input a translation of its
own.

"Equal to the line translated alone" is checked in float64 (``hub``):
in float32 a batch's arithmetic differs from a single line's in the last
bits (matrix products of another height), and with random weights over
200 decoding steps that can flip a beam choice late in a line.  The
script runs in float32, so its output is checked against the same lines
through the hub in float32 (``hub32``: the same batches, the same
arithmetic) and, line by line, for every blank and every line count."""

import io
import logging
import os
import random
import subprocess
import sys

import pytest
import torch

from conftest import FIXTURE, REPO
from fairseq_hybrid.translation.line_input import clean_line, clean_lines, read_lines
from fairseq_hybrid.translation.line_translation import LineTranslator, split_pieces

SCRIPT = os.path.join(REPO, "recipes", "tatoeba_ja_en", "translate.sh")
BEAM = 2
SENTENCE = "ひとつ質問してもいいですか。"


# -- reading lines: no model --------------------------------------------------------------------


def test_a_line_ends_at_a_newline_byte_and_nowhere_else():
    data = b"a\x0bb\nc\x1cd\r\n\xff\xfe\x80abc\n\x00e\nf\xe2\x80\xa8g\xc2\x85h\nlast"
    lines = list(read_lines(io.BytesIO(data)))
    assert [line.number for line in lines] == [1, 2, 3, 4, 5, 6]
    assert [line.text for line in lines] == ["a b", "c d", "\ufffd\ufffd\ufffdabc", " e", "f g h", "last"]
    assert lines[2].notes == ["invalid UTF-8 at byte 1 and after replaced by U+FFFD"]
    assert lines[4].notes == ["2 control characters replaced by spaces"]
    assert lines[1].notes == ["1 control character replaced by spaces"]  # the \r of CRLF is no control character
    assert not lines[5].notes
    assert list(read_lines(io.BytesIO(b""))) == []
    assert [line.blank for line in read_lines(io.BytesIO(b"\n \t\n\r\nx\n"))] == [True, True, True, False]


def test_a_python_value_is_one_line():
    lines = clean_lines(["a\nb", b"\xffz", "c\r\n", ""])
    assert [line.text for line in lines] == ["a b", "\ufffdz", "c", ""]
    with pytest.raises(TypeError, match="line 2: expected str or bytes"):
        clean_lines(["a", 3])
    assert clean_line(7, "x\u2029y").text == "x y"


def test_a_long_line_is_cut_into_sentences_then_at_the_limit():
    tokens = ["▁a", "b.", "▁c", "▁d", "▁e", "▁f", "▁g", "。", "▁h"]
    assert split_pieces(tokens, 3) == [["▁a", "b."], ["▁c", "▁d", "▁e"], ["▁f", "▁g", "。"], ["▁h"]]
    assert split_pieces(tokens, 100) == [["▁a", "b."], ["▁c", "▁d", "▁e", "▁f", "▁g", "。"], ["▁h"]]


# -- a model ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def random_run(trained):
    """WORK/random: the tiny run's checkpoint with N(0, 1) weights."""
    work, hybrid, _ = trained
    checkpoint = torch.load(hybrid / "checkpoint_best.pt", weights_only=False)
    generator = torch.Generator().manual_seed(0)
    for name, value in checkpoint["model"].items():
        if value.is_floating_point():
            checkpoint["model"][name] = torch.randn(value.shape, generator=generator)
    folder = work / "random" / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(checkpoint, folder / "checkpoint_best.pt")
    return work / "random"


@pytest.fixture(scope="module")
def hub(random_run):
    from fairseq_hybrid.translation.hub import load_translator

    return load_translator(str(random_run), beam=BEAM).double()


@pytest.fixture(scope="module")
def hub32(random_run):
    from fairseq_hybrid.translation.hub import load_translator

    return load_translator(str(random_run), beam=BEAM)


class Alone:
    """Each distinct text translated by itself, once."""

    def __init__(self, hub):
        self.hub, self.known = hub, {}

    def __call__(self, text):
        if text not in self.known:
            self.known[text] = self.hub.translate([text])[0]
        return self.known[text]


@pytest.fixture(scope="module")
def alone(hub):
    return Alone(hub)


def fixture_sentences():
    with open(os.path.join(FIXTURE, "test.ja"), encoding="utf-8") as f:
        return [line.strip() for line in f][:40]


def too_long(hub, with_punctuation=True):
    """A line well over the model's source limit."""
    limit = LineTranslator.source_limit(hub)
    text = SENTENCE if with_punctuation else SENTENCE[:-1]
    line = text
    while len(hub.apply_bpe(line).split()) <= limit:
        line += text
    return line


def translate_sh(run, data: bytes):
    # as many threads as this process, so that the float32 arithmetic is the hub32's
    env = dict(os.environ, OMP_NUM_THREADS=str(torch.get_num_threads()))
    return subprocess.run(["bash", SCRIPT, "--run", str(run), "--beam", str(BEAM)], input=data,
                          capture_output=True, env=env)


def output_lines(stdout: bytes):
    text = stdout.decode("utf-8")
    assert text == "" or text.endswith("\n"), text[-200:]
    return text.split("\n")[:-1]


# -- the table, from the shell ----------------------------------------------------------


def test_a_line_too_long_for_the_model_costs_no_other_line(random_run, hub, hub32, alone):
    good = fixture_sentences()[:4]
    long_line = too_long(hub)
    lines = [good[0], good[1], long_line, good[2], good[3]]
    result = translate_sh(random_run, "\n".join(lines).encode() + b"\n")
    out = output_lines(result.stdout)
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    assert out == hub32.translate(lines) and len(out) == 5 and all(out)
    assert hub.translate(lines) == [alone(text) for text in lines]
    assert "line 3: " in result.stderr.decode() and "pieces" in result.stderr.decode()
    assert "Size of sample" not in result.stderr.decode()


def test_invalid_utf8_nul_and_crlf_keep_every_line_in_its_place(random_run, hub, hub32, alone):
    first, second, third = fixture_sentences()[4:7]
    lines = [first.encode(), b"\xff\xfe\x80abc", third.encode(), b"\x00" + second.encode(), b""]
    data = lines[0] + b"\n" + lines[1] + b"\n" + lines[2] + b"\r\n" + lines[3] + b"\r\n" + b"\r\n"
    result = translate_sh(random_run, data)
    out = output_lines(result.stdout)
    stderr = result.stderr.decode()
    assert result.returncode == 0, stderr[-2000:]
    assert out == hub32.translate(lines) and len(out) == 5 and all(out[:4]) and out[4] == ""
    assert hub.translate(lines) == [alone(first), alone("\ufffd\ufffd\ufffdabc"), alone(third), alone(" " + second), ""]
    assert "line 2: invalid UTF-8" in stderr and "line 4: 1 control character" in stderr
    assert "line 1:" not in stderr and "line 3:" not in stderr
    assert stderr.strip().splitlines()[-1].startswith("5 lines translated (5 with a translation, 0 empty after")


def test_a_long_line_without_punctuation_is_cut_at_the_limit(hub, alone):
    long_line = too_long(hub, with_punctuation=False)
    tokens, limit = len(hub.apply_bpe(long_line).split()), LineTranslator.source_limit(hub) - 1
    [result] = hub.translate_lines([long_line], beam=BEAM)
    assert result.translation == alone(long_line) and result.error is None
    assert f"{tokens} subword tokens" in result.notes[0]
    assert f"translated in {-(-tokens // limit)} pieces" in result.notes[0]


def test_the_hub_gives_a_blank_for_a_blank(hub, alone):
    texts = ["今日は晴れです。", "", "明日は雨です。", "  \t"]
    assert hub.translate(texts) == [alone(texts[0]), "", alone(texts[2]), ""]
    assert hub.translate("") == ""
    assert hub.translate(b"\xff" + SENTENCE.encode()) == alone("\ufffd" + SENTENCE)


# -- a line that cannot be translated ------------------------------------------------------------


@pytest.fixture
def fails_on_the_word(monkeypatch):
    """generate raises for any batch holding a source with the word 'unlucky'."""
    from fairseq import hub_utils

    original = hub_utils.GeneratorHubInterface.generate

    def generate(self, sources, *args, **kwargs):
        if any("unlucky" in self.remove_bpe(self.string(source)) for source in sources):
            raise RuntimeError("the model cannot take this line")
        return original(self, sources, *args, **kwargs)

    monkeypatch.setattr(hub_utils.GeneratorHubInterface, "generate", generate)


def test_a_line_that_fails_is_named_and_empty_and_the_others_are_translated(
        random_run, hub32, fails_on_the_word, monkeypatch, capsys):
    from fairseq_hybrid.commands import translate

    good = fixture_sentences()[7:10]
    data = "\n".join([good[0], "an unlucky line", good[1], good[2]]).encode() + b"\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    stdout = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(stdout))
    status = translate.main(["--run", str(random_run), "--beam", str(BEAM)])
    stderr = capsys.readouterr().err
    assert status == translate.EXIT_SOME_LINES_FAILED
    # the failed batch was retried line by line: each good line translated alone
    alone32 = [hub32.translate([text])[0] for text in good]
    assert output_lines(stdout.getvalue()) == [alone32[0], "", alone32[1], alone32[2]]
    assert "line 2: not translated: RuntimeError: the model cannot take this line" in stderr
    assert "error: 1 of 4 lines not translated (empty in the output): lines 2" in stderr
    assert "4 lines translated (3 with a translation, 1 empty after an error) in " in stderr


def test_the_hub_logs_a_line_that_fails_and_gives_a_blank(hub, alone, fails_on_the_word, caplog):
    texts = [SENTENCE, "unlucky", "明日は雨です。"]
    with caplog.at_level(logging.WARNING, logger="fairseq_hybrid.translation.hub"):
        assert hub.translate(texts) == [alone(SENTENCE), "", alone("明日は雨です。")]
    assert "line 2: not translated: RuntimeError" in caplog.text


# -- any input: a property test ------------------------------------------------------------------


def random_input(rng, sentences, long_line):
    """Random lines of bytes and which of them are plain (valid UTF-8, no
    control characters, not blank, not too long), with random line ends."""
    lines, plain = [], []
    for _ in range(rng.randint(0, 12)):
        kind = rng.choice(["plain", "plain", "plain", "empty", "spaces", "control", "bytes", "cr", "long"])
        text = rng.choice(sentences)
        if kind == "empty":
            line = b""
        elif kind == "spaces":
            line = rng.choice([b" ", b"\t", b"  \t "])
        elif kind == "control":
            cut = rng.randint(0, len(text))
            control = rng.choice(["\x00", "\x07", "\x0b", "\x0c", "\x1b", "\x7f", "\x85", "\u2028"])
            line = (text[:cut] + control + text[cut:]).encode()
        elif kind == "bytes":
            line = bytes(rng.randrange(256) for _ in range(rng.randint(1, 20))).replace(b"\n", b"")
        elif kind == "cr":
            line = text.encode() + b"\r" + rng.choice(sentences).encode()  # a lone CR inside a line
        elif kind == "long":
            line = long_line.encode() if rng.random() < 0.3 else text.encode()
        else:
            line = text.encode()
        lines.append(line)
        plain.append(text if kind == "plain" else None)
    ends = [rng.choice([b"\n", b"\r\n"]) for _ in lines]
    data = b"".join(line + end for line, end in zip(lines, ends))
    if lines and rng.random() < 0.3:  # no newline after the last line
        data = data[:-len(ends[-1])]
    return data, lines, plain


def check(out, lines, plain, alone):
    assert len(out) == len(lines)
    for number, (translation, line, text) in enumerate(zip(out, lines, plain), 1):
        if text is not None:
            assert translation == alone(text), f"line {number}"
        elif not line.strip():
            assert translation == "", f"line {number}"


def test_any_input_through_the_hub(hub, alone):
    rng = random.Random(0)
    sentences, long_line = fixture_sentences(), too_long(hub)
    for _ in range(12):
        data, lines, plain = random_input(rng, sentences, long_line)
        out = hub.translate(lines) if lines else []
        check(out, lines, plain, alone)


def test_any_input_through_the_shell(random_run, hub, hub32):
    rng = random.Random(1)
    sentences, long_line = fixture_sentences(), too_long(hub)
    for _ in range(3):
        data, lines, plain = random_input(rng, sentences, long_line)
        result = translate_sh(random_run, data)
        assert result.returncode == 0, result.stderr.decode()[-2000:]
        out = output_lines(result.stdout)
        assert out == (hub32.translate(lines) if lines else [])
        assert [translation == "" for translation in out] == [not line.strip() for line in lines]


# -- the recipes' scoring step -------------------------------------------------------------------


def test_an_over_long_test_sentence_does_not_stop_the_scoring_step(trained, tmp_path):
    """evaluate.sh (fairseq-generate on the binarized test split, then
    extract_hypotheses.py and sacrebleu) on a test split whose last
    sentence is 1,500 tokens: every sentence gets its hypothesis, the long
    one named; without --truncate-source fairseq-generate stops at it."""
    from conftest import BIN, run

    work, hybrid, _ = trained
    spm, raw = tmp_path / "spm", tmp_path / "raw"
    spm.mkdir()
    raw.mkdir()
    source = (work / "spm" / "test.ja").read_text(encoding="utf-8").splitlines()[:5]
    target = (work / "spm" / "test.en").read_text(encoding="utf-8").splitlines()[:5]
    source.append(" ".join(source[0].split() * (1500 // len(source[0].split()) + 1)))
    target.append(target[0])
    (spm / "test.ja").write_text("\n".join(source) + "\n", encoding="utf-8")
    (spm / "test.en").write_text("\n".join(target) + "\n", encoding="utf-8")
    (raw / "test.en").write_text("\n".join(line.replace(" ", "").replace("▁", " ").strip() for line in target) + "\n",
                                 encoding="utf-8")
    run(os.path.join(BIN, "fairseq-preprocess"), "--source-lang", "ja", "--target-lang", "en",
        "--srcdict", work / "bin" / "dict.ja.txt", "--tgtdict", work / "bin" / "dict.en.txt",
        "--testpref", spm / "test", "--destdir", tmp_path / "bin", "--workers", "1")
    result = run("bash", os.path.join(REPO, "recipes", "tatoeba_ja_en", "evaluate.sh"), "--work-dir", tmp_path,
                 "--checkpoint", hybrid / "checkpoint_best.pt", "--out", tmp_path / "out", "--beam", "2")
    hypotheses = (tmp_path / "out" / "hyp.en").read_text(encoding="utf-8").split("\n")
    assert len(hypotheses) == 7 and hypotheses[6] == ""
    assert f"line 6: {len(source[5].split())} tokens" in result.stderr
    assert "translated from its first 1023 tokens" in result.stderr
    assert (tmp_path / "out" / "score.json").exists()


def test_the_hub_keeps_fairseqs_info_lines_off_a_python_users_console(random_run, caplog):
    """fairseq logs a batch iterator's making at INFO on every call; a
    Python user who turned INFO on for their own code sees none of it,
    and the ``fairseq`` logger's own level is left as it was."""
    import logging

    from fairseq_hybrid.translation.hub import load_translator

    caplog.set_level(logging.INFO)
    translator = load_translator(str(random_run), beam=BEAM)
    translator.translate_lines(fixture_sentences()[:2])
    chatter = [record.getMessage() for record in caplog.records
               if record.name.startswith("fairseq.") and record.levelno < logging.WARNING]
    assert not chatter, chatter[:3]
    assert logging.getLogger("fairseq").level == logging.NOTSET
