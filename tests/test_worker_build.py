"""A stage builds only its own cells (parallel/step.py, ``worker``): every
cell of the step is there with its worker, inputs and outputs, so the
orders and messages agree everywhere, but only the stage's own cells can
run, and only its part of the batch is staged.  A stage in a process of
its own builds that way."""

import pytest

from conftest import build_model, make_sample
from fairseq_hybrid.harness.exactness import LAYERS, SRC_LENGTHS, TGT_LENGTHS, check_equal
from fairseq_hybrid.parallel import build_step
from fairseq_hybrid.parallel.recipe.device_plan import MODES, build_plan


def shape(built):
    return [(cell.name, cell.worker, list(cell.inputs), cell.outputs, cell.not_before) for cell in built.step.cells]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("count,micro_batches", [(2, 1), (3, 2)])
def test_a_worker_builds_its_own_cells_only(mode, count, micro_batches, dictionaries):
    src_dict, tgt_dict = dictionaries
    model = build_model("hybrid_lstm_tiny", src_dict, tgt_dict, **{**LAYERS, "encoder_bidirectional_layers": 2})
    sample = make_sample(src_dict, tgt_dict, SRC_LENGTHS, TGT_LENGTHS)
    plan = build_plan(",".join(["cpu"] * count), "", mode, 4, 4)
    args = (model, plan, sample["net_input"], sample["target"], None, 2, micro_batches if mode != "data" else 1)
    whole = build_step(*args)
    assert all(cell.run is not None for cell in whole.step.cells)
    for worker in range(count):
        mine = build_step(*args, worker=worker)
        assert shape(mine) == shape(whole)
        assert mine.results == whole.results
        built = [cell.name for cell in mine.step.cells if cell.run is not None]
        assert built == [cell.name for cell in whole.step.cells if cell.worker == worker] != []
        # the batch staged for this worker's cells only: its own attention-softmax shards' targets
        if mode != "data":
            from fairseq_hybrid.parallel.recipe.staging import stage_step

            staged = stage_step(model, plan, sample["net_input"], sample["target"], 2, micro_batches, only=worker)
            every = stage_step(model, plan, sample["net_input"], sample["target"], 2, micro_batches)
            padded = 0
            for batch, full in zip(staged.micro_batches, every.micro_batches):
                for shard_worker, targets in zip(batch.shard_workers, batch.targets):
                    assert (targets is not None) == (shard_worker == worker)
                # the source right-padded for the first encoder layer's worker only; each shard's
                # padding mask, made from its own rows, equal to the whole batch's rows
                assert (batch.sorted_source is not None) == (worker == plan.encoder[0])
                for mask, whole_mask, shard_worker in zip(batch.padding_masks, full.padding_masks,
                                                          batch.shard_workers):
                    assert (mask is None) == (shard_worker != worker)
                    if mask is not None:
                        assert mask.equal(whole_mask)
                        padded += int(mask.sum())
                assert batch.chunk_tokens == full.chunk_tokens
            if any(worker in batch.shard_workers for batch in staged.micro_batches):
                assert padded > 0  # the masks compared hold padding


def test_a_stage_in_a_process_builds_its_own_cells_only(dictionaries, monkeypatch):
    """Every stage of a group in processes builds with its own worker (the
    check runs in the forked stages and fails their step otherwise)."""
    from fairseq_hybrid import hybrid_group

    original = hybrid_group.build_step

    def checked(*args, worker=None, layout=None, **kwargs):
        built = original(*args, worker=worker, layout=layout, **kwargs)
        others = [cell.name for cell in built.step.cells if cell.run is not None and cell.worker != worker]
        if worker is None or others:
            raise AssertionError(f"stage built the cells of other workers: {others or 'all'}")
        if layout is None:
            raise AssertionError("stage laid the batch out itself instead of taking the trainer's layout")
        return built

    monkeypatch.setattr(hybrid_group, "build_step", checked)  # what the group hands its stages
    check_equal(["cpu"] * 3, "hybrid", dictionaries, group_options={"hybrid_workers": "processes"})


@pytest.mark.parametrize("micro_batches", [1, 3])
def test_a_worker_builds_from_the_layout_it_receives(micro_batches, dictionaries):
    """The trainer lays a batch out once (``lay_out_step``); a worker's build
    from that layout lists the same cells as the whole step's and makes only
    its own."""
    from fairseq_hybrid.parallel import lay_out_step

    src_dict, tgt_dict = dictionaries
    model = build_model("hybrid_lstm_tiny", src_dict, tgt_dict, **{**LAYERS, "encoder_bidirectional_layers": 1})
    sample = make_sample(src_dict, tgt_dict, SRC_LENGTHS, TGT_LENGTHS)
    plan = build_plan("cpu,cpu,cpu", "", "hybrid", 4, 4)
    whole = build_step(model, plan, sample["net_input"], sample["target"], None, 2, micro_batches)
    layout = lay_out_step(model, plan, sample["net_input"], sample["target"], 2, micro_batches)
    assert len(layout.micro_batches) == micro_batches
    for worker in range(3):
        mine = build_step(model, plan, None, None, None, worker=worker, layout=layout)
        assert shape(mine) == shape(whole) and mine.results == whole.results
        assert [cell.name for cell in mine.step.cells if cell.run is not None] == \
            [cell.name for cell in whole.step.cells if cell.worker == worker]


def test_a_shape_is_listed_once(dictionaries, monkeypatch):
    """Steps of one shape share one skeleton (cells, orders, routes), listed
    at the first of them; a batch of another shape lists its own."""
    from fairseq_hybrid.parallel.recipe import step_skeleton

    listed = []
    original = step_skeleton._list
    monkeypatch.setattr(step_skeleton, "_list", lambda *args: listed.append(args) or original(*args))
    monkeypatch.setattr(step_skeleton, "_kept", {})
    src_dict, tgt_dict = dictionaries
    model = build_model("hybrid_lstm_tiny", src_dict, tgt_dict, **LAYERS)
    plan = build_plan("cpu,cpu", "", "hybrid", 4, 4)
    first = build_step(model, plan, *_batch(src_dict, tgt_dict, [5, 3, 4], [4, 6, 2]), None)
    again = build_step(model, plan, *_batch(src_dict, tgt_dict, [7, 2, 6], [3, 5, 5]), None, worker=1)
    assert len(listed) == 1 and again.wiring is first.wiring
    assert [cell.name for cell in again.step.cells] == [cell.name for cell in first.step.cells]
    build_step(model, plan, *_batch(src_dict, tgt_dict, [5, 3, 4], [4, 6, 2]), None, 3)  # chunks of 3 steps
    assert len(listed) == 2


def _batch(src_dict, tgt_dict, source_lengths, target_lengths):
    sample = make_sample(src_dict, tgt_dict, source_lengths, target_lengths)
    return sample["net_input"], sample["target"]
