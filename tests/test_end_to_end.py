"""The real command lines on the shipped Tatoeba fixture: sentencepiece,
fairseq-preprocess, fairseq-train, fairseq-generate, fairseq-interactive,
and resuming training from a checkpoint."""

import os
import re

import pytest

from conftest import BIN, USER_DIR, run

pytestmark = pytest.mark.slow


def train(work, max_epoch):
    return run(
        os.path.join(BIN, "fairseq-train"), work / "bin", "--user-dir", USER_DIR, "--cpu",
        "--arch", "hybrid_lstm_tiny", "--criterion", "hybrid_cross_entropy", "--label-smoothing", "0.1",
        "--optimizer", "adam", "--lr", "0.005", "--max-tokens", "2000", "--max-epoch", max_epoch,
        "--save-dir", work / "checkpoints", "--log-format", "simple", "--log-interval", "10",
        "--seed", "3", "--no-progress-bar", "--report-accuracy",
    )


def test_train_generate_interactive_and_resume(binarized):
    work = binarized
    first = train(work, 2)
    log = first.stdout + first.stderr
    losses = [float(x) for x in re.findall(r"\| train \| epoch \d+ \| loss ([\d.]+)", log)]
    assert len(losses) == 2 and losses[1] < losses[0], log[-2000:]
    assert "accuracy" in log
    checkpoint = work / "checkpoints" / "checkpoint_last.pt"
    assert checkpoint.exists()

    resumed = train(work, 3)
    resumed_log = resumed.stdout + resumed.stderr
    assert "Loaded checkpoint" in resumed_log and "(epoch 3 @" in resumed_log
    assert "epoch 003" in resumed_log and "epoch 001" not in resumed_log

    generated = run(os.path.join(BIN, "fairseq-generate"), work / "bin", "--user-dir", USER_DIR, "--cpu",
                    "--path", checkpoint, "--beam", "4", "--max-tokens", "4000", "--remove-bpe", "sentencepiece",
                    "--max-len-b", "30")
    hypotheses = [line for line in generated.stdout.splitlines() if line.startswith("H-")]
    assert len(hypotheses) == 200
    assert "BLEU4" in generated.stdout + generated.stderr

    interactive = run(os.path.join(BIN, "fairseq-interactive"), work / "bin", "--user-dir", USER_DIR, "--cpu",
                      "--path", checkpoint, "--beam", "3", "--source-lang", "ja", "--target-lang", "en",
                      "--max-len-b", "20", input="▁ 何 か して み ま し ょ う 。\n")
    assert re.search(r"^H-0\t-?[\d.]+\t", interactive.stdout, re.M), interactive.stdout


HYDRA_CONFIG = """\
# @package _global_
common: {{user_dir: {user_dir}, cpu: true, log_format: simple, seed: 2}}
task: {{_name: translation, data: {data}, source_lang: ja, target_lang: en}}
model: {{_name: hybrid_lstm, encoder_hidden_size: 24, encoder_embed_dim: 16, decoder_hidden_size: 24,
        decoder_embed_dim: 16, decoder_out_embed_dim: 16, attention_type: mlp}}
criterion: {{_name: hybrid_cross_entropy, label_smoothing: 0.1}}
optimizer: {{_name: adam}}
lr_scheduler: {{_name: fixed}}
optimization: {{lr: [0.005], max_epoch: 1}}
dataset: {{max_tokens: 2000}}
checkpoint: {{save_dir: {save_dir}}}
"""


def test_fairseq_hydra_train(binarized, tmp_path):
    import torch

    config_dir = tmp_path / "config"
    config_dir.mkdir()
    (config_dir / "tiny.yaml").write_text(
        HYDRA_CONFIG.format(user_dir=USER_DIR, data=binarized / "bin", save_dir=tmp_path / "checkpoints")
    )
    run(os.path.join(BIN, "fairseq-hydra-train"), "--config-dir", config_dir, "--config-name", "tiny",
        cwd=tmp_path)
    state = torch.load(tmp_path / "checkpoints" / "checkpoint_last.pt")
    assert state["cfg"]["model"]["encoder_hidden_size"] == 24
    assert state["cfg"]["model"]["attention_type"] == "mlp"
    assert state["model"]["decoder.attention_softmax.attention.score_proj.weight"].shape == (1, 24)


def train_updates(work, name, *extra, env=None, log=None):
    save_dir = work / name
    result = run(
        os.path.join(BIN, "fairseq-train"), work / "bin", "--user-dir", USER_DIR, "--cpu",
        "--arch", "hybrid_lstm_tiny", "--criterion", "hybrid_cross_entropy", "--label-smoothing", "0.1",
        "--optimizer", "adam", "--lr", "0.005", "--clip-norm", "1.0", "--max-tokens", "600", "--max-update", "20",
        "--save-dir", save_dir, "--no-epoch-checkpoints", "--seed", "3", "--no-progress-bar", *extra, env=env,
    )
    if log is not None:
        log.append(result.stdout + result.stderr)
    return save_dir / "checkpoint_last.pt"


