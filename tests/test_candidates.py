"""The ways to train, one object each (fairseq_hybrid.candidates.ways): the
race builds them, each prices itself, a plan's row gives its way back,
and the way says how a process of its own runs it and which command line
trains with it; the process that runs one knows every way's run and
every calibration, and nothing else."""

import pytest

from fairseq_hybrid.candidates import ways
from fairseq_hybrid.candidates.race import candidates, race
from fairseq_hybrid.candidates.run_one import RUNS
from fairseq_hybrid.planning.schedule_simulator import CostModel
from fairseq_hybrid.planning.twin_model import twin_model
from fairseq_hybrid.timing.calibration_runs import CALIBRATIONS

TRAIN = ["data-bin", "--arch", "hybrid_lstm_tiny"]


@pytest.fixture(scope="module")
def priced():
    """The race on 4 devices at 64 sentences under a made-up cost model,
    the groups' workers named."""
    model, cfg = twin_model("hybrid_lstm_tiny", 100, encoder_layers=4, decoder_layers=4)
    cost = CostModel(rates={"lstm/forward": 1e9}, fixed={"lstm/forward": 1e-4}, step_overhead=1e-3,
                     link_bandwidth=1e9)
    return race(model, cfg, lambda k: (cost, cost), 4, 64, 10, 12, (1,), workers="processes")


def test_the_race_holds_one_of_each_way(priced):
    assert [(type(way).__name__, way.name) for way in priced] == [
        ("OneDevice", "one GPU"), ("DataParallel", "DDP on 4"),
        ("GroupsUnderDDP", "2 groups of 2 under DDP, processes"), ("Group", "one group of 4, processes")]
    assert [(way.gpus, way.group_size, way.groups, way.sentences) for way in priced] == [
        (1, 1, 1, 64), (4, 1, 4, 16), (4, 2, 2, 32), (4, 4, 1, 64)]
    assert all(way.step is not None and way.step.total > 0 for way in priced)
    assert priced[2].choice["micro_batches"] == 1 and set(priced[3].choice) == {
        "micro_batches", "chunk_length", "softmax_chunks", "placement"}
    # 6 sentences on 4 devices: no whole share a device (DDP left out), 3 a group of 2
    cfg = twin_model("hybrid_lstm_tiny", 100, encoder_layers=4, decoder_layers=4)[1]
    assert [(way.kind, way.sentences) for way in candidates(cfg, 4, 6)] == [("one", 6), ("groups", 3), ("group", 6)]
    # a model with layers for 2 devices only: no group of 4
    cfg = twin_model("hybrid_lstm_tiny", 100, encoder_layers=2, decoder_layers=2)[1]
    assert [way.kind for way in candidates(cfg, 4, 8)] == ["one", "ddp", "groups"]


def test_a_row_gives_its_way_back(priced):
    """as_dict names the way; from_row builds the same way, which runs and
    reads as the priced one does."""
    for way in priced:
        row = way.as_dict(priced[0], priced[1])
        back = ways.from_row(row)
        assert type(back) is type(way) and row["way"] == way.kind and back.name == way.name == row["name"]
        assert back.workers == way.workers and back.choice == way.choice and back.step is None
        assert back.spec(TRAIN, ["cpu"] * 4, 3, 2) == way.spec(TRAIN, ["cpu"] * 4, 3, 2)
        assert back.command(TRAIN, ["--batch-size", "8"], None) == way.command(TRAIN, ["--batch-size", "8"], None)
    with pytest.raises(KeyError):
        ways.from_row({"name": "one GPU", "gpus": 1, "group_size": 1, "groups": 1, "sentences_per_group": 8})


