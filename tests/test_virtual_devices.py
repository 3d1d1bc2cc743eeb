"""The hybrid group on virtual devices: CPU devices cpu:0, cpu:1, ... that
behave like distinct GPUs (fairseq_hybrid.harness.virtual_devices).  The harness
itself, the exactness suite under it, and regression tests for what only
distinct devices show: a bidirectional layer's reverse direction running
away from its weights, gradient clipping and --fp16 across devices."""

import os
import sys

import pytest
import torch

from conftest import StandInTask, build_model, make_sample
from fairseq_hybrid.criterions.hybrid_cross_entropy import HybridCrossEntropyCriterion
from fairseq_hybrid.parallel.runtime import host_batch, thread_state
from fairseq_hybrid.parallel.recipe.device_plan import MODES
from fairseq_hybrid.harness.virtual_devices import virtual_devices
from fairseq_hybrid.harness.exactness import LAYERS, SRC_LENGTHS, TGT_LENGTHS, check_equal, loss_and_grads


def virtual(count):
    return [f"cpu:{index}" for index in range(count)]


# -- the harness ---------------------------------------------------------------


def test_mixing_devices_raises_as_cuda_does():
    with virtual_devices():
        a, b = torch.ones(3).to("cpu:0"), torch.ones(3).to("cpu:1")
        assert (a.device, b.device, (a * 2).device) == (torch.device("cpu", 0), torch.device("cpu", 1),
                                                      torch.device("cpu", 0))
        assert b.device.index == 1
        with pytest.raises(RuntimeError, match=r"same device.*cpu:0 and cpu:1.*aten\.add"):
            a + b
        with pytest.raises(RuntimeError, match=r"cpu:0 and cpu \(host memory\)"):
            a + torch.ones(3)  # a non-scalar host tensor, as a CPU tensor beside a CUDA one
        assert (a + torch.tensor(2.0)).device.index == 0  # host scalars are allowed, as on CUDA
        assert torch.zeros(2, device=torch.device("cpu", 1)).device.index == 1
        assert torch.zeros(2).device == torch.device("cpu")  # host factory
        assert a.cpu().device == torch.device("cpu")
        with pytest.raises(RuntimeError, match=r"element 1"):
            torch._foreach_mul_([a, b], torch.tensor(2.0).to("cpu:0"))  # a scalar tensor on the wrong device
        torch._foreach_mul_([a, b], 2.0)


def test_moves_carry_gradients_back_to_the_source_device():
    with virtual_devices():
        weight = torch.nn.Parameter(torch.ones(3).to("cpu:0"))
        moved = (weight * 3).to("cpu:1")
        assert moved.device.index == 1
        (moved * torch.ones(3).to("cpu:1")).sum().backward()
        assert weight.grad.device.index == 0
        torch.testing.assert_close(weight.grad.cpu(), torch.full((3,), 3.0))
        module = torch.nn.Linear(3, 2).to("cpu:1")
        assert module.weight.device.index == 1 and module(moved).device.index == 1


# -- the exactness suite on virtual devices ---------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_virtual_group_equals_one_device(count, mode, dictionaries):
    """Also defect 1's regression test: with the reverse direction of the
    bidirectional layer on the partner device but its weights left with the
    layer, every K >= 2 here raised "Expected all tensors to be on the same
    device" in the first forward pass.  Under virtual streams, with the batch
    on the first device as fairseq puts it: a stream race raises."""
    with virtual_devices() as harness:
        check_equal(virtual(count), mode, dictionaries, batch_on_first_device=True)
    if mode != "data":  # data mode runs the whole single-device model per shard
        assert harness.syncs == [], harness.syncs
    assert harness.streams.races == [] and harness.streams.ops > 0


