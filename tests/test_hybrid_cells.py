"""A step cut into cells (parallel/recipe/hybrid_cells.py): time chunks, named
outputs, and exactness of the step's less common paths (time chunks,
several bidirectional layers, explicit placements, prefixes, validation
without gradients, a dtype change after a step)."""

import pytest
import torch

from conftest import StandInTask, build_model, make_sample
from fairseq_hybrid.harness.exactness import LAYERS, SRC_LENGTHS, TGT_LENGTHS, check_equal, loss_and_grads, single_and_group
from fairseq_hybrid.criterions.hybrid_cross_entropy import HybridCrossEntropyCriterion
from fairseq_hybrid.parallel.recipe.device_plan import build_plan
from fairseq_hybrid.parallel import build_step, softmax_groups, time_chunks


def test_time_chunks():
    assert time_chunks(7, 3, 2) == [slice(0, 3), slice(3, 6), slice(6, 7)]
    assert time_chunks(7, 0, 2) == [slice(0, 4), slice(4, 7)]
    assert time_chunks(1, 0, 4) == [slice(0, 1)]


def test_cells_name_their_outputs_and_readers_use_the_names(dictionaries):
    src_dict, tgt_dict = dictionaries
    model = build_model("hybrid_lstm_tiny", src_dict, tgt_dict, **LAYERS)
    sample = make_sample(src_dict, tgt_dict, SRC_LENGTHS, TGT_LENGTHS)
    built = build_step(model, build_plan("cpu,cpu", "", "hybrid", 4, 4), sample["net_input"],
                              sample["target"], None)
    step = built.step
    cells = {cell.name: index for index, cell in enumerate(step.cells)}
    assert step.cells[cells["encoder layer 0 forward"]].outputs == ("chunk 0", "chunk 1", "h", "c")
    assert step.cells[cells["decoder layer 3 chunk 1"]].outputs == ("h", "c", "shard 0", "shard 1")
    # shard 1 of chunk 1 reads the top decoder layer's rows of shard 1 and the encoder's shard 1
    reader = step.cells[cells["attention-softmax shard 1 chunk 1"]]
    assert list(reader.inputs) == [step.ref(cells["decoder layer 3 chunk 1"], "shard 1"),
                             step.ref(cells["encoder top states"], "shard 1")]
    with pytest.raises(KeyError, match="has no output 'shard 2'"):
        step.ref(cells["encoder top states"], "shard 2")


def test_softmax_groups():
    assert softmax_groups(5, 1) == [range(0, 1), range(1, 2), range(2, 3), range(3, 4), range(4, 5)]
    assert softmax_groups(5, 2) == [range(0, 2), range(2, 4), range(4, 5)]
    assert softmax_groups(5, 0) == softmax_groups(5, 9) == [range(0, 5)]


def test_an_attention_softmax_cell_over_several_chunks_reads_each_of_them(dictionaries):
    """--hybrid-softmax-chunks 2 over the decoder's 3 chunks: per shard a
    cell of chunks 0-1 and one of chunk 2, each reading the top decoder
    layer's chunks it spans (in time order) and the encoder's shard."""
    src_dict, tgt_dict = dictionaries
    model = build_model("hybrid_lstm_tiny", src_dict, tgt_dict, **LAYERS)
    sample = make_sample(src_dict, tgt_dict, SRC_LENGTHS, TGT_LENGTHS)
    step = build_step(model, build_plan("cpu,cpu", "", "hybrid", 4, 4), sample["net_input"],
                             sample["target"], None, chunk_length=4, softmax_chunks=2).step
    assert sample["net_input"]["prev_output_tokens"].size(1) == 11  # chunks of 4, 4 and 3 steps
    cells = {cell.name: index for index, cell in enumerate(step.cells)}
    names = [name for name in cells if name.startswith("attention-softmax")]
    assert names == ["attention-softmax shard 0 chunks 0-1", "attention-softmax shard 0 chunk 2",
                     "attention-softmax shard 1 chunks 0-1", "attention-softmax shard 1 chunk 2"]
    assert list(step.cells[cells["attention-softmax shard 1 chunks 0-1"]].inputs) == [
        step.ref(cells["decoder layer 3 chunk 0"], "shard 1"), step.ref(cells["decoder layer 3 chunk 1"], "shard 1"),
        step.ref(cells["encoder top states"], "shard 1")]
    rows = len(TGT_LENGTHS) - len(TGT_LENGTHS) // 2  # shard 0's sentences
    assert [step.cells[cells[name]].work.tokens for name in names[:2]] == [rows * 8, rows * 3]


@pytest.mark.parametrize("chunk_length", [1, 3])
def test_time_chunks_give_the_single_device_result(chunk_length, dictionaries):
    check_equal(["cpu"] * 2, "hybrid", dictionaries, hybrid_chunk_length=chunk_length)


@pytest.mark.parametrize("mode", ["hybrid", "model"])
def test_several_bidirectional_layers_with_residuals(mode, dictionaries):
    check_equal(["cpu"] * 3, mode, dictionaries, encoder_bidirectional_layers=3, residual=True,
                hybrid_chunk_length=4)


