"""Packing sorted rows with one gather each way gives torch's packed
sequences and padded outputs, values and gradients, bit for bit."""

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from fairseq_hybrid.kernels.sorted_packing import pack_sorted, sorted_layout, unpack_sorted


@pytest.mark.parametrize("lengths,width", [([5, 5, 3, 1], 5), ([7, 2, 2], 9), ([1], 1), ([4, 4, 4], 4)])
def test_same_packed_sequence_outputs_and_gradients_as_torch(lengths, width):
    torch.manual_seed(0)
    lengths = torch.tensor(lengths)
    lstm = torch.nn.LSTM(3, 4, batch_first=True)
    inputs = torch.randn(len(lengths), width, 3, requires_grad=True)
    mine = inputs.detach().clone().requires_grad_()

    reference = pack_padded_sequence(inputs, lengths, batch_first=True, enforce_sorted=True)
    packed, positions = pack_sorted(mine, lengths)
    assert torch.equal(packed.batch_sizes, reference.batch_sizes)
    assert torch.equal(packed.data, reference.data)

    out_ref, (h_ref, c_ref) = lstm(reference)
    out, (h, c) = lstm(packed)
    padded_ref, _ = pad_packed_sequence(out_ref, batch_first=True, total_length=width)
    padded = unpack_sorted(out.data, positions, len(lengths), width)
    assert torch.equal(padded, padded_ref) and torch.equal(h, h_ref) and torch.equal(c, c_ref)

    weights = torch.randn_like(padded)
    ((padded_ref * weights).sum() + h_ref.sum()).backward()
    ((padded * weights).sum() + h.sum()).backward()
    assert torch.equal(mine.grad, inputs.grad)


def test_lengths_that_are_not_sorted_or_do_not_fit_are_refused():
    for lengths, width in (([2, 3], 3), ([4], 3), ([2, 0], 3), ([], 3)):
        with pytest.raises(ValueError, match="lengths must be non-increasing"):
            sorted_layout(torch.tensor(lengths, dtype=torch.long), width)


def test_chunk_values_are_the_chunk_lengths_of_checked_lengths():
    """Staging makes every time chunk's lengths from the lengths checked
    once (``sorted_values``): the same as ``chunk_lengths`` of the tensor,
    and the same layout."""
    from fairseq_hybrid.kernels.sorted_packing import chunk_lengths, chunk_values, sorted_values, values_layout

    lengths = torch.tensor([9, 9, 7, 4, 4, 2, 1])
    values = sorted_values(lengths, 9)
    assert values == (9, 9, 7, 4, 4, 2, 1)
    for start in range(10):
        for width in range(1, 10):
            chunk = chunk_values(values, start, width)
            assert chunk == tuple(chunk_lengths(lengths, start, width).tolist())
            if chunk:
                mine, reference = values_layout(chunk, width), sorted_layout(torch.tensor(chunk), width)
                assert all(torch.equal(a, b) for a, b in zip(mine, reference))
    assert chunk_values(values, 2, 3) == (3, 3, 3, 2, 2)