def test_a_wait_for_the_gpu_outside_the_cells_is_recorded(dictionaries, monkeypatch):
    """A step's waits for a device are recorded wherever the step's thread
    is, not only in its cells: an ``.item()`` put by hand at the step's
    start (HybridGroup.loss_sums) is, with the line that called it, and
    nothing is recorded outside a step."""
    from fairseq_hybrid.hybrid_group import HybridGroup

    real = HybridGroup._loss_sums

    def with_an_item(self, net_input, target, shard_loss):
        net_input["src_lengths"].max().item()  # the host waits for the device
        return real(self, net_input, target, shard_loss)

    monkeypatch.setattr(HybridGroup, "_loss_sums", with_an_item)
    with virtual_devices() as harness:
        check_equal(virtual(2), "hybrid", dictionaries, batch_on_first_device=True)
        torch.ones(3).to("cpu:0").sum().item()  # outside a step: not the step's
    added = [sync for sync in harness.step_syncs if "with_an_item" in sync.caller]
    assert [(sync.op, sync.device) for sync in added] == [("_local_scalar_dense", 0)]
    assert added[0].cell == "outside the cells (MainThread)" and harness.syncs == []


def test_a_wait_at_the_groups_first_line_is_recorded(dictionaries, monkeypatch):
    """The recorder is on before the group's first line: an ``.item()`` put
    there by hand (HybridGroup.loss_sums) is recorded, with its line."""
    from fairseq_hybrid.hybrid_group import HybridGroup

    real = HybridGroup.loss_sums

    def item_first(self, net_input, target, shard_loss):
        net_input["src_lengths"].max().item()  # the host waits for the device
        return real(self, net_input, target, shard_loss)

    monkeypatch.setattr(HybridGroup, "loss_sums", item_first)
    with virtual_devices() as harness:
        check_equal(virtual(2), "hybrid", dictionaries, batch_on_first_device=True)
    added = [sync for sync in harness.step_syncs if "item_first" in sync.caller]
    assert [(sync.op, sync.device) for sync in added] == [("_local_scalar_dense", 0)]
    assert added[0].caller.endswith(f":{item_first.__code__.co_firstlineno + 1} (item_first)")


def test_a_wait_on_a_workers_thread_outside_its_cells_is_recorded(dictionaries, monkeypatch):
    """A worker's thread waits outside its cells too: where it adds the
    gradients its cell's readers handed back (CellGraph._backward_cell),
    an ``.item()`` put by hand is recorded, naming the line and the thread."""
    from fairseq_hybrid.parallel.runtime import cell_graph

    real = cell_graph.arrive

    def arrive_and_read(value, device, event=None):
        moved = real(value, device, event)
        if sys._getframe(1).f_code.co_name == "_backward_cell" and moved.numel():  # a gradient to add
            moved.reshape(-1)[0].item()  # the host waits for the device
        return moved

    monkeypatch.setattr(cell_graph, "arrive", arrive_and_read)
    with virtual_devices() as harness:
        check_equal(virtual(2), "hybrid", dictionaries, batch_on_first_device=True)
    summed = [sync for sync in harness.step_syncs if "arrive_and_read" in sync.caller]
    assert summed and all(sync.cell.startswith("outside the cells (hybrid") for sync in summed), summed[:3]
    assert harness.syncs == []


@pytest.mark.parametrize("mode, count", [("hybrid", 2), ("hybrid", 3), ("model", 2), ("data", 2), ("data", 3)])
def test_a_group_in_processes_equals_one_device_touches_only_its_own_devices_and_waits_only_for_its_results(
        mode, count, dictionaries):
    """Each stage process checks its own ops on its virtual device (forked
    with the trainer's harness, streams included) and reports what it
    recorded with its replies.  A group in processes equals one device;
    each stage reads and writes only its own device's memory (a replica's
    parameters come over the wire from the master's stage); and the step
    waits only where the loss sums and their gradients still cross host
    memory: a stage reading its loss sums back at the end of its forward
    pass, the trainer reading their gradients back (docs/processes.md)."""
    with virtual_devices() as harness:
        check_equal(virtual(count), mode, dictionaries, batch_on_first_device=True,
                    group_options={"hybrid_workers": "processes"})
    assert harness.stage_touched == {me: {me} for me in range(count)}
    if mode == "data":
        return  # each shard runs the whole single-device model, waits included (as with threads)
    waits = {(sync.op, os.path.basename(sync.caller.split(":")[0]), sync.cell)
             for sync in harness.syncs + harness.step_syncs}
    # the stages whose cells make loss sums: every shard's in hybrid mode, the last stage's in model mode
    with_results = range(count) if mode == "hybrid" else (count - 1,)
    assert waits == {("device-to-host copy", "stage.py", f"stage {me}") for me in with_results} | {
        ("device-to-host copy", "stage_processes.py", "outside the cells (MainThread)")}, waits
    assert harness.streams.ops > 0 and harness.streams.races == []


