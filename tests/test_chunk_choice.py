"""``--hybrid-chunk-length auto``: the option, the choice per batch shape
under a cost model, and a group that chooses still computing the
single-device step."""

import pytest
import torch

from conftest import StandInTask, build_model
from fairseq_hybrid.criterions.hybrid_cross_entropy import HybridCrossEntropyCriterion
from fairseq_hybrid.harness.exactness import check_equal, loss_and_grads, single_and_group
from fairseq_hybrid.planning.chunk_choice import ChunkLengthChooser, candidate_lengths, default_cost_model
from fairseq_hybrid.parallel.recipe.device_plan import DevicePlanError, build_plan, chunk_length_option
from fairseq_hybrid.planning.twin_model import batch, twin_model
from fairseq_hybrid.planning.schedule_simulator import CostModel


def test_the_option_takes_a_count_or_auto_as_text_or_int():
    assert chunk_length_option("auto") == "auto"
    assert chunk_length_option(" 3 ") == 3
    assert chunk_length_option("0") == 0
    assert chunk_length_option(5) == 5  # older checkpoints and the Python API
    for bad in ("-1", "three", "", -2, 1.5, True):
        with pytest.raises(DevicePlanError, match="--hybrid-chunk-length"):
            chunk_length_option(bad)


def test_a_bad_chunk_length_fails_when_the_model_is_built_naming_the_option():
    with pytest.raises(ValueError, match="--hybrid-chunk-length 'often': give a number of time steps"):
        build_model("hybrid_lstm_tiny", hybrid_devices="cpu,cpu", hybrid_chunk_length="often")


def test_the_cost_model_serves_an_automatic_chunk_length_too(tmp_path):
    with pytest.raises(ValueError, match="--hybrid-cost-model is used by --hybrid-placement auto, "):
        build_model("hybrid_lstm_tiny", hybrid_devices="cpu,cpu", hybrid_cost_model=str(tmp_path / "c.json"),
                    hybrid_workers="threads")
    cost = tmp_path / "cost.json"
    cost.write_text('{"cost_model": {"fixed": {"lstm/forward": 1.0}}}')
    model = build_model("hybrid_lstm_tiny", hybrid_devices="cpu,cpu", hybrid_chunk_length="auto",
                        hybrid_cost_model=str(cost))
    assert model.hybrid_group.chunk_chooser.cost.fixed == {"lstm/forward": 1.0}


def test_candidates_go_up_to_one_chunk_a_layer():
    assert candidate_lengths(5, 3) == [0, 1, 2, 3, 4, 5]
    assert candidate_lengths(1, 1) == [0, 1]


def chooser(fixed_seconds: float, devices: int = 4, micro_batches=1, chunk_length="auto", softmax_chunks=1):
    model, cfg = twin_model("hybrid_lstm_paper", 32000)
    plan = build_plan(",".join(["cpu"] * devices), "", "hybrid", cfg.encoder_layers, cfg.decoder_layers)
    fixed = {key: fixed_seconds for key in ("lstm/forward", "lstm/backward", "attention_softmax/forward",
                                            "attention_softmax/backward")}
    return ChunkLengthChooser(model, plan, CostModel(fixed=fixed, default_rate=1e12), micro_batches, chunk_length,
                              softmax_chunks)


def test_free_cells_choose_more_chunks_than_costly_ones():
    net_input, target = batch(64, [40] * 64, 40)
    free = chooser(0.0)
    times = free.predicted_seconds(net_input, target)
    fine, one, span = free(net_input, target)
    assert one == 1 and span == 1 and 0 < fine <= 5 and times[fine, 1, 1] < times[0, 1, 1]  # shorter chunks than K = 4 chunks of 10
    # when a cell call costs far more than its arithmetic, the fewest cells
    # win: one chunk a layer
    assert chooser(1.0)(net_input, target) == (40, 1, 1)


def test_micro_batches_are_chosen_with_the_chunk_length():
    """--hybrid-micro-batches auto: free cells take micro-batches (they fill
    the pipeline), costly ones take none; with a fixed chunk length only the
    count is chosen."""
    net_input, target = batch(64, [40] * 64, 40)
    free = chooser(0.0, micro_batches="auto")
    assert set(count for _, count, _ in free.predicted_seconds(net_input, target)) == {1, 2, 4, 8}
    assert free(net_input, target)[1] > 1
    assert chooser(1.0, micro_batches="auto")(net_input, target) == (40, 1, 1)
    fixed = chooser(0.0, micro_batches="auto", chunk_length=0)
    assert {length for length, _, _ in fixed.predicted_seconds(net_input, target)} == {0}
    assert chooser(0.0, micro_batches="auto")(*batch(3, [40] * 3, 40))[1] <= 3  # never more than the sentences


