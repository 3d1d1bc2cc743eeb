"""The stages' gradient parts added in one fixed order as they arrive
(parallel/processes/gradient_sums.py): any arrival order gives the same
sum to the bit, parts are added while a stage still runs its pass, a lone
part is lent without a copy."""

import itertools

import pytest
import torch

from fairseq_hybrid.parallel.processes.gradient_sums import StageOrderSums


def parts_of(seed, stages, size=1000):
    generator = torch.Generator().manual_seed(seed)
    return {stage: torch.randn(size, generator=generator, dtype=torch.float32) * 10 ** stage
            for stage in range(stages)}


def fixed_order_sum(mid, reply):
    """The order the module promises: hand-overs in stage order, then replies."""
    order = [mid[stage] for stage in sorted(mid)] + [reply[stage] for stage in sorted(reply)]
    total = order[0] + order[1]
    for part in order[2:]:
        total = total + part
    return total


@pytest.mark.parametrize("seed", range(3))
def test_every_arrival_order_gives_the_fixed_orders_sum_bit_for_bit(seed):
    stages = 3
    mid, reply = parts_of(seed, stages), parts_of(seed + 10, stages)
    reply.pop(1)  # stage 1 fills the parameter only in the middle of its pass
    expected = fixed_order_sum(mid, reply)
    events = [("mid", stage) for stage in mid] + [("end", stage) for stage in range(stages)]
    orders = 0
    for order in itertools.permutations(events):
        # a stage's hand-over comes before its reply (its end)
        if any(order.index(("mid", stage)) > order.index(("end", stage)) for stage in mid):
            continue
        param = torch.nn.Parameter(torch.zeros(1000))
        sums = StageOrderSums([param], stages, {})
        for kind, stage in order:
            if kind == "mid":
                sums.offer(stage, [0], [mid[stage]], mid_pass=True)
            else:
                if stage in reply:
                    sums.offer(stage, [0], [reply[stage]], mid_pass=False)
                sums.end(stage)
        sums.into_params()
        assert torch.equal(param.grad, expected), order
        orders += 1
    assert orders == 90  # of the 6! orders, those with each hand-over before its end (half, for each of 3)


def test_parts_are_added_while_a_stage_still_runs_its_pass():
    mid = parts_of(0, 2)
    param = torch.nn.Parameter(torch.zeros(1000))
    sums = StageOrderSums([param], 2, {})
    sums.offer(1, [0], [mid[1]], mid_pass=True)
    assert sums.added_early == 0  # stage 0's part comes first in the order
    sums.offer(0, [0], [mid[0]], mid_pass=True)
    assert sums.added_early == 1  # added at once, though neither stage has ended
    assert torch.equal(sums.total[0], mid[0] + mid[1])
    sums.end(1)
    sums.end(0)
    sums.into_params()
    assert torch.equal(param.grad, mid[0] + mid[1])


def test_a_lone_part_is_lent_and_a_second_pass_adds_into_the_gradient():
    lone = torch.arange(4.0)
    params = [torch.nn.Parameter(torch.zeros(4)), torch.nn.Parameter(torch.zeros(4))]
    params[1].grad = torch.ones(4)  # a backward pass before this one, not yet used by the optimizer
    sums = StageOrderSums(params, 2, {})
    sums.offer(1, [0, 1], [lone, lone], mid_pass=False)
    sums.end(1)
    sums.end(0)
    lent = sums.into_params()
    assert params[0].grad is lone and lent[0] is lone
    assert params[1].grad.tolist() == [1.0, 2.0, 3.0, 4.0] and 1 not in lent


def test_a_parameter_handed_over_twice_in_a_pass_is_refused_and_an_early_ask_too():
    param = torch.nn.Parameter(torch.zeros(2))
    sums = StageOrderSums([param], 2, {})
    sums.offer(0, [0], [torch.ones(2)], mid_pass=True)
    with pytest.raises(ValueError, match="stage 0 handed over parameter 0 twice"):
        sums.offer(0, [0], [torch.ones(2)], mid_pass=True)
    with pytest.raises(ValueError, match="before every stage ended"):
        sums.into_params()
