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

    def checked(*args, worker=None, **kwargs):
        built = original(*args, worker=worker, **kwargs)
        others = [cell.name for cell in built.step.cells if cell.run is not None and cell.worker != worker]
        if worker is None or others:
            raise AssertionError(f"stage built the cells of other workers: {others or 'all'}")
        return built

    monkeypatch.setattr(hybrid_group, "build_step", checked)  # what the group hands its stages
    check_equal(["cpu"] * 3, "hybrid", dictionaries, group_options={"hybrid_workers": "processes"})
