"""The ASPEC-JE and patent recipes on fixtures in their exact formats,
built here from the shipped Tatoeba pairs, with one bad line of each kind:
every drop is named in the summary, every kept pair stays aligned, missing
inputs fail before any work, and the full recipe scores each direction with
the right tokenizer."""

import json
import os
import subprocess
import sys
import unicodedata

import pytest

from conftest import FIXTURE, REPO

BIN = os.path.dirname(sys.executable)
PREPARE = os.path.join(REPO, "scripts", "prepare_licensed_corpus.py")
ENV = dict(os.environ, PATH=BIN + os.pathsep + os.environ["PATH"])


def fixture_pairs(split):
    with open(os.path.join(FIXTURE, f"{split}.ja"), encoding="utf-8") as ja, \
            open(os.path.join(FIXTURE, f"{split}.en"), encoding="utf-8") as en:
        return [(j.rstrip("\n"), e.rstrip("\n")) for j, e in zip(ja, en)]


# Bad training lines: (reason named in the summary, ja, en).  Raw bytes so
# that invalid UTF-8 and CRLF can be written.
BAD_LINES = [
    ("wrong number of fields", None, None),
    ("empty side", "", "An empty Japanese side."),
    ("invalid UTF-8", b"\xff\xfe", "bad bytes"),
    ("control characters", "魚\x07がいる。", "A fish."),
    ("over-long sentence", "長い文です。", " ".join(["word"] * 60)),
    ("length-ratio outlier", "一", "one two three four five six seven eight nine ten eleven twelve"),
    ("exact duplicate", "DUP", "DUP"),  # filled in with the first training pair
]


def encode(value):
    return value if isinstance(value, bytes) else value.encode("utf-8")


def aspec_train_lines(pairs, with_bad):
    """``score ||| doc ||| sent ||| ja ||| en`` lines; the bad ones first,
    then a CRLF-ended good line, then the rest.  Returns (lines, planted)
    where planted maps reason -> line number."""
    lines, planted = [], {}
    if with_bad:
        for reason, ja, en in BAD_LINES:
            if reason == "wrong number of fields":
                line = b"0.9 ||| D0 ||| 0 ||| only four fields"
            else:
                if reason == "exact duplicate":
                    ja, en = pairs[0]
                line = b"0.9 ||| D0 ||| 0 ||| " + encode(ja) + b" ||| " + encode(en)
            lines.append(line)
            planted[reason] = len(lines)
    for index, (ja, en) in enumerate(pairs):
        line = f"0.5 ||| D{index // 10} ||| {index} ||| {ja} ||| {en}".encode("utf-8")
        if with_bad and index == 1:
            line += b"\r"
        lines.append(line)
    # The duplicate sits before its original: the original is the one dropped.
    if with_bad:
        planted["exact duplicate"] = len(BAD_LINES) + 1
    return lines, planted


def eval_lines(pairs):
    return [f"D{i // 10} ||| {i} ||| {ja} ||| {en}".encode("utf-8") for i, (ja, en) in enumerate(pairs)]


def write_lines(path, lines):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(b"\n".join(lines) + b"\n")


def make_aspec(root, train_size=1600):
    train = fixture_pairs("train")[:train_size]
    third = len(train) // 3
    lines, planted = aspec_train_lines(train[:third], with_bad=True)
    write_lines(os.path.join(root, "train", "train-1.txt"), lines)
    write_lines(os.path.join(root, "train", "train-2.txt"), aspec_train_lines(train[third : 2 * third], False)[0])
    write_lines(os.path.join(root, "train", "train-3.txt"), aspec_train_lines(train[2 * third :], False)[0])
    valid, test = fixture_pairs("valid"), fixture_pairs("test")
    write_lines(os.path.join(root, "dev", "dev.txt"), eval_lines(valid[:100]))
    write_lines(os.path.join(root, "devtest", "devtest.txt"), eval_lines(valid[100:]))
    write_lines(os.path.join(root, "test", "test.txt"), eval_lines(test[:60]))
    return planted


def prepare(*args):
    return subprocess.run([sys.executable, PREPARE, *map(str, args)], capture_output=True, text=True, env=ENV)


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read().split("\n")[:-1]