def test_each_way_says_how_it_runs(priced):
    one, ddp, groups, group = (way.spec(TRAIN, ["cpu"] * 4, 3, 2) for way in priced)
    assert (one["kind"], one["devices"], one["threads"], one["group"]) == ("one", ["cpu"], 4, None)
    assert (ddp["kind"], ddp["devices"], ddp["threads"], ddp["ranks"], ddp["group"]) == ("ddp", ["cpu"] * 4, 1, 4,
                                                                                         None)
    assert (groups["kind"], groups["threads"], groups["ranks"]) == ("groups", 2, 2)
    assert groups["group"] == dict(priced[2].choice, workers="processes")
    assert (group["kind"], group["devices"], group["threads"], "ranks" in group) == ("group", ["cpu"] * 4, 4, False)
    assert priced[0].spec(TRAIN, ["cuda:0", "cuda:1"], 3, 2)["threads"] == 1  # a GPU's process: one thread
    assert all(spec["batches"] == 3 and spec["warmup"] == 2 and spec["train"] == TRAIN
               for spec in (one, ddp, groups, group))
    # the process that runs one: each way's own run, the calibrations, nothing else
    assert RUNS == {"one": ways.OneDevice.run, "ddp": ways.DataParallel.run, "group": ways.Group.run,
                    "groups": ways.GroupsUnderDDP.run, **CALIBRATIONS}
    assert ways.OneDevice.run is ways.Group.run and ways.DataParallel.run is ways.GroupsUnderDDP.run


def test_each_way_says_its_command_line(priced):
    batch = ["--batch-size", "16"]
    one, ddp, groups, group = (way.command(TRAIN, batch, None) for way in priced)
    assert one == ["fairseq-train", *TRAIN, *batch]
    assert ddp == ["fairseq-train", *TRAIN, *batch, "--distributed-world-size", "4"]
    choice = priced[3].choice
    assert group[:6] == ["fairseq-train", *TRAIN, *batch][:6] and "--hybrid-devices" in group
    assert group[group.index("--hybrid-devices") + 1] == "cuda:0,cuda:1,cuda:2,cuda:3"
    assert group[group.index("--hybrid-workers") + 1] == "processes"
    assert group[group.index("--hybrid-micro-batches") + 1] == str(choice["micro_batches"])
    assert groups[:5] == ["fairseq-hybrid-train", "--nproc-per-node", "2", "--devices-per-process", "2"]
    on_cpu = priced[2].command(TRAIN, batch, ["cpu"] * 4)
    assert on_cpu[5:8] == ["--device", "cpu", "--"]
    assert priced[3].command(TRAIN, batch, ["cpu"] * 4)[len(TRAIN) + 4] == "cpu,cpu,cpu,cpu"


def test_with_the_commands_batches_each_way_is_priced_on_every_one(priced):
    """Given the command's own batches, every way keeps the choice it made
    on the batch of the mean shape and is priced as the mean of its steps
    on each batch, at its share of the batch's sentences: a batch of
    sentences of several lengths is not priced as one of the mean's."""
    from fairseq_hybrid.forecasts.workload import Batch

    model, cfg = twin_model("hybrid_lstm_tiny", 100, encoder_layers=4, decoder_layers=4)
    cost = CostModel(rates={"lstm/forward": 1e9}, fixed={"lstm/forward": 1e-4}, step_overhead=1e-3,
                     link_bandwidth=1e9)
    real = [Batch([14, 13, 9, 9, 6, 4, 3, 2] * 8, 16, [16, 12, 9, 8, 7, 5, 3, 2] * 8),
            Batch([7] * 64, 8, [8] * 64)]
    on = race(model, cfg, lambda k: (cost, cost), 4, 64, 10, 12, (1,), workers="processes", batches=real)
    for mine, mean_shape in zip(on, priced):
        assert mine.choice == mean_shape.choice and mine.step.total != pytest.approx(mean_shape.step.total)
        each = []
        for batch in real:
            share = len(batch.sources) * mine.sentences // 64
            pricing = ways.Pricing(model, cfg, lambda k: (cost, cost), max(batch.sources), batch.width,
                                   micro_batch_counts=(1,), real=batch,
                                   choices={mine.group_size: mine.choice} if mine.choice else None)
            each.append(type(mine)(mine.gpus, mine.group_size, mine.groups, share, mine.workers).price(pricing))
        assert mine.step.total == pytest.approx(sum(way.step.total for way in each) / 2, rel=1e-12)
    # a share is the batch's first sentences: DDP on 4 prices 16 of the first batch's 64
    first = ways.Pricing(model, cfg, None, 0, 0, real=real[0]).batch(16)[0]
    assert first["src_lengths"].tolist() == real[0].sources[:16]
