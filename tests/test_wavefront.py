"""The wavefront schedule (parallel/wavefront.py): clocks, cycles, each
worker's order."""

import pytest

from fairseq_hybrid.parallel.wavefront import CellSpec, clock_cycles, clocks, worker_orders


def grid(layers, chunks):
    """Cells (l, c) reading (l - 1, c) and (l, c - 1), layer l on worker l % 2."""
    cells, index = [], {}
    for layer in range(layers):
        for chunk in range(chunks):
            inputs = [(index[p], 0) for p in ((layer - 1, chunk), (layer, chunk - 1)) if p in index]
            index[(layer, chunk)] = len(cells)
            cells.append(CellSpec(layer % 2, inputs))
    return cells, index


def test_wavefront_clock_is_layer_plus_chunk():
    cells, index = grid(3, 4)
    cell_clocks = clocks(cells)
    for (layer, chunk), i in index.items():
        assert cell_clocks[i] == layer + chunk
    cycles = list(clock_cycles(cells))
    assert len(cycles) == 3 + 4 - 1
    assert sorted(i for cycle in cycles for i in cycle) == list(range(12))
    orders = worker_orders(cells, 2)
    for order in orders:
        assert [cell_clocks[i] for i in order] == sorted(cell_clocks[i] for i in order)


def test_a_cell_may_only_read_earlier_cells():
    with pytest.raises(ValueError, match="not listed before"):
        clocks([CellSpec(0, [(1, 0)]), CellSpec(0, [])])