def normalised(text):
    return " ".join(unicodedata.normalize("NFKC", text).split())


def test_aspec_prepare_names_each_bad_line_and_keeps_pairs_aligned(tmp_path):
    planted = make_aspec(tmp_path / "ASPEC-JE")
    result = prepare("--format", "aspec", "--aspec-dir", tmp_path / "ASPEC-JE", "--out", tmp_path / "raw")
    assert result.returncode == 0, result.stderr
    summary = (tmp_path / "raw" / "prepare_summary.txt").read_text()
    assert summary.strip() in result.stdout.replace("| ", "")
    train_1 = next(line for line in summary.splitlines() if line.startswith("train-1.txt"))
    block = summary.split(train_1)[1].split("train-2.txt")[0]
    for reason, number in planted.items():
        assert f"for {reason} (lines {number}" in block, (reason, block)
    assert "normalised CRLF line endings on 1 lines" in block
    assert "train-3.txt" not in summary  # not used by default

    # every kept pair is a pair of the input, in input order
    source = [(normalised(ja), normalised(en)) for ja, en in fixture_pairs("train")[:1066]]
    kept = list(zip(read(tmp_path / "raw" / "train.ja"), read(tmp_path / "raw" / "train.en")))
    assert len(kept) > 900
    positions = [source.index(pair) for pair in kept]
    assert positions == sorted(positions)
    assert len(set(kept)) == len(kept)  # no duplicates left
    # devtest is the validation split, dev is kept for tuning, test is whole
    assert read(tmp_path / "raw" / "valid.en") == [normalised(e) for _, e in fixture_pairs("valid")[100:]]
    assert len(read(tmp_path / "raw" / "dev.ja")) == 100
    assert read(tmp_path / "raw" / "ref" / "test.ja") == [normalised(j) for j, _ in fixture_pairs("test")[:60]]


def test_missing_input_fails_before_any_work(tmp_path):
    make_aspec(tmp_path / "ASPEC-JE")
    os.remove(tmp_path / "ASPEC-JE" / "devtest" / "devtest.txt")
    result = prepare("--format", "aspec", "--aspec-dir", tmp_path / "ASPEC-JE", "--out", tmp_path / "raw",
                     "--train-files", "train-1,train-9")
    assert result.returncode == 2
    assert "devtest.txt: no such file" in result.stderr and "train-9.txt: no such file" in result.stderr
    assert not (tmp_path / "raw").exists()


def test_patent_lines_and_tsv_formats(tmp_path):
    pairs = fixture_pairs("train")[:300]
    for split, part in (("train", pairs[:200]), ("dev", pairs[200:250]), ("test", pairs[250:])):
        write_lines(str(tmp_path / "lines" / f"{split}.ja"), [ja.encode() for ja, _ in part])
        write_lines(str(tmp_path / "lines" / f"{split}.en"), [en.encode() for _, en in part])
        write_lines(str(tmp_path / "tsv" / f"{split}.tsv"), [f"{ja}\t{en}".encode() for ja, en in part]
                    + ([b"no tab here", "控制\x1b文字\tcontrol".encode()] if split == "train" else []))
    lines = prepare("--format", "lines", "--train", tmp_path / "lines" / "train", "--valid", tmp_path / "lines" / "dev",
                    "--test", tmp_path / "lines" / "test", "--out", tmp_path / "out_lines")
    tsv = prepare("--format", "tsv", "--train", tmp_path / "tsv" / "train.tsv", "--valid", tmp_path / "tsv" / "dev.tsv",
                  "--test", tmp_path / "tsv" / "test.tsv", "--out", tmp_path / "out_tsv")
    assert lines.returncode == 0 and tsv.returncode == 0, lines.stderr + tsv.stderr
    assert read(tmp_path / "out_lines" / "train.en") == read(tmp_path / "out_tsv" / "train.en")
    assert read(tmp_path / "out_lines" / "test.ja") == [normalised(j) for j, _ in pairs[250:]]
    summary = (tmp_path / "out_tsv" / "prepare_summary.txt").read_text()
    assert "dropped 1 for wrong number of fields (lines 201)" in summary
    assert "dropped 1 for control characters (lines 202)" in summary

    # the recipe's prepare step on the same files, both directions
    recipe = subprocess.run(
        ["bash", os.path.join(REPO, "recipes", "patent_ja_en", "run.sh"), "--tsv", str(tmp_path / "tsv" / "train.tsv"),
         str(tmp_path / "tsv" / "dev.tsv"), str(tmp_path / "tsv" / "test.tsv"), "--steps", "prepare", "--tiny",
         "--separate-vocab", "--work-dir", str(tmp_path / "work")],
        capture_output=True, text=True, env=ENV,
    )
    assert recipe.returncode == 0, recipe.stdout[-2000:] + recipe.stderr[-2000:]
    assert "dropped 1 for control characters (lines 202)" in recipe.stdout
    for direction in ("ja-en", "en-ja"):
        assert (tmp_path / "work" / f"bin-{direction}" / ".done").exists()
    assert (tmp_path / "work" / "spm" / "spm.ja.model").exists() and (tmp_path / "work" / "spm" / "spm.en.model").exists()

    # one sentence too many on one side: refused, nothing written
    with open(tmp_path / "lines" / "dev.en", "a") as f:
        f.write("one more\n")
    misaligned = prepare("--format", "lines", "--train", tmp_path / "lines" / "train", "--valid",
                         tmp_path / "lines" / "dev", "--test", tmp_path / "lines" / "test", "--out", tmp_path / "bad")
    assert misaligned.returncode == 2 and "50 source lines but 51 target lines" in misaligned.stderr
    assert not (tmp_path / "bad" / "prepare_summary.txt").exists()


