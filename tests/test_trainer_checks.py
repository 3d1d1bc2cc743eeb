"""Options fairseq accepts but a hybrid group cannot serve are refused when
fairseq's Trainer is built, before any step, naming what to use instead."""

import types

import pytest
import torch

from fairseq_hybrid.parallel.recipe.device_plan import DevicePlan, DevicePlanError
from fairseq_hybrid.fairseq_patches.trainer_checks import check_training_setup
from test_virtual_devices import fairseq_cfg


def group_on(*devices):
    plan = DevicePlan([torch.device(d) for d in devices], [0, 1], [0, 1], "hybrid")
    return types.SimpleNamespace(hybrid_group=types.SimpleNamespace(plan=plan))


def test_a_model_without_a_group_is_never_refused():
    check_training_setup(fairseq_cfg("--pipeline-model-parallel"), types.SimpleNamespace())


@pytest.mark.parametrize("flags, message", [
    (["--pipeline-model-parallel"], "drop it and use --hybrid-devices"),
    (["--model-parallel-size", "2"], "Megatron model parallelism"),
    (["--distributed-world-size", "2", "--ddp-backend", "pytorch_ddp"], "use --ddp-backend legacy_ddp"),
    (["--distributed-world-size", "2", "--ddp-backend", "fully_sharded"], "use --ddp-backend legacy_ddp"),
])
def test_refused_options(flags, message):
    with pytest.raises(DevicePlanError, match=message):
        check_training_setup(fairseq_cfg(*flags), group_on("cpu", "cpu"))


def test_cpu_flag_with_cuda_devices_is_refused():
    with pytest.raises(DevicePlanError, match=r"--cpu with --hybrid-devices cuda:0,cuda:1: drop --cpu"):
        check_training_setup(fairseq_cfg(), group_on("cuda:0", "cuda:1"))


def test_what_the_launcher_sets_is_accepted():
    check_training_setup(fairseq_cfg("--distributed-world-size", "2", "--ddp-backend", "legacy_ddp"),
                         group_on("cpu", "cpu"))
