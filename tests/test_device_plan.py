"""--hybrid-devices / --hybrid-placement / --hybrid-mode: the default
placement and a clear error for every option that cannot be honoured."""

import pytest
import torch

from conftest import build_model
from fairseq_hybrid.parallel.recipe.batch_rows import shard_rows
from fairseq_hybrid.parallel.recipe.device_plan import DevicePlanError, build_plan


def test_default_placement_is_layer_mod_k():
    plan = build_plan("cpu,cpu", "", "hybrid", 4, 3)
    assert plan.encoder == [0, 1, 0, 1] and plan.decoder == [0, 1, 0]
    assert plan.shard_devices == [torch.device("cpu")] * 2
    assert build_plan("cpu,cpu", "", "model", 4, 3).shard_devices == [torch.device("cpu")]


def test_explicit_placement():
    plan = build_plan("cpu,cpu,cpu", "encoder=0,0,1,2; decoder=2,1,0", "hybrid", 4, 3)
    assert plan.encoder == [0, 0, 1, 2] and plan.decoder == [2, 1, 0]


@pytest.mark.parametrize("devices, placement, mode, message", [
    ("tpu:0", "", "hybrid", "unknown device 'tpu:0'"),
    ("cpu,banana", "", "hybrid", "unknown device 'banana'"),
    ("0", "", "hybrid", "at least one device"),
    ("cpu,cpu,cpu,cpu,cpu", "", "hybrid", "only 4 encoder and 3 decoder layers"),
    ("cpu,cpu", "encoder=0,1,0,1", "hybrid", "no device given for the decoder layers"),
    ("cpu,cpu", "encoder=0,1;decoder=0,1,0", "hybrid", "2 encoder device\\(s\\) given for 4 encoder layers"),
    ("cpu,cpu", "encoder=0,1,0,2;decoder=0,1,0", "hybrid", "device index 2 out of range"),
    ("cpu,cpu", "encoder=a,b;decoder=0", "hybrid", "values must be integers"),
    ("cpu,cpu", "encoder=0,1,0,1;decoder=0,1,0;reverse=2", "hybrid", "device index 2 out of range"),
    ("cpu,cpu", "encoder=0,1,0,1;decoder=0,1,0;shards=1", "hybrid", "one weight >= 0 per device"),
    ("cpu,cpu", "encoder=0,1,0,1;decoder=0,1,0;shards=0,0", "hybrid", "not all 0"),
    ("cpu,cpu", "encoder=0,1,0,1;decoder=0,1,0;shards=1,-1", "hybrid", "one weight >= 0 per device"),
    ("cpu,cpu", "encoder=0,1,0,1;decoder=0,1,0;shards=1,1", "model", "shards= is for --hybrid-mode hybrid"),
    ("cpu,cpu", "encoder=0,1,0,1;decoder=0,1,0;encoder=0,0,0,0", "hybrid", "expected 'encoder="),
    ("cpu,cpu", "layers=0,1", "hybrid", "expected 'encoder="),
    ("cpu,cpu", "encoder=0,1,0,1;decoder=0,1,0", "data", "no meaning with --hybrid-mode data"),
    ("cpu,cpu", "", "pipeline", "choose one of hybrid, model, data"),
])
def test_bad_options_are_refused_clearly(devices, placement, mode, message):
    with pytest.raises(DevicePlanError, match=message):
        build_plan(devices, placement, mode, 4, 3)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_asked_for_but_absent():
    with pytest.raises(DevicePlanError, match="asks for cuda:0 but CUDA is not available"):
        build_plan("cuda:0,cuda:1", "", "hybrid", 2, 2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cpu_and_cuda_do_not_mix():
    with pytest.raises(DevicePlanError, match="one kind"):
        build_plan("cpu,cuda:0", "", "hybrid", 2, 2)


def test_data_mode_may_use_more_devices_than_layers():
    assert build_plan("cpu,cpu,cpu", "", "data", 2, 2).size == 3


def test_placement_without_devices_is_refused():
    needs = ("--hybrid-placement, --hybrid-cost-model, --hybrid-micro-batches and --hybrid-softmax-chunks need "
             "--hybrid-devices")
    with pytest.raises(ValueError, match=needs):
        build_model("hybrid_lstm_tiny", hybrid_placement="encoder=0,0;decoder=0,0")
    with pytest.raises(ValueError, match=needs):
        build_model("hybrid_lstm_tiny", hybrid_cost_model="simulation.json")
    with pytest.raises(ValueError, match=needs):
        build_model("hybrid_lstm_tiny", hybrid_micro_batches=2)
    with pytest.raises(ValueError, match=needs):
        build_model("hybrid_lstm_tiny", hybrid_softmax_chunks="0")


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "often", "0"])
def test_a_bad_micro_batch_count_is_refused(value):
    with pytest.raises(DevicePlanError, match="--hybrid-micro-batches must be a whole number >= 1 or auto"):
        build_model("hybrid_lstm_tiny", hybrid_devices="cpu,cpu", hybrid_micro_batches=value)