@pytest.mark.parametrize("placement", ["encoder=0,0,0,1;decoder=1,1,0,0", "encoder=1,1,1,1;decoder=0,0,0,0"])
def test_explicit_placements(placement, dictionaries):
    check_equal(["cpu"] * 2, "hybrid", dictionaries, group_options={"hybrid_placement": placement})


def test_ignore_prefix_size(dictionaries):
    src_dict, tgt_dict = dictionaries
    criterion = HybridCrossEntropyCriterion(StandInTask(src_dict, tgt_dict), False, 0.1, ignore_prefix_size=2,
                                            report_accuracy=True)
    single, group, sample = single_and_group(dictionaries, {"hybrid_devices": "cpu,cpu", "hybrid_chunk_length": 3})
    loss_ref, logging_ref, grads_ref = loss_and_grads(single, criterion, sample)
    loss, logging, grads = loss_and_grads(group, criterion, sample)
    torch.testing.assert_close(loss, loss_ref, rtol=1e-5, atol=0)
    # targets are the sentences plus </s>; the first two positions of each are left out
    assert logging["total"] == logging_ref["total"] == sum(max(0, n + 1 - 2) for n in TGT_LENGTHS)
    # the unsliced full-logits path agrees too
    full = HybridCrossEntropyCriterion(StandInTask(src_dict, tgt_dict), False, 0.1, ignore_prefix_size=2,
                                       output_loss_chunk_rows=0)
    torch.testing.assert_close(full(single, sample)[0], loss_ref, rtol=1e-5, atol=0)


@pytest.mark.parametrize("mode", ["hybrid", "model", "data"])
def test_validation_without_gradients(mode, dictionaries):
    src_dict, tgt_dict = dictionaries
    criterion = HybridCrossEntropyCriterion(StandInTask(src_dict, tgt_dict), False, 0.1)
    single, group, sample = single_and_group(dictionaries, {"hybrid_devices": "cpu,cpu,cpu", "hybrid_mode": mode})
    single.eval()
    group.eval()
    with torch.no_grad():
        loss, _, _ = criterion(group, sample)
        assert not loss.requires_grad
        torch.testing.assert_close(loss, criterion(single, sample)[0], rtol=1e-5, atol=0)


def test_bfloat16_group_after_a_float32_step(dictionaries):
    """The dtype path of --bf16/--fp16: parameters converted after the group
    has run (its replicas must follow), then the group still equals one
    device in the new dtype."""
    src_dict, tgt_dict = dictionaries
    criterion = HybridCrossEntropyCriterion(StandInTask(src_dict, tgt_dict), False, 0.1)
    single, group, sample = single_and_group(dictionaries, {"hybrid_devices": "cpu,cpu"})
    loss_and_grads(group, criterion, sample)
    single.to(torch.bfloat16)
    group.to(torch.bfloat16)
    loss_ref, _, grads_ref = loss_and_grads(single, criterion, sample)
    loss, _, grads = loss_and_grads(group, criterion, sample)
    assert all(p.dtype == torch.bfloat16 for p in group.parameters())
    torch.testing.assert_close(loss, loss_ref, rtol=1e-2, atol=0)
    for name in grads_ref:
        assert grads[name].dtype == torch.bfloat16, name
        torch.testing.assert_close(grads[name].float(), grads_ref[name].float(), rtol=2e-2, atol=1e-3, msg=name)


def test_the_schedule_drawn_in_the_design_notes(dictionaries):
    """docs/design.md draws this step's clocks; the drawing must stay true."""
    from fairseq_hybrid.parallel.runtime.wavefront import CellSpec, clocks

    src_dict, tgt_dict = dictionaries
    model = build_model("hybrid_lstm_tiny", src_dict, tgt_dict, encoder_layers=2, decoder_layers=2)
    sample = make_sample(src_dict, tgt_dict, [6, 5, 4, 6], [5, 6, 4, 3])
    cells = build_step(model, build_plan("cpu,cpu", "", "hybrid", 2, 2), sample["net_input"],
                              sample["target"], None).step.cells
    drawn = {
        "source embedding": (0, 0), "target embedding": (0, 0),
        "encoder layer 0 forward": (1, 0), "encoder layer 0 reverse": (1, 1),
        "decoder layer 0 chunk 0": (2, 0), "encoder layer 1 chunk 0": (2, 1),
        "decoder layer 0 chunk 1": (3, 0), "encoder layer 1 chunk 1": (3, 1),
        "encoder top states": (4, 1), "decoder layer 1 chunk 0": (4, 1),
        "attention-softmax shard 0 chunk 0": (5, 0), "decoder layer 1 chunk 1": (5, 1),
        "attention-softmax shard 1 chunk 0": (5, 1),
        "attention-softmax shard 0 chunk 1": (6, 0), "attention-softmax shard 1 chunk 1": (6, 1),
    }
    cell_clocks = clocks([CellSpec(cell.worker, cell.inputs) for cell in cells])
    assert {cell.name: (clock, cell.worker) for cell, clock in zip(cells, cell_clocks)} == drawn
