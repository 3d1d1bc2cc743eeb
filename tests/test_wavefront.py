"""The wavefront schedule (parallel/runtime/wavefront.py): clocks, cycles, each
worker's order."""

import pytest

from fairseq_hybrid.parallel.runtime.wavefront import CellSpec, clock_cycles, clocks, worker_orders


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


def test_a_later_micro_batch_enters_the_wavefront_later():
    """``not_before``: a chain that may start at clock 2 starts there, and its
    cells keep their distance; inputs still come at smaller clocks, so the
    order stays deadlock-free."""
    first = [CellSpec(0, []), CellSpec(1, [(0, 0)]), CellSpec(0, [(0, 0)])]
    second = [CellSpec(0, [], 2), CellSpec(1, [(3, 0)], 2), CellSpec(0, [(3, 0)], 2)]
    cell_clocks = clocks(first + second)
    assert cell_clocks == [0, 1, 1, 2, 3, 3]
    assert worker_orders(first + second, 2) == [[0, 2, 3, 5], [1, 4]]
