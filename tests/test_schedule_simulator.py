"""The schedule simulator (parallel/schedule_simulator.py): cost fitting,
replay of dependencies and device time, predictions built from the
engine's own cells."""

import pytest
import torch

from fairseq_hybrid.parallel.runtime.cell_graph import Cell, Work
from fairseq_hybrid.parallel.recipe.device_plan import build_plan
from fairseq_hybrid.planning.twin_model import batch, twin_model
from fairseq_hybrid.planning.cost_fit import fit
from fairseq_hybrid.planning.schedule_simulator import ReplicaCopy, CostModel, flops, replay, step_time
from fairseq_hybrid.parallel import build_step


def test_fit_recovers_rate_per_step_and_fixed_costs():
    samples = []
    for tokens, steps in [(100, 5), (400, 5), (400, 20), (1600, 40), (800, 10)]:
        work = Work("lstm", tokens, (8, 8, steps))
        seconds = flops(work, "forward") / 1e9 + 0.002 * steps + 0.01
        samples.append((work, "forward", seconds))
    cost = fit(samples)
    assert abs(cost.rates["lstm/forward"] / 1e9 - 1) < 1e-6
    assert abs(cost.per_step["lstm/forward"] - 0.002) < 1e-9 and abs(cost.fixed["lstm/forward"] - 0.01) < 1e-9


def test_fit_leaves_out_cells_slowed_by_something_else():
    """A few cells slowed by something outside them (here 3 of 40, ten
    times their time) are left out of the fit: the rate, the cost per time
    step and the fixed cost are those of the other cells.  Kept in, least
    squares would drop the rate and the fixed cost altogether (both come
    out negative) and price every cell by its time steps alone."""
    samples = []
    for index in range(40):
        tokens, steps = 100 * (1 + index % 8), 2 + (index * 7) % 30
        work = Work("lstm", tokens, (8, 8, steps))
        seconds = flops(work, "forward") / 1e9 + 0.002 * steps + 0.01
        samples.append((work, "forward", seconds * (10 if index in (5, 17, 29) else 1)))
    cost = fit(samples)
    assert cost.rates["lstm/forward"] == pytest.approx(1e9, rel=1e-6)
    assert cost.per_step["lstm/forward"] == pytest.approx(0.002, rel=1e-6)
    assert cost.fixed["lstm/forward"] == pytest.approx(0.01, rel=1e-6)


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


def _queued_cost(host: float, device_rate: float, **options) -> CostModel:
    """Gather cells (one FLOP each): ``host`` seconds of host time, 1 /
    ``device_rate`` seconds on the device."""
    return CostModel(rates={"gather/forward": device_rate, "gather/backward": device_rate},
                     fixed={"gather/forward": host, "gather/backward": host}, **options)


def test_a_queueing_host_runs_ahead_of_its_device():
    """One worker, a chain of cells: the host queues the next cell while the
    device runs the last, so the step is the first cell's host time plus the
    devices' work, not the sum of both."""
    one = Work("gather", 1, (1,))
    chain = [Cell(str(i), 0, [(i - 1, 0)] if i else [], None, one) for i in range(5)]
    assert replay(chain, 1, _queued_cost(1.0, 0.5)) == (15.0, 15.0)  # summed: 5 x (1 + 2)
    assert replay(chain, 1, _queued_cost(1.0, 0.5, host_queues=True)) == (11.0, 11.0)  # 1 + 5 x 2
    # a host slower than the device sets the pace instead: 5 x 2 + the last cell's device
    assert replay(chain, 1, _queued_cost(2.0, 2.0, host_queues=True)) == (10.5, 10.5)


def test_one_host_queues_for_every_worker():
    """K workers share one host (the GIL): independent cells whose device
    time is nothing take K host times, not one."""
    one = Work("gather", 1, (1,))
    cells = [Cell(str(w), w, [], None, one) for w in range(4)]
    assert replay(cells, 4, _queued_cost(1.0, float("inf"))) == (1.0, 1.0)
    assert replay(cells, 4, _queued_cost(1.0, float("inf"), host_queues=True)) == (4.0, 4.0)


def test_a_host_per_device_queues_the_workers_side_by_side():
    """--hybrid-workers processes (host_per_device): independent cells of K
    workers take one host time, not K; a worker's own cells still queue one
    after another, and a cell still waits until its input is queued."""
    one = Work("gather", 1, (1,))
    cells = [Cell(str(w), w, [], None, one) for w in range(4)]
    assert replay(cells, 4, _queued_cost(1.0, float("inf"), host_queues=True, host_per_device=True)) == (1.0, 1.0)
    chain = [Cell("a", 0, [], None, one), Cell("b", 0, [], None, one), Cell("c", 1, [(1, 0)], None, one)]
    # host: a 0..1 and b 1..2 on worker 0's host, c 2..3 on worker 1's (after b is queued); devices free
    assert replay(chain, 2, _queued_cost(1.0, float("inf"), host_queues=True, host_per_device=True))[0] == 3.0
    independent = chain[:2] + [Cell("c", 1, [], None, one)]
    assert replay(independent, 2, _queued_cost(1.0, float("inf"), host_queues=True, host_per_device=True))[0] == 2.0
    assert replay(independent, 2, _queued_cost(1.0, float("inf"), host_queues=True))[0] == 3.0