def test_softmax_chunks_are_chosen_with_the_chunk_length():
    """--hybrid-softmax-chunks auto: each device's attention-softmax cells
    run between its own layers' cells, so a cell per chunk gains no
    overlap here and joining them saves their host time: one cell a shard
    (0) where calls cost, and on a tie too (the fewest cells)."""
    net_input, target = batch(64, [40] * 64, 40)  # 5 target chunks of 8
    free = chooser(0.0, chunk_length=8, softmax_chunks="auto")
    times = free.predicted_seconds(net_input, target)
    assert {span for _, _, span in times} == {1, 2, 4, 0} and {length for length, _, _ in times} == {8}
    assert max(times.values()) <= 1.001 * min(times.values()) and free(net_input, target) == (8, 1, 0)
    costly = chooser(1e-3, chunk_length=8, softmax_chunks="auto")
    times = costly.predicted_seconds(net_input, target)
    assert costly(net_input, target) == (8, 1, 0)
    # each device runs one shard: 4 fewer cells each way at 1 ms a call
    assert times[8, 1, 1] - times[8, 1, 0] == pytest.approx(8e-3, abs=1e-6)
    assert chooser(1e-3, chunk_length=8)(net_input, target) == (8, 1, 1)  # fixed unless auto


def test_the_search_stops_once_two_counts_in_a_row_are_no_faster():
    """auto tries counts of micro-batches from the fewest up and stops after
    two counts in a row that are no faster than the best before them: on
    CPU devices, where one micro-batch wins, eight are never simulated; and
    it still finds the whole search's best, also where two micro-batches
    lose to one but four win (short sentences, CPU cost model, one chunk a
    layer), which stopping at the first count no faster would miss."""
    model, cfg = twin_model("hybrid_lstm_base", 8000)
    plan = build_plan("cpu,cpu", "", "hybrid", cfg.encoder_layers, cfg.decoder_layers)
    on_cpu = ChunkLengthChooser(model, plan, None, "auto", 0)
    sample = batch(200, [10] * 200, 10)
    assert {count for _, count, _ in on_cpu.predicted_seconds(*sample, stop_early=True)} == {1, 2, 4}
    assert on_cpu(*sample) == (0, 1, 1)
    paper, paper_cfg = twin_model("hybrid_lstm_paper", 32000)
    four = build_plan("cpu,cpu,cpu,cpu", "", "hybrid", paper_cfg.encoder_layers, paper_cfg.decoder_layers)
    for cost in (default_cost_model([torch.device("cpu")] * 2), default_cost_model(), CostModel()):
        for sentences, source, target_length in ((16, 5, 6), (64, 30, 28)):
            choose = ChunkLengthChooser(paper, four, cost, "auto", "auto")
            sample = batch(sentences, [source] * sentences, target_length)
            whole = choose.predicted_seconds(*sample)
            assert whole[choose(*sample)] <= 1.001 * min(whole.values())
    cpu = ChunkLengthChooser(paper, four, default_cost_model([torch.device("cpu")] * 2), "auto", "auto")
    best = {count: min(seconds for (_, tried, _), seconds in cpu.predicted_seconds(*batch(16, [5] * 16, 6)).items()
                       if tried == count) for count in (1, 2, 4)}
    assert best[2] >= best[1] > best[4]  # the case a single count no faster would stop on


def test_a_shape_is_chosen_once_and_sentence_counts_and_widths_share_a_bucket():
    choose = chooser(0.0)
    calls = []
    choose.choose = lambda net_input, target: calls.append(net_input["src_tokens"].shape) or (2, 1)
    for sentences in (57, 64, 60):
        assert choose(*batch(sentences, [12] * sentences, 9)) == (2, 1)
    choose(*batch(65, [12] * 65, 9))
    choose(*batch(64, [12] * 64, 10))  # target widths 9 and 10 share a bucket of 4
    choose(*batch(64, [11] * 64, 12))  # source widths 11 and 12 too
    choose(*batch(64, [12] * 64, 13))
    choose(*batch(64, [13] * 64, 9))
    assert len(calls) == 4 and set(choose.choices) == {(64, 12, 12), (72, 12, 12), (64, 12, 16), (64, 16, 12)}


def test_the_default_cost_model_counts_host_time_per_cell():
    cost = default_cost_model()
    assert cost.fixed["lstm/forward"] > 0 and cost.fixed["attention_softmax/backward"] > 0
    assert default_cost_model([torch.device("cuda", 0), torch.device("cuda", 1)]).fixed == cost.fixed