def test_extract_hypotheses_orders_checks_and_joins(tmp_path):
    sys.path.insert(0, os.path.join(REPO, "scripts"))
    from extract_hypotheses import join_japanese_words, main

    assert join_japanese_words("猫 が いる 。") == "猫がいる。"
    assert join_japanese_words("USB メモリ を 2 GB の PC に") == "USBメモリを2 GBのPCに"
    out = tmp_path / "generate.out"
    out.write_text("S-1\tx\nH-1\t-0.5\tsecond\nH-0\t-0.1\tfirst\n", encoding="utf-8")
    assert main([str(out), str(tmp_path / "hyp"), "--expect", "2"]) == 0
    assert read(tmp_path / "hyp") == ["first", "second"]
    assert main([str(out), str(tmp_path / "hyp3"), "--expect", "3"]) == 2
    assert not (tmp_path / "hyp3").exists()


@pytest.mark.slow
def test_aspec_recipe_end_to_end_both_directions(tmp_path):
    make_aspec(tmp_path / "ASPEC-JE")
    result = subprocess.run(
        ["bash", os.path.join(REPO, "recipes", "aspec_ja_en", "run.sh"), "--aspec-dir", str(tmp_path / "ASPEC-JE"),
         "--steps", "prepare,train,generate,score", "--tiny", "--work-dir", str(tmp_path / "work")],
        capture_output=True, text=True, env=ENV,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for direction, tokenizer in (("ja-en", "tok:13a"), ("en-ja", "tok:ja-mecab")):
        run = tmp_path / "work" / direction / "hybrid_lstm_tiny"
        tgt = direction[-2:]
        for split in ("valid", "test"):
            refs = read(tmp_path / "work" / "raw" / "ref" / f"{split}.{tgt}")
            assert len(read(run / f"hyp.{split}.{tgt}")) == len(refs)
            scores = {s["name"]: s for s in json.loads((run / f"score.{split}.json").read_text())}
            assert tokenizer in scores["BLEU"]["signature"] and "chrF2" in scores
        assert f"| {direction} test: BLEU" in result.stdout
    # a second run reuses every finished step
    again = subprocess.run(
        ["bash", os.path.join(REPO, "recipes", "aspec_ja_en", "run.sh"), "--aspec-dir", str(tmp_path / "ASPEC-JE"),
         "--steps", "prepare,train,generate", "--tiny", "--work-dir", str(tmp_path / "work")],
        capture_output=True, text=True, env=ENV,
    )
    assert again.returncode == 0 and "prepare:" not in again.stdout and "train " not in again.stdout, again.stdout