@pytest.mark.parametrize("value", [-1, 1.5, True, "all", "-2"])
def test_a_bad_softmax_chunk_count_is_refused(value):
    with pytest.raises(DevicePlanError, match=r"--hybrid-softmax-chunks must be a whole number >= 0 \(0: all"):
        build_model("hybrid_lstm_tiny", hybrid_devices="cpu,cpu", hybrid_softmax_chunks=value)


def test_softmax_chunks_in_data_mode_are_refused_and_auto_is_taken():
    with pytest.raises(DevicePlanError, match="--hybrid-softmax-chunks is for --hybrid-mode hybrid and model"):
        build_model("hybrid_lstm_tiny", hybrid_devices="cpu,cpu", hybrid_mode="data", hybrid_softmax_chunks="0")
    group = build_model("hybrid_lstm_tiny", hybrid_devices="cpu,cpu", hybrid_softmax_chunks=" auto ").hybrid_group
    assert group.softmax_chunks == "auto" and group.chunk_chooser.spans() == [1, 2, 4, 0]


def test_micro_batches_in_data_mode_are_refused():
    with pytest.raises(DevicePlanError, match="--hybrid-micro-batches is for --hybrid-mode hybrid and model"):
        build_model("hybrid_lstm_tiny", hybrid_devices="cpu,cpu", hybrid_mode="data", hybrid_micro_batches=2)




def test_reverse_directions_and_shard_weights_in_a_placement():
    plan = build_plan("cpu,cpu,cpu,cpu", "encoder=0,1,2,3;decoder=0,1,2,3;reverse=2;shards=3,0,2,2", "hybrid", 4, 4)
    assert plan.reverse_worker(0) == 2 and plan.reverse_worker(1) == 2  # layer 1: the default, the next device
    assert plan.shard_workers == [0, 2, 3]
    assert shard_rows(plan, 14) == [(0, slice(0, 6)), (2, slice(6, 10)), (3, slice(10, 14))]
    assert shard_rows(plan, 2) == [(0, slice(0, 1)), (2, slice(1, 2))]  # never an empty shard
    default = build_plan("cpu,cpu,cpu", "", "hybrid", 4, 4)
    assert default.reverse_worker(0) == 1 and shard_rows(default, 7) == [(0, slice(0, 3)), (1, slice(3, 5)),
                                                                         (2, slice(5, 7))]


def test_more_reverse_directions_than_bidirectional_layers_are_refused():
    with pytest.raises(DevicePlanError, match="reverse= gives 2 device\\(s\\) but the model has 1 bidirectional"):
        build_model("hybrid_lstm_tiny", hybrid_devices="cpu,cpu", encoder_layers=2, decoder_layers=2,
                    encoder_bidirectional_layers=1, hybrid_placement="encoder=0,1;decoder=0,1;reverse=1,0")
