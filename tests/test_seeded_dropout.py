"""Dropout from each cell's own seeded generator (parallel/runtime/seeded_dropout.py)."""

import torch

from fairseq_hybrid.parallel.runtime.seeded_dropout import SeededDropout, cell_generator


def test_seeded_dropout():
    dropout = SeededDropout(0.5).train()
    x = torch.ones(1000)
    with cell_generator(7, torch.device("cpu")):
        first = dropout(x)
    with cell_generator(7, torch.device("cpu")):
        second = dropout(x)
    assert torch.equal(first, second)
    assert 300 < int(first.eq(0).sum()) < 700 and set(first.unique().tolist()) == {0.0, 2.0}
    assert torch.equal(dropout.eval()(x), x)
    # cells seeded with neighbouring seeds draw independent masks: two
    # independent Bernoulli(0.9) masks agree on 0.9^2 + 0.1^2 = 82% of entries
    masks = []
    for seed in (11, 12):
        with cell_generator(seed, torch.device("cpu")):
            masks.append(SeededDropout(0.1).train()(torch.ones(200_000)).eq(0))
    assert abs(masks[0].eq(masks[1]).float().mean().item() - 0.82) < 0.005
