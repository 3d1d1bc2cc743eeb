"""Readers for licensed corpora: each kind of bad line is dropped, counted
under its reason with its line number, and never shifts a pair."""

from fairseq_hybrid.data.corpus_cleaning import (
    CONTROL_CHARS,
    DUPLICATE,
    EMPTY_SIDE,
    INVALID_UTF8,
    RATIO,
    TOO_LONG,
    WRONG_FIELDS,
    filter_pairs,
    read_aspec,
    read_tsv,
    total_counts,
)

ASPEC_TRAIN = "\n".join([
    "0.9 ||| D1 ||| 1 ||| 猫がいる。 ||| There is a cat.",  # 1 good
    "0.8 ||| D1 ||| 2 ||| 犬がいる。",  # 2 wrong number of fields
    "0.8 ||| D1 ||| 3 ||| 鳥がいる。 ||| There is a bird.\r",  # 3 CRLF: kept, normalised
    "0.7 ||| D1 ||| 4 |||  ||| An empty Japanese side.",  # 4 empty side
    "0.7 ||| D1 ||| 5 ||| 魚\x07がいる。 ||| A fish.",  # 5 control character
    "0.6 ||| D2 ||| 6 ||| ＡＢＣの装置 ||| The ABC device",  # 6 good, full width normalised
    "0.6 ||| D2 ||| 7 ||| 長い ||| " + " ".join(["word"] * 60),  # 7 over-long and ratio outlier
    "0.5 ||| D2 ||| 8 ||| 猫がいる。 ||| There is a cat.",  # 8 exact duplicate of 1
    "0.5 ||| D2 ||| 9 ||| 一 二 三 四 五 六 七 八 ||| one",  # 9 length-ratio outlier
]).encode() + (
    b"\n0.4 ||| D2 ||| 10 ||| \xff\xfe ||| bad bytes\n"  # 10 invalid UTF-8
    + "0.4 ||| D2 ||| 11 ||| 最後 ||| The last one.\n".encode()  # 11 good
)


def test_aspec_train_each_bad_line_is_named_and_pairs_stay_aligned():
    pairs, report = read_aspec(ASPEC_TRAIN, "train-1.txt", train=True)
    # Raw Japanese has no spaces: count its characters, English words.
    kept = filter_pairs(pairs, report, max_tokens=50, max_ratio=3.0, deduplicate=True, count_src=len)
    assert [n for n, _, _ in kept] == [1, 3, 6, 11]
    assert kept[1] == (3, "鳥がいる。", "There is a bird.")
    assert kept[2] == (6, "ABCの装置", "The ABC device")
    assert dict(report.dropped) == {
        WRONG_FIELDS: [2], EMPTY_SIDE: [4], CONTROL_CHARS: [5], TOO_LONG: [7],
        DUPLICATE: [8], RATIO: [9], INVALID_UTF8: [10],
    }
    assert report.read == 11 and report.kept == 4 and report.crlf_normalised == 1
    summary = "\n".join(report.summary_lines())
    for reason in (WRONG_FIELDS, EMPTY_SIDE, CONTROL_CHARS, TOO_LONG, DUPLICATE, RATIO, INVALID_UTF8):
        assert f"for {reason} (lines " in summary
    assert "normalised CRLF line endings on 1 lines" in summary


def test_aspec_dev_format_has_four_fields():
    data = "D1 ||| 1 ||| 猫 ||| cat\n0.9 ||| D1 ||| 2 ||| 犬 ||| dog\n".encode()
    pairs, report = read_aspec(data, "dev.txt", train=False)
    assert pairs == [(1, "猫", "cat")]
    assert report.dropped[WRONG_FIELDS] == [2]


def test_tsv_pairs_and_filters_off_by_default():
    data = "猫\tcat\n猫\tcat\nno tab here\n".encode()
    pairs, report = read_tsv(data, "corpus.tsv")
    kept = filter_pairs(pairs, report)
    assert [n for n, _, _ in kept] == [1, 2]
    assert dict(report.dropped) == {WRONG_FIELDS: [3]}
    assert total_counts([report]) == {WRONG_FIELDS: 1}