def test_a_wait_in_a_stages_cell_is_reported_with_its_line(dictionaries, monkeypatch):
    """An ``.item()`` put by hand where a stage's cells finish their LSTM
    layers is recorded in that stage's process and reaches the trainer's
    harness as a wait inside a cell, naming the cell, the stage and the
    line."""
    from fairseq_hybrid.models.lstm_stacks import LayerFinishing

    real = LayerFinishing.finish_layer

    def finish_and_read(self, index, outputs, inputs, reverse=None):
        outputs.reshape(-1)[0].item()  # the host waits for the device
        return real(self, index, outputs, inputs, reverse)

    monkeypatch.setattr(LayerFinishing, "finish_layer", finish_and_read)
    with virtual_devices() as harness:
        check_equal(virtual(2), "hybrid", dictionaries, batch_on_first_device=True,
                    group_options={"hybrid_workers": "processes"})
    read = [sync for sync in harness.syncs + harness.step_syncs if "finish_and_read" in sync.caller]
    assert all(sync in harness.syncs and sync.cell.startswith(("encoder layer ", "decoder layer ")) for sync in read)
    assert {sync.cell.rsplit(" in ", 1)[1] for sync in read} == {"stage 0", "stage 1"}, read[:4]
    line = f":{finish_and_read.__code__.co_firstlineno + 1} (finish_and_read)"
    assert all(sync.op == "_local_scalar_dense" and sync.caller.endswith(line) for sync in read)


@pytest.mark.parametrize("mode, options", [
    ("hybrid", {}),
    ("hybrid", {"group_options": {"hybrid_micro_batches": 2}}),
    ("model", {"encoder_bidirectional_layers": 2, "hybrid_chunk_length": 2}),
    ("hybrid", {"group_options": {"hybrid_dropout_masks": "single-device"}}),
])
def test_a_step_never_waits_for_a_device(mode, options, dictionaries):
    """From the group's entry to its loss sums and through the backward
    pass, staging included: no op makes the host wait for a device, with
    the batch handed over as fairseq's trainer hands it (moved to the
    first device from pinned memory, the host's kept)."""
    with virtual_devices() as harness:
        check_equal(virtual(3), mode, dictionaries, batch_on_first_device=True, **options)
    assert harness.step_syncs == [] and harness.syncs == []


def test_a_batch_only_on_a_device_is_read_back_once_and_caught(dictionaries):
    """Without the host's batch (a caller other than fairseq's trainer hands
    the group a batch on a device), staging reads it back: waits, recorded."""
    with virtual_devices() as harness:
        check_equal(virtual(2), "hybrid", dictionaries, batch_on_first_device=True)
        assert harness.step_syncs == []
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(host_batch, "_host", type(host_batch._host)())
            patch.setattr(host_batch, "remember", lambda *args: None)  # nothing kept
            check_equal(virtual(2), "hybrid", dictionaries, batch_on_first_device=True)
    waits = {(sync.op, sync.caller.rsplit("(", 1)[-1].rstrip(")")) for sync in harness.step_syncs}
    assert waits == {("device-to-host copy", "host_of")}
    assert len(harness.step_syncs) == 4  # src_tokens, src_lengths, prev_output_tokens, target: once each


