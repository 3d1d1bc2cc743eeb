"""The schedule simulator (parallel/schedule_simulator.py): cost fitting,
replay of dependencies and device time, predictions built from the
engine's own cells."""

import pytest
import torch

from fairseq_hybrid.parallel.cell_graph import Cell, Work
from fairseq_hybrid.parallel.device_plan import build_plan
from fairseq_hybrid.parallel.placement_search import batch, twin_model
from fairseq_hybrid.parallel.schedule_simulator import CostModel, fit, flops, replay, step_time


def test_fit_recovers_rate_per_step_and_fixed_costs():
    samples = []
    for tokens, steps in [(100, 5), (400, 5), (400, 20), (1600, 40), (800, 10)]:
        work = Work("lstm", tokens, (8, 8, steps))
        seconds = flops(work, "forward") / 1e9 + 0.002 * steps + 0.01
        samples.append((work, "forward", seconds))
    cost = fit(samples)
    assert abs(cost.rates["lstm/forward"] / 1e9 - 1) < 1e-6
    assert abs(cost.per_step["lstm/forward"] - 0.002) < 1e-9 and abs(cost.fixed["lstm/forward"] - 0.01) < 1e-9


def test_replay_follows_dependencies_devices_and_links():
    one = Work("gather", 1, (1,))
    cells = [Cell("a", 0, [], None, one), Cell("b", 1, [], None, one), Cell("c", 1, [(0, 0)], None, one),
             Cell("d", 0, [(2, 0)], None, one)]
    cost = CostModel(rates={"gather/forward": float("inf"), "gather/backward": float("inf")},
                     fixed={"gather/forward": 1.0, "gather/backward": 2.0}, link_latency=0.5)
    forward, backward = replay(cells, 2, cost)
    # a (0..1) and b (0..1) at once; c after a + link (1.5..2.5); d after c + link (3..4)
    assert forward == 4.0
    # backward: d (0..2), c after d + link (2.5..4.5), a after c + link (5..7), b on device 1 after c (4.5..6.5)
    assert backward == 7.0
    assert replay(cells, 2, cost, same_device=[0, 0])[0] == 3.0  # one device's two workers: no link


def test_two_devices_predicted_faster_and_data_mode_cells_are_whole_models():
    model, cfg = twin_model("hybrid_lstm_base", 8000)
    assert all(p.device.type == "meta" for p in model.parameters())
    net_input, target = batch(32, [20] * 16 + [12] * 16, 18)
    one = step_time(model, build_plan("cpu", "", "hybrid", 2, 2), net_input, target, CostModel())
    two = step_time(model, build_plan("cpu,cpu", "", "hybrid", 2, 2), net_input, target, CostModel())
    data = step_time(model, build_plan("cpu,cpu", "", "data", 2, 2), net_input, target, CostModel())
    assert two.total < one.total and data.total < one.total
    # data mode: the shard with the long sentences sets the pace
    long_rows, _ = batch(16, [20] * 16, 18)
    long_shard = step_time(model, build_plan("cpu", "", "hybrid", 2, 2), long_rows, target[:16], CostModel())
    torch.testing.assert_close(data.forward, long_shard.forward, rtol=1e-9, atol=0)
    # and with equal shards, perfect scaling of the floating-point work: half of one device
    even, _ = batch(32, [16] * 32, 18)
    one = step_time(model, build_plan("cpu", "", "hybrid", 2, 2), even, target, CostModel())
    data = step_time(model, build_plan("cpu,cpu", "", "data", 2, 2), even, target, CostModel())
    torch.testing.assert_close(data.forward, one.forward / 2, rtol=1e-6, atol=0)




def test_hidden_replica_copies_take_off_exactly_the_copies():
    """The what-if of replica copies hidden behind the cells: the step loses
    its parameter and gradient copies over the link and nothing else."""
    model, cfg = twin_model("hybrid_lstm_base", 8000)
    plan = build_plan("cpu,cpu", "", "hybrid", cfg.encoder_layers, cfg.decoder_layers)
    net_input, target = batch(16, [10] * 16, 10)
    link = CostModel(link_bandwidth=1e9, link_latency=1e-5)
    copied = sum(p.numel() for name, p in model.named_parameters() if name.startswith("decoder.attention_softmax."))
    with_copies = step_time(model, plan, net_input, target, link)
    hidden = step_time(model, plan, net_input, target, link, replica_copies=False)
    assert (hidden.forward, hidden.backward) == (with_copies.forward, with_copies.backward)
    assert with_copies.extra - hidden.extra == pytest.approx(2 * (1e-5 + 4.0 * copied / 1e9))
