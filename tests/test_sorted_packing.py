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