def test_only_a_non_blocking_copy_from_pinned_memory_is_queued():
    """As CUDA's ``copy_`` (``cuda/Copy.cu``): from pinned memory with
    ``non_blocking`` the copy is queued; from pageable memory, from a
    strided pinned tensor, without ``non_blocking`` or back to the host,
    the host waits."""
    with virtual_devices() as harness, thread_state.step_scope():
        pageable = torch.arange(6)
        pinned = pageable.pin_memory()
        assert pinned.is_pinned() and not pageable.is_pinned() and torch.equal(pinned, pageable)
        pinned.to("cpu:1", non_blocking=True)
        assert harness.step_syncs == []
        pageable.to("cpu:1", non_blocking=True)
        pinned.to("cpu:1")
        pinned.to("cpu:1", non_blocking=True).cpu()
        pinned.view(2, 3).t().to("cpu:1", non_blocking=True)  # strided: through a pageable temporary
    assert [(sync.op, sync.device) for sync in harness.step_syncs] == [
        ("host-to-device copy", 1), ("host-to-device copy", 1), ("device-to-host copy", 1),
        ("host-to-device copy", 1)]


@pytest.mark.parametrize("softmax_chunks, options", [
    (0, {"hybrid_micro_batches": 2}),
    (2, {"hybrid_dropout_masks": "single-device"}),
    (4, {}),  # more than the step has: all of them
])
@pytest.mark.parametrize("mode", ["hybrid", "model"])
def test_attention_softmax_cells_over_several_chunks(mode, softmax_chunks, options, dictionaries):
    """--hybrid-softmax-chunks: cells that take several of the decoder's
    time chunks compute the single device's step, race-free, without a
    wait."""
    with virtual_devices() as harness:
        check_equal(virtual(3), mode, dictionaries, batch_on_first_device=True, hybrid_chunk_length=2,
                    group_options={"hybrid_softmax_chunks": str(softmax_chunks), **options})
    assert harness.streams.races == [] and harness.step_syncs == [] and harness.syncs == []


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("devices", [["cpu:0", "cpu:0"], ["cpu:0", "cpu:1", "cpu:0", "cpu:1"]])
def test_virtual_workers_sharing_a_device(devices, mode, dictionaries):
    """Two workers on one device (``cuda:0,cuda:0`` on one GPU): each runs on
    a stream of its own, so what one hands the other on the same device is
    ordered by events alone."""
    with virtual_devices() as harness:
        check_equal(devices, mode, dictionaries, batch_on_first_device=True, hybrid_chunk_length=3)
    assert harness.streams.races == [] and harness.streams.ops > 0


@pytest.mark.parametrize("mode", MODES)
def test_virtual_tied_embeddings_residual_and_mlp_attention(mode, dictionaries):
    with virtual_devices():
        check_equal(virtual(3), mode, dictionaries, share_decoder_input_output_embed=True, residual=True,
                    attention_type="mlp")


@pytest.mark.parametrize("mode", ["hybrid", "model"])
def test_virtual_time_chunks_and_several_bidirectional_layers(mode, dictionaries):
    with virtual_devices() as harness:
        check_equal(virtual(3), mode, dictionaries, encoder_bidirectional_layers=3, residual=True,
                    hybrid_chunk_length=2, batch_on_first_device=True)
    assert harness.syncs == [], harness.syncs


@pytest.mark.parametrize("placement", ["encoder=0,0,0,1;decoder=1,1,0,0", "encoder=1,1,1,1;decoder=0,0,0,0",
                                       "encoder=0,1,2,3;decoder=0,1,2,3;reverse=2;shards=3,0,2,2"])
def test_virtual_explicit_placements(placement, dictionaries):
    """Placements of layers, of a bidirectional layer's reverse direction
    (its replica two devices away) and of uneven attention-softmax shards
    (none on one device): no race, the single device's step."""
    count = 4 if "reverse" in placement else 2
    with virtual_devices() as harness:
        check_equal(virtual(count), "hybrid", dictionaries, batch_on_first_device=True,
                    group_options={"hybrid_placement": placement, "hybrid_micro_batches": 2 if count == 4 else 1})
    assert harness.streams.races == []