def test_hybrid_group_through_fairseq_train_and_generate(binarized, tmp_path):
    """20 updates on 2 CPU devices (each mode) through the real
    trainer give the single-device parameters; the group's checkpoint then
    generates on one device, also where its recorded devices are missing."""
    import torch

    single = torch.load(train_updates(binarized, "single"))
    assert single["optimizer_history"][-1]["num_updates"] == 20
    for mode in ("hybrid", "model", "data"):
        checkpoint = train_updates(binarized, f"group_{mode}", "--hybrid-devices", "cpu,cpu", "--hybrid-mode", mode)
        group = torch.load(checkpoint)
        assert group["cfg"]["model"]["hybrid_devices"] == "cpu,cpu"
        assert group["model"].keys() == single["model"].keys()
        for name, value in single["model"].items():
            torch.testing.assert_close(group["model"][name], value, rtol=1e-5, atol=1e-6, msg=f"{mode}: {name}")

    # The same checkpoint as if written on two GPUs, loaded on this machine.
    group["cfg"]["model"]["hybrid_devices"] = "cuda:0,cuda:1"
    moved = tmp_path / "from_two_gpus.pt"
    torch.save(group, moved)
    generated = run(os.path.join(BIN, "fairseq-generate"), binarized / "bin", "--user-dir", USER_DIR, "--cpu",
                    "--path", moved, "--beam", "2", "--max-tokens", "4000", "--max-len-b", "10",
                    "--required-batch-size-multiple", "1")
    assert len([line for line in generated.stdout.splitlines() if line.startswith("H-")]) == 200
    if not torch.cuda.is_available():
        assert "loading it on one device" in generated.stderr + generated.stdout


def test_a_process_per_device_through_fairseq_train_and_generate(binarized):
    """--hybrid-workers processes: 20 updates give the single-device
    parameters (--clip-norm included), and the checkpoint generates on one
    device and on a group of threads."""
    import torch

    single = torch.load(train_updates(binarized, "single_for_processes"))
    checkpoint = train_updates(binarized, "processes", "--hybrid-devices", "cpu,cpu", "--hybrid-workers", "processes")
    group = torch.load(checkpoint)
    assert group["cfg"]["model"]["hybrid_workers"] == "processes"
    assert group["model"].keys() == single["model"].keys()
    for name, value in single["model"].items():
        torch.testing.assert_close(group["model"][name], value, rtol=1e-5, atol=1e-6, msg=name)
    for extra in ([], ["--model-overrides", "{'hybrid_workers': 'threads'}"]):
        generated = run(os.path.join(BIN, "fairseq-generate"), binarized / "bin", "--user-dir", USER_DIR, "--cpu",
                        "--path", checkpoint, "--beam", "2", "--max-tokens", "4000", "--max-len-b", "10",
                        "--required-batch-size-multiple", "1", *extra)
        assert len([line for line in generated.stdout.splitlines() if line.startswith("H-")]) == 200


# two workers on one device: test_virtual_devices.py's test_virtual_workers_sharing_a_device covers the step
@pytest.mark.parametrize("devices", ["cpu:0,cpu:1", pytest.param("cpu:0,cpu:0", marks=pytest.mark.benchmark)])
def test_virtual_group_through_fairseq_train(binarized, devices):
    """The same 20 updates on 2 virtual devices (cpu:0, cpu:1 told apart as
    two GPUs are, FAIRSEQ_HYBRID_VIRTUAL_DEVICES=1), and on two workers that
    share one device (``cuda:0,cuda:0``), under virtual streams, each batch
    on the first device as fairseq puts it on cuda:0: fairseq's trainer,
    Adam and --clip-norm 1.0 over parameters on two devices give the
    single-device parameters, and no stream race is raised."""
    import torch

    # (its own single-device run: rerunning a finished one would train one update more)
    suffix = devices.replace(":", "").replace(",", "_")
    single = torch.load(train_updates(binarized, f"single_for_virtual_{suffix}"))
    environment = dict(os.environ, FAIRSEQ_HYBRID_VIRTUAL_DEVICES="1", FAIRSEQ_HYBRID_VIRTUAL_BATCH_DEVICE="cpu:0")
    last = devices.split(",")[-1]
    for mode in ("hybrid", "model", "data"):
        log = []
        name = f"virtual_{mode}_{suffix}"
        checkpoint = train_updates(binarized, name, "--hybrid-devices", devices, "--hybrid-mode",
                                   mode, env=environment, log=log)
        assert "virtual-device test harness on" in log[0] and "with virtual streams" in log[0], log[0][-3000:]
        assert "every batch is put on cpu:0" in log[0], log[0][-3000:]
        assert "stream race" not in log[0], log[0][-3000:]
        assert re.search(rf"attention-softmax +master cpu:\d; shards [^\n]*{last}", log[0]), log[0][-3000:]
        group = torch.load(checkpoint)
        for name, value in single["model"].items():
            torch.testing.assert_close(group["model"][name], value, rtol=1e-5, atol=1e-6, msg=f"{mode}: {name}")
