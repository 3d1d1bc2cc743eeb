"""Which rows of a batch go where (parallel/batch_rows.py): shards, dealt shares."""

from fairseq_hybrid.parallel.batch_rows import batch_slices


def test_batch_slices_cover_the_batch_without_empty_shards():
    assert batch_slices(7, 3) == [slice(0, 3), slice(3, 5), slice(5, 7)]
    assert batch_slices(2, 4) == [slice(0, 1), slice(1, 2)]
    assert batch_slices(5, 1) == [slice(0, 5)]


def test_dealt_rows_follow_the_weights_and_never_take_a_row_back():
    from fairseq_hybrid.parallel.batch_rows import dealt_rows

    assert dealt_rows(10, (1, 1, 1, 1)) == (3, 3, 2, 2)  # round-robin, the first among equals first
    assert dealt_rows(14, (3, 0, 2, 2)) == (6, 0, 4, 4)
    for weights in ((28, 24, 24, 24), (3, 1), (1, 5, 2), (1, 1, 1)):
        previous = (0,) * len(weights)
        for rows in range(300):
            dealt = dealt_rows(rows, weights)
            assert sum(dealt) == rows and all(a >= b for a, b in zip(dealt, previous)), (weights, rows)
            share = [rows * w / sum(weights) for w in weights]
            assert all(abs(d - s) < 1 for d, s in zip(dealt, share)), (weights, rows, dealt)
            previous = dealt


def test_a_micro_batchs_shards_add_up_to_the_batchs_share():
    """Eight micro-batches of 64 rows with weights 28:24:24:24: rounded in
    each micro-batch the first of the three equal shards would get 16 rows
    every time (128 in all, the same as equal shards); dealt over the batch
    they get 123, as the weights say."""
    from fairseq_hybrid.parallel.batch_rows import dealt_slices, weighted_slices

    weights = (28, 24, 24, 24)
    rounded = [0] * 4
    dealt = [0] * 4
    for first in range(0, 512, 64):
        for index, rows in enumerate(weighted_slices(64, weights)):
            rounded[index] += rows.stop - rows.start
        pieces = dealt_slices(first, 64, weights)
        assert pieces[0].start == 0 and pieces[-1].stop == 64  # contiguous, covering the micro-batch
        assert all(a.stop == b.start for a, b in zip(pieces, pieces[1:]))
        for index, rows in enumerate(pieces):
            dealt[index] += rows.stop - rows.start
    assert max(rounded[1:]) == 128
    assert dealt == [143, 123, 123, 123]  # 143.36 and 122.88 by the weights