@pytest.mark.parametrize("mode", MODES)
def test_virtual_single_device_masks_and_validation(mode, dictionaries):
    """Dropout masks drawn on one device and handed to cells on others; then
    a validation pass without gradients."""
    src_dict, tgt_dict = dictionaries
    criterion = HybridCrossEntropyCriterion(StandInTask(src_dict, tgt_dict), False, 0.1, report_accuracy=True)
    options = dict(LAYERS, dropout=0.3, encoder_bidirectional_layers=2)
    torch.manual_seed(0)
    single = build_model("hybrid_lstm_tiny", src_dict, tgt_dict, **options).train()
    sample = make_sample(src_dict, tgt_dict, SRC_LENGTHS, TGT_LENGTHS)
    with virtual_devices():
        group = build_model("hybrid_lstm_tiny", src_dict, tgt_dict, **options, hybrid_devices=",".join(virtual(3)),
                            hybrid_mode=mode, hybrid_chunk_length=3, hybrid_dropout_masks="single-device").train()
        group.load_state_dict(single.state_dict())
        torch.manual_seed(9)
        loss, _, grads = loss_and_grads(group, criterion, sample)
        with torch.no_grad():
            valid = criterion(group.eval(), sample)[0].to("cpu")
    torch.manual_seed(9)
    loss_ref, _, grads_ref = loss_and_grads(single, criterion, sample)
    torch.testing.assert_close(loss, loss_ref, rtol=1e-5, atol=0)
    for name in grads_ref:
        torch.testing.assert_close(grads[name], grads_ref[name], rtol=1e-5, atol=1e-7, msg=name)
    with torch.no_grad():
        torch.testing.assert_close(valid, criterion(single.eval(), sample)[0], rtol=1e-5, atol=0)


# -- optimizer wrappers across devices ----------------------------------------------


def grouped_parameters(count=2, dtype=torch.float32):
    """Six parameters with gradients on ``count`` virtual devices in turn,
    and the same on the host (call under the harness)."""
    torch.manual_seed(3)
    values = [(torch.randn(4, 3) * (i + 1)).to(dtype) for i in range(6)]
    grads = [torch.randn(4, 3).to(dtype) for _ in range(6)]
    params = []
    for i, (value, grad) in enumerate(zip(values, grads)):
        param = torch.nn.Parameter(value.to(f"cpu:{i % count}"))
        param.grad = grad.to(f"cpu:{i % count}")
        params.append(param)
    reference = []
    for value, grad in zip(values, grads):
        param = torch.nn.Parameter(value.clone())
        param.grad = grad.clone()
        reference.append(param)
    return params, reference


def test_clip_grad_norm_across_devices(monkeypatch):
    """Defect 4's regression test.  fairseq's clip_grad_norm_ on a GPU puts
    the total norm on the current device and multiplies every gradient by it
    in one _foreach_mul_; the test makes fairseq take that path (current
    device cpu:0), where gradients on cpu:1 raise unless the clipping
    handles several devices.  The result equals one device's."""
    from fairseq import utils

    with virtual_devices():
        params, reference = grouped_parameters()
        expected = utils.clip_grad_norm_(reference, 0.5)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: torch.device("cpu", 0))
        norm = utils.clip_grad_norm_(params, 0.5)
        monkeypatch.undo()
        assert [p.grad.device.index for p in params] == [0, 1, 0, 1, 0, 1]
        norm = norm.to("cpu")
        grads = [p.grad.to("cpu") for p in params]
    assert torch.equal(norm, expected)
    for grad, ref in zip(grads, reference):
        assert torch.equal(grad, ref.grad)


def fairseq_cfg(*flags):
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, ["unused", "--arch", "lstm", "--optimizer", "adam", "--lr", "0.1",
                                                "--cpu", *flags])
    return convert_namespace_to_omegaconf(args)


