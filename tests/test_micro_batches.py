"""Micro-batches (parallel/batch_rows.py): contiguous slices of
near-equal tokens, each with its rows of the batch, target and masks."""

import torch

from conftest import make_sample
from fairseq_hybrid.parallel.batch_rows import (micro_batch_rows, micro_batches_of, shard_rows, step_rows,
                                             token_balanced_slices)
from fairseq_hybrid.parallel.device_plan import build_plan
from fairseq_hybrid.parallel.single_device_masks import SingleDeviceMasks


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