def test_queued_cells_wait_for_host_device_and_inputs():
    one = Work("gather", 1, (1,))
    cells = [Cell("a", 0, [], None, one), Cell("b", 1, [], None, one), Cell("c", 1, [(0, 0)], None, one),
             Cell("d", 0, [(2, 0)], None, one)]
    cost = _queued_cost(1.0, 0.5, link_latency=0.5, host_queues=True)
    # host: a 0..1, b 1..2, c 2..3 (after a's host and b's, its worker's last), d 3..4;
    # devices: a 1..3, b 2..4, c 4..6 (its device busy with b until 4; a's output there at 3.5), d 6.5..8.5
    forward, backward = replay(cells, 2, cost)
    assert forward == 8.5
    # backward, d c a | b in reverse: host d 0..1, c 1..2, b 2..3 (after c on worker 1), a 3..4 (after d, c);
    # devices: d 1..3, c 3.5..5.5, b 5.5..7.5, a 6..8 (c's gradient there at 6)
    assert backward == 8.0
    assert replay(cells, 2, _queued_cost(1.0, 0.5, link_latency=0.5)) == (10.0, 10.0)  # summed per cell


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


def test_a_group_pays_its_own_time_outside_the_cells():
    """On K CPU devices the main thread's part of the step runs with K
    intra-op threads: a group's step takes the group's overhead, one device
    and DDP (a process per device, built on one device's step) the single
    device's; a cost model without one (an older file) charges every step
    the same."""
    from fairseq_hybrid.forecasts.data_parallel_cost import data_parallel_step

    model, cfg = twin_model("hybrid_lstm_base", 8000)
    net_input, target = batch(8, [6] * 8, 5)
    cost = CostModel(step_overhead=0.06, group_step_overhead=0.04)
    one = step_time(model, build_plan("cpu", "", "hybrid", 2, 2), net_input, target, cost)
    assert one.extra == 0.06 and data_parallel_step(one, 1e6, 2, cost).extra == 0.06
    for mode in ("hybrid", "model", "data"):
        assert step_time(model, build_plan("cpu,cpu", "", mode, 2, 2), net_input, target, cost).extra == 0.04
    older = CostModel(step_overhead=0.06)
    assert step_time(model, build_plan("cpu,cpu", "", "hybrid", 2, 2), net_input, target, older).extra == 0.06


def test_replica_copies_hold_up_the_first_cell_and_end_the_backward():
    """A replica's parameters arrive before its first cell may start; its
    gradients leave after its last cell's backward and the step waits for
    them; nothing crosses a link between workers of one device."""
    one = Work("gather", 1, (1,))  # 4 bytes: 1 s over the link
    cells = [Cell("a", 0, [], None, one), Cell("b", 1, [], None, one), Cell("c", 1, [(0, 0)], None, one)]
    cost = CostModel(rates={"gather/forward": float("inf"), "gather/backward": float("inf")},
                     fixed={"gather/forward": 1.0, "gather/backward": 2.0}, link_bandwidth=4.0)
    copy = ReplicaCopy(worker=1, home=0, cells=(1,), values=10)  # 40 bytes: 10 s
    assert replay(cells, 2, cost) == (3.0, 5.0)
    # forward: a 0..1, b waits for its parameters (10) 10..11, c 11..12;
    # backward: c 0..2, b 2..4, its gradients 4..14, a 3..5
    assert replay(cells, 2, cost, copies=[copy]) == (12.0, 14.0)
    assert replay(cells, 2, cost, same_device=[0, 0], copies=[copy]) == replay(cells, 2, cost, same_device=[0, 0])
    # two replicas of one master: their copies share its link (c's
    # parameters 10..20, its gradients 2..12, then b's 12..22)
    two = [copy, ReplicaCopy(worker=1, home=0, cells=(2,), values=10)]
    assert replay(cells, 2, cost, copies=two) == (21.0, 22.0)


def test_a_step_prices_every_replica_the_engine_uses():
    """Hybrid K=2: the attention-softmax replica and the reverse direction
    of the bidirectional layer; hidden copies (the what-if) are never slower
    and a free link costs nothing."""
    model, cfg = twin_model("hybrid_lstm_base", 8000)
    plan = build_plan("cpu,cpu", "", "hybrid", cfg.encoder_layers, cfg.decoder_layers)
    net_input, target = batch(16, [10] * 16, 10)
    built = build_step(model, plan, net_input, target, None, 0)
    names = {built.step.cells[use.cells[0]].name.split(" chunk")[0] for use in built.replica_uses}
    assert names == {"attention-softmax shard 1", "encoder layer 0 reverse"}
    slow = CostModel(link_bandwidth=1e8, link_latency=1e-5)
    with_copies = step_time(model, plan, net_input, target, slow)
    hidden = step_time(model, plan, net_input, target, slow, replica_copies=False)
    assert hidden.total < with_copies.total
    free = CostModel()
    assert step_time(model, plan, net_input, target, free) == step_time(model, plan, net_input, target, free,
                                                                        replica_copies=False)
