"""The hybrid group computes what one device computes: for K = 1..4 CPU
devices and each mode, the loss, the logging outputs and every parameter's
gradient equal the single-device model's (fp32, dropout off) on
variable-length batches.  CUDA variants run where CUDA devices exist."""

import pytest
import torch

from conftest import StandInTask, build_model, make_sample
from fairseq_hybrid.harness.exactness import LAYERS, SRC_LENGTHS, TGT_LENGTHS, check_equal, loss_and_grads, single_and_group
from fairseq_hybrid.criterions.hybrid_cross_entropy import HybridCrossEntropyCriterion
from fairseq_hybrid.parallel.recipe.device_plan import MODES


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_cpu_group_equals_one_device(count, mode, dictionaries):
    check_equal(["cpu"] * count, mode, dictionaries)


@pytest.mark.parametrize("mode", MODES)
def test_tied_embeddings_and_residual_in_a_group(mode, dictionaries):
    check_equal(["cpu"] * 3, mode, dictionaries, share_decoder_input_output_embed=True, residual=True,
                attention_type="mlp")


CUDA_COUNT = torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.skipif(CUDA_COUNT < 1, reason="needs a CUDA device")
@pytest.mark.parametrize("mode,micro_batches", [("hybrid", 1), ("model", 1), ("data", 1), ("hybrid", 3)])
def test_cuda_group_equals_one_device(mode, micro_batches, dictionaries):
    devices = [f"cuda:{i % CUDA_COUNT}" for i in range(min(4, max(2, CUDA_COUNT)))]
    check_equal(devices, mode, dictionaries, group_options={"hybrid_micro_batches": micro_batches})


def test_batch_smaller_than_the_group(dictionaries):
    """A batch of 2 sentences on 4 devices: 2 shards, same result."""
    src_dict, tgt_dict = dictionaries
    criterion = HybridCrossEntropyCriterion(StandInTask(src_dict, tgt_dict), False, 0.0)
    single, group, _ = single_and_group(dictionaries, {"hybrid_devices": "cpu,cpu,cpu,cpu", "hybrid_mode": "data"})
    sample = make_sample(src_dict, tgt_dict, [3, 6], [5, 2])
    torch.testing.assert_close(criterion(group, sample)[0], criterion(single, sample)[0], rtol=1e-5, atol=0)


@pytest.mark.parametrize("mode", MODES)
def test_dropout_with_a_fixed_seed_gives_identical_runs(mode, dictionaries):
    src_dict, tgt_dict = dictionaries
    criterion = HybridCrossEntropyCriterion(StandInTask(src_dict, tgt_dict), False, 0.1)
    sample = make_sample(src_dict, tgt_dict, SRC_LENGTHS, TGT_LENGTHS)
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        model = build_model("hybrid_lstm_tiny", src_dict, tgt_dict, **LAYERS, dropout=0.3, hybrid_devices="cpu,cpu,cpu",
                            hybrid_mode=mode, hybrid_chunk_length=2)
        torch.manual_seed(5)
        runs.append(loss_and_grads(model.train(), criterion, sample))
    assert torch.equal(runs[0][0], runs[1][0])
    for name in runs[0][2]:
        assert torch.equal(runs[0][2][name], runs[1][2][name]), name
    # and dropout really is on: a different seed gives a different loss
    torch.manual_seed(6)
    assert not torch.equal(loss_and_grads(model, criterion, sample)[0], runs[0][0])




@pytest.mark.parametrize("chunk_length", [0, "auto"])
@pytest.mark.parametrize("mode", ["hybrid", "model"])
@pytest.mark.parametrize("count", [1, 2, 3, 4])
@pytest.mark.parametrize("micro_batches", [2, 4])
def test_micro_batches_compute_the_batchs_step(micro_batches, count, mode, chunk_length, dictionaries):
    """--hybrid-micro-batches M: the batch's rows in M slices, each its own
    chain of cells; the loss sums add up to the batch's, so loss, logging
    and gradients equal one device's on the whole batch."""
    check_equal(["cpu"] * count, mode, dictionaries,
                group_options={"hybrid_micro_batches": micro_batches, "hybrid_chunk_length": chunk_length})


def test_micro_batches_are_chains_of_their_own(dictionaries):
    """Each micro-batch's cells are named for its rows and read only cells
    of their own micro-batch; together the slices cover every row once,
    with near-equal tokens."""
    from fairseq_hybrid.parallel.recipe.batch_rows import micro_batch_rows
    from fairseq_hybrid.parallel import build_step

    src_dict, tgt_dict = dictionaries
    _, group, sample = single_and_group(dictionaries, {"hybrid_devices": "cpu,cpu", "hybrid_micro_batches": 3})
    net_input, target = sample["net_input"], sample["target"]
    rows = micro_batch_rows(net_input, target, 3, tgt_dict.pad())
    assert [r.start for r in rows] == [0, rows[0].stop, rows[1].stop] and rows[-1].stop == len(SRC_LENGTHS)
    built = build_step(group, group.hybrid_group.plan, net_input, target, lambda *a: (a[0].sum(),), 0,
                              micro_batches=3)
    prefixes = [f"micro-batch {r.start}-{r.stop - 1}: " for r in rows]
    owner = [next(p for p in prefixes if cell.name.startswith(p)) for cell in built.step.cells]
    for index, cell in enumerate(built.step.cells):
        assert all(owner[producer] == owner[index] for producer, _ in cell.inputs), cell.name
    assert len(built.results) == 3 * len(group.hybrid_group.plan.shard_workers) * 2
    # one parameter copy and one gradient send per replica and worker, over all micro-batches
    assert len({(id(use.replicas), use.worker) for use in built.replica_uses}) == len(built.replica_uses)
    assert micro_batch_rows(net_input, target, 1, tgt_dict.pad()) == [None]
    assert len(micro_batch_rows(net_input, target, 50, tgt_dict.pad())) == len(SRC_LENGTHS)


def test_micro_batches_are_staggered_into_the_wavefront(dictionaries):
    """Micro-batch m's cells start no earlier than m strides of clocks, so
    device 0 runs micro-batch 0's first cells before micro-batch 1's."""
    from fairseq_hybrid.parallel import build_step

    _, group, sample = single_and_group(dictionaries, {"hybrid_devices": "cpu,cpu"})
    built = build_step(group, group.hybrid_group.plan, sample["net_input"], sample["target"],
                              lambda *a: (a[0].sum(),), 1, micro_batches=3)
    starts = sorted({cell.not_before for cell in built.step.cells})
    assert len(starts) == 3 and starts[0] == 0 and starts[1] > 0 and starts[2] == 2 * starts[1]


@pytest.mark.parametrize("mode", ["hybrid", "model"])
@pytest.mark.parametrize("count", [2, 4])
def test_equal_source_lengths_run_unpacked_and_equal_one_device(count, mode, dictionaries, monkeypatch):
    """Where every sentence runs through a whole time chunk (equal source
    lengths here, or an early chunk), the encoder's cells run the LSTM on
    the batch-first rows without packing; the step is the same."""
    from fairseq_hybrid.harness import exactness
    from fairseq_hybrid.models import lstm_stacks

    monkeypatch.setattr(exactness, "SRC_LENGTHS", [8] * len(SRC_LENGTHS))
    packed = []
    real = lstm_stacks.lstm_packed
    monkeypatch.setattr(lstm_stacks, "lstm_packed", lambda *args: packed.append(1) or real(*args))
    check_equal(["cpu"] * count, mode, dictionaries)
    # the single-device model packs (nn.LSTM on a PackedSequence, not lstm_packed); no cell of the group did
    assert packed == []
