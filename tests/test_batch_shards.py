"""Cutting a batch into shards (parallel/batch_shards.py)."""

from fairseq_hybrid.parallel.batch_shards import batch_slices


def test_batch_slices_cover_the_batch_without_empty_shards():
    assert batch_slices(7, 3) == [slice(0, 3), slice(3, 5), slice(5, 7)]
    assert batch_slices(2, 4) == [slice(0, 1), slice(1, 2)]
    assert batch_slices(5, 1) == [slice(0, 5)]