def test_on_cpu_devices_auto_weighs_with_cell_times_measured_on_a_cpu():
    """On CPU devices a cell pays a fixed cost and a time per LSTM time step
    far above its op dispatch (planning/cpu_cost_model.json, fitted to
    measured cells): there, more and smaller cells do not pay, and auto
    keeps one micro-batch: eight cost over 10% more, where under FLOPs
    plus host time alone they cost about 1% more."""
    from fairseq_hybrid.parallel import build_plan
    from fairseq_hybrid.planning.twin_model import batch as twin_batch, twin_model

    cpu = default_cost_model([torch.device("cpu")] * 2)
    assert cpu.per_step["lstm/forward"] > 0 and cpu.slowdown > 1 and "fitted" in cpu.note
    model, cfg = twin_model("hybrid_lstm_base", 8000)
    plan = build_plan("cpu,cpu", "", "hybrid", cfg.encoder_layers, cfg.decoder_layers)
    sample = twin_batch(200, [10] * 200, 10)
    chooser = ChunkLengthChooser(model, plan, None, "auto", 0)
    assert chooser.cost.per_step == cpu.per_step
    times = chooser.predicted_seconds(*sample)
    assert chooser(*sample) == (0, 1, 1) and times[0, 8, 1] > 1.1 * times[0, 1, 1]
    flops_and_host = ChunkLengthChooser(model, plan, default_cost_model(), "auto", 0).predicted_seconds(*sample)
    assert flops_and_host[0, 8, 1] < 1.02 * flops_and_host[0, 1, 1]


@pytest.mark.parametrize("micro_batches, softmax_chunks", [("1", "1"), ("auto", "1"), ("1", "auto")])
@pytest.mark.parametrize("mode", ["hybrid", "model"])
def test_a_group_choosing_its_chunk_length_computes_the_single_device_step(mode, micro_batches, softmax_chunks,
                                                                         dictionaries):
    check_equal(["cpu"] * 2, mode, dictionaries, group_options={"hybrid_chunk_length": "auto",
                                                               "hybrid_micro_batches": micro_batches,
                                                               "hybrid_softmax_chunks": softmax_chunks})


def test_the_group_chooses_for_the_batch_it_runs(dictionaries):
    src_dict, tgt_dict = dictionaries
    criterion = HybridCrossEntropyCriterion(StandInTask(src_dict, tgt_dict), False, 0.1)
    _, group, sample = single_and_group(dictionaries, {"hybrid_devices": "cpu,cpu", "hybrid_chunk_length": "auto"})
    loss_and_grads(group, criterion, sample)
    chooser = group.hybrid_group.chunk_chooser
    assert list(chooser.choices) == [chooser.shape(sample["net_input"])]
    widths = sample["net_input"]["src_tokens"].size(1), sample["net_input"]["prev_output_tokens"].size(1)
    length, micro_batches, softmax_chunks = chooser.choices[chooser.shape(sample["net_input"])]
    assert length in candidate_lengths(*widths) and micro_batches == 1 and softmax_chunks == 1


def test_data_mode_has_no_chunks_to_choose(dictionaries):
    _, group, _ = single_and_group(dictionaries, {"hybrid_devices": "cpu,cpu", "hybrid_mode": "data",
                                                  "hybrid_chunk_length": "auto"})
    assert group.hybrid_group.chunk_chooser is None


def test_the_choice_is_simulated_on_a_host_copy_of_the_batch(dictionaries):
    """A new shape's candidates are built on the host: with the batch on
    the group's first (virtual) device, choosing allocates nothing on any
    device (built on the devices, every candidate and micro-batch would put
    the batch's pieces on each of them), and chooses as on the host."""
    from fairseq_hybrid.harness.measuring import on_device
    from fairseq_hybrid.harness.virtual_devices import virtual_devices

    net_input, target = batch(24, [9] * 24, 8)
    with virtual_devices() as harness:
        model = build_model("hybrid_lstm_tiny", *dictionaries, hybrid_devices="cpu:0,cpu:1")
        plan = model.hybrid_group.plan
        on_first = on_device({"net_input": net_input, "target": target}, "cpu:0")
        choose = ChunkLengthChooser(model, plan, CostModel(), micro_batches="auto", chunk_length="auto")
        live = [harness.memory.live(device) for device in (0, 1)]
        harness.memory.reset_peaks()
        on_devices = choose.predicted_seconds(on_first["net_input"], on_first["target"])
        assert [harness.memory.peak(device) for device in (0, 1)] == live
    on_host = ChunkLengthChooser(model, plan, CostModel(), micro_batches="auto", chunk_length="auto")
    assert on_devices == on_host.predicted_seconds(net_input, target)
