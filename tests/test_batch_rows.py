"""Which rows of a batch go where (parallel/recipe/batch_rows.py): shards, dealt
shares, and micro-batches (contiguous slices of near-equal tokens, each
with its rows of the batch, target and masks)."""

import torch

from conftest import make_sample
from fairseq_hybrid.parallel.recipe.batch_rows import (batch_slices, micro_batch_rows, micro_batches_of, shard_rows,
                                             step_rows, token_balanced_slices)
from fairseq_hybrid.parallel.recipe.device_plan import build_plan
from fairseq_hybrid.parallel.recipe.single_device_masks import SingleDeviceMasks


def test_batch_slices_cover_the_batch_without_empty_shards():
    assert batch_slices(7, 3) == [slice(0, 3), slice(3, 5), slice(5, 7)]
    assert batch_slices(2, 4) == [slice(0, 1), slice(1, 2)]
    assert batch_slices(5, 1) == [slice(0, 5)]


def test_dealt_rows_follow_the_weights_and_never_take_a_row_back():
    from fairseq_hybrid.parallel.recipe.batch_rows import dealt_rows

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
    from fairseq_hybrid.parallel.recipe.batch_rows import dealt_slices, weighted_slices

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


def covers(slices, rows):
    return [r.start for r in slices][0] == 0 and slices[-1].stop == rows and all(
        a.stop == b.start and a.stop > a.start for a, b in zip(slices, slices[1:]))


def test_slices_cover_every_row_once_with_near_equal_tokens():
    tokens = [10, 9, 8, 7, 3, 2, 1, 1]
    slices = token_balanced_slices(tokens, 3)
    assert covers(slices, len(tokens)) and len(slices) == 3
    sums = [sum(tokens[s]) for s in slices]
    assert max(sums) - min(sums) <= max(tokens)
    assert token_balanced_slices([5] * 8, 4) == [slice(0, 2), slice(2, 4), slice(4, 6), slice(6, 8)]
    assert token_balanced_slices([1, 1], 4) == [slice(0, 1), slice(1, 2)]  # never an empty slice
    assert token_balanced_slices([0, 0, 0], 2) == [slice(0, 1), slice(1, 3)]


def test_each_micro_batch_takes_its_rows(dictionaries):
    src_dict, tgt_dict = dictionaries
    sample = make_sample(src_dict, tgt_dict, [9, 3, 7, 1, 12, 5, 6], [4, 10, 2, 8, 6, 1, 7])
    net_input, target = sample["net_input"], sample["target"]
    masks = SingleDeviceMasks(torch.arange(7.0)[:, None], [torch.arange(7.0)[:, None]], torch.arange(7.0),
                              [torch.arange(7.0)], torch.arange(7.0))
    plan = build_plan("cpu,cpu", "", "hybrid", 2, 2)
    pieces = step_rows(plan, net_input, target, 3, tgt_dict.pad())
    parts = list(micro_batches_of(net_input, target, masks, pieces))
    rows = micro_batch_rows(net_input, target, 3, tgt_dict.pad())
    assert [piece.rows for piece in pieces] == rows
    assert [part.index for part in parts] == [0, 1, 2] and covers(rows, 7)
    for part, slice_ in zip(parts, rows):
        assert torch.equal(part.net_input["src_tokens"], net_input["src_tokens"][slice_])
        assert torch.equal(part.target, target[slice_])
        assert torch.equal(part.masks.source, masks.source[slice_])
        assert part.name == f"micro-batch {slice_.start}-{slice_.stop - 1}: "
        # its part of the whole batch's shards, as dealt over the batch
        assert part.shards == shard_rows(plan, slice_.stop - slice_.start, slice_.start)
        assert covers([rows for _, rows in part.shards], slice_.stop - slice_.start)
    whole = list(micro_batches_of(net_input, target, masks, step_rows(plan, net_input, target, 1, tgt_dict.pad())))
    assert len(whole) == 1 and whole[0].net_input is net_input and whole[0].name == ""
    assert whole[0].shards == shard_rows(plan, 7)