@pytest.mark.parametrize("flags", [["--fp16"], ["--fp16", "--fp16-no-flatten-grads"]])
def test_fp16_optimizer_updates_parameters_on_every_device(flags):
    """Defect 3: fairseq's flattened FP16Optimizer updates only the
    parameters of one device; with parameters on several devices each keeps
    its fp32 copy beside it, and every parameter takes the step one device
    would take."""
    from fairseq.optim.fp16_optimizer import FP16Optimizer

    reference_cfg = fairseq_cfg("--fp16", "--fp16-no-flatten-grads")
    cfg = fairseq_cfg(*flags)
    with virtual_devices():
        params, reference = grouped_parameters(dtype=torch.float16)
        before = [p.detach().clone() for p in reference]
        values = []
        for group, config in ((reference, reference_cfg), (params, cfg)):
            optimizer = FP16Optimizer.build_optimizer(config, group)
            assert not optimizer.has_flat_params
            # the gradients once more, through the optimizer's scaled backward
            loss = sum((p.float() * p.grad.float()).sum().to(group[0].device) for p in group)
            optimizer.zero_grad()
            optimizer.backward(loss)
            optimizer.step()
            values.append([p.detach().to("cpu") for p in group])
    for value, ref, old in zip(values[1], values[0], before):
        assert not torch.equal(ref, old)  # the step moved every parameter
        torch.testing.assert_close(value, ref, rtol=0, atol=0)


@pytest.mark.parametrize("devices", [["cpu:0", "cpu:1"], ["cpu:0", "cpu:1", "cpu:2", "cpu:3"],
                                     ["cpu:0", "cpu:0"]])
def test_virtual_micro_batches(devices, dictionaries):
    """--hybrid-micro-batches under virtual streams, the batch on the first
    device: every micro-batch's transfers are ordered (no race, no host
    sync inside a cell), and the step is the single device's."""
    with virtual_devices() as harness:
        check_equal(devices, "hybrid", dictionaries, batch_on_first_device=True, hybrid_chunk_length=3,
                    group_options={"hybrid_micro_batches": 3})
    assert harness.syncs == [], harness.syncs
    assert harness.streams.races == [] and harness.streams.ops > 0


def test_fairseqs_trainer_keeps_a_groups_batch_pinned_on_the_host(dictionaries):
    """``Trainer._prepare_sample`` as patched: for a model with a group the
    batch is pinned before fairseq moves it, and the group finds the host
    tensor of each moved one; a model without a group is left alone."""
    from types import SimpleNamespace

    from fairseq_hybrid.fairseq_patches.batch_on_host import keeping_host_batch

    given = []

    def to_first_device(trainer, sample, is_dummy=False):  # fairseq's move to cuda:0
        given.append(sample["net_input"]["src_tokens"])
        return {"net_input": {key: value.to("cpu:0", non_blocking=True)
                              for key, value in sample["net_input"].items()},
                "target": sample["target"].to("cpu:0", non_blocking=True), "ntokens": sample["ntokens"]}, False

    prepare = keeping_host_batch(to_first_device)
    sample = make_sample(*dictionaries, [5, 3, 4], [4, 2, 3])
    with virtual_devices() as harness:
        group, alone = build_model(hybrid_devices="cpu:0,cpu:1"), build_model()
        with thread_state.step_scope():
            moved, dummy = prepare(SimpleNamespace(_model=group), sample)
        hosts = {key: host_batch.host_of(value) for key, value in moved["net_input"].items()}
        assert all(host.is_pinned() for host in hosts.values()) and moved["target"].device == torch.device("cpu:0")
        assert given[-1].is_pinned() and given[-1] is not sample["net_input"]["src_tokens"]
        prepare(SimpleNamespace(_model=alone), sample)
        assert given[-1] is sample["net_input"]["src_tokens"]  # as fairseq has it
    assert harness.step_syncs == [] and not dummy
    for key, host in hosts.items():
        assert host.device == torch.device("cpu")
        assert torch.equal(host, sample["net_input"][key]) and host is not sample["net_input"][key]
