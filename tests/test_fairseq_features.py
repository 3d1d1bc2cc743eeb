"""fairseq features a user of hybrid_lstm relies on, through the real
command lines on the shipped Tatoeba fixture."""

import os
import re

import pytest
import torch

from conftest import BIN, USER_DIR, run

pytestmark = pytest.mark.slow


def train(work, save_dir, max_update, *extra):
    result = run(
        os.path.join(BIN, "fairseq-train"), work / "bin", "--user-dir", USER_DIR, "--cpu",
        "--arch", "hybrid_lstm_tiny", "--criterion", "hybrid_cross_entropy", "--optimizer", "adam",
        "--max-tokens", "600", "--max-update", max_update, "--save-dir", save_dir, "--no-epoch-checkpoints",
        "--seed", "3", "--no-progress-bar", "--log-format", "simple", *extra,
    )
    return result.stdout + result.stderr


@pytest.mark.parametrize("group", [[], ["--hybrid-devices", "cpu,cpu"]], ids=["one device", "group"])
def test_patience_survives_a_restart(binarized, tmp_path, group):
    """fairseq issue 3531: --patience's count was lost on restart.  With a
    learning rate too small to change anything, every validation after the
    first fails to improve: a run stopped at update 4 (one failure counted)
    and resumed must stop at update 8 (three failures), as an uninterrupted
    run does, not at 12."""
    options = ["--lr", "1e-30", "--patience", "3", "--validate-interval-updates", "2", "--save-interval-updates", "2",
               *group]
    train(binarized, tmp_path / "run", "4", *options)
    state = torch.load(tmp_path / "run" / "checkpoint_last.pt")
    assert state["extra_state"]["patience"]["num_runs"] == 1
    log = train(binarized, tmp_path / "run", "40", *options)
    assert "early stop since valid performance hasn't improved for last 3 runs" in log
    assert re.findall(r"num_updates (\d+)", log)[-1] == "8", log[-3000:]


SIDES = pytest.mark.parametrize("group", [[], ["--hybrid-devices", "cpu,cpu"]], ids=["one device", "group"])


@SIDES
def test_validation_bleu_selects_the_best_checkpoint(binarized, tmp_path, group):
    """--eval-bleu with sentencepiece removed, and --best-checkpoint-metric
    bleu: the validation log carries BLEU and checkpoint_best.pt is chosen by it."""
    log = train(binarized, tmp_path / "run", "6", "--lr", "0.005", "--eval-bleu", "--eval-bleu-remove-bpe",
                "sentencepiece", "--eval-bleu-detok", "space", "--eval-bleu-args", '{"beam": 2, "max_len_b": 20}',
                "--best-checkpoint-metric", "bleu", "--maximize-best-checkpoint-metric",
                "--validate-interval-updates", "3", "--save-interval-updates", "3", *group)
    assert len(re.findall(r"\| valid \|.*\| bleu [\d.]+ ", log)) == 2, log[-3000:]
    assert "best_bleu" in log
    state = torch.load(tmp_path / "run" / "checkpoint_best.pt")
    assert state["cfg"]["checkpoint"]["best_checkpoint_metric"] == "bleu"


@SIDES
def test_checkpointing_and_batching_options(binarized, tmp_path, group):
    """--keep-best-checkpoints, --keep-last-epochs, --validate-interval-updates,
    --save-interval-updates (with --keep-interval-updates), --update-freq,
    --max-tokens-valid, --num-workers 2 and --seed together; then
    --finetune-from-model starts a new run from those weights."""
    run_dir = tmp_path / "run"
    log = train(binarized, run_dir, "12", "--lr", "0.005", "--keep-best-checkpoints", "2", "--max-epoch", "2",
                "--keep-last-epochs", "1", "--validate-interval-updates", "4", "--save-interval-updates", "4",
                "--keep-interval-updates", "2", "--update-freq", "2", "--max-tokens-valid", "300",
                "--num-workers", "2", "--seed", "5", *group)
    names = sorted(os.listdir(run_dir))
    assert len([n for n in names if re.fullmatch(r"checkpoint_\d+_\d+\.pt", n)]) == 2, names
    assert len([n for n in names if n.startswith("checkpoint.best_loss_")]) == 2, names
    assert re.findall(r"num_updates (\d+)", log)[-1] == "12"
    state = torch.load(run_dir / "checkpoint_last.pt")
    assert state["cfg"]["optimization"]["update_freq"] == [2] and state["cfg"]["common"]["seed"] == 5
    tuned = train(binarized, tmp_path / "tuned", "2", "--lr", "0.001",
                  "--finetune-from-model", run_dir / "checkpoint_last.pt", *group)
    assert "loading pretrained model from" in tuned.lower() or "finetune" in tuned.lower(), tuned[-2000:]
    assert re.findall(r"num_updates (\d+)", tuned)[-1] == "2"


def test_ensemble_of_a_single_device_and_a_group_checkpoint(binarized, tmp_path):
    """An ensemble of a checkpoint trained on one device and one trained on a
    group: fairseq-generate --path a.pt:b.pt, fairseq-interactive on raw
    Japanese with --path a.pt:b.pt, and the hub interface
    (load_translator(checkpoint="a.pt:b.pt")), which holds both models."""
    from fairseq_hybrid.translation.hub import load_translator

    train(binarized, tmp_path / "one", "6", "--lr", "0.005")
    train(binarized, tmp_path / "group", "6", "--lr", "0.005", "--seed", "4", "--hybrid-devices", "cpu,cpu")
    paths = f"{tmp_path / 'one' / 'checkpoint_last.pt'}:{tmp_path / 'group' / 'checkpoint_last.pt'}"
    generated = run(os.path.join(BIN, "fairseq-generate"), binarized / "bin", "--user-dir", USER_DIR, "--cpu",
                    "--path", paths, "--beam", "2", "--max-tokens", "4000", "--max-len-b", "10",
                    "--required-batch-size-multiple", "1", "--remove-bpe", "sentencepiece")
    assert len([line for line in generated.stdout.splitlines() if line.startswith("H-")]) == 200
    assert "loading model(s) from " + paths in generated.stdout + generated.stderr

    interactive = run(os.path.join(BIN, "fairseq-interactive"), binarized / "bin", "--user-dir", USER_DIR, "--cpu",
                      "--path", paths, "--beam", "2", "--max-len-b", "10", "--source-lang", "ja", "--target-lang",
                      "en", "--bpe", "sentencepiece", "--sentencepiece-model", binarized / "spm" / "spm.model",
                      input="これはペンです。\n猫が好きです。\n")
    assert len(re.findall(r"^D-\d+\t", interactive.stdout, re.M)) == 2, interactive.stdout[-2000:]
    assert "loading model(s) from " + paths in interactive.stdout + interactive.stderr

    translator = load_translator(str(tmp_path / "one"), checkpoint=paths, data=str(binarized / "bin"),
                                 sentencepiece_model=str(binarized / "spm" / "spm.model"), beam=2, max_len_b=10)
    assert len(translator.models) == 2
    assert isinstance(translator.translate("これはペンです。"), str)


@SIDES
def test_reset_optimizer_alone(binarized, tmp_path, group):
    """--reset-optimizer on a resumed run: the weights come from the
    checkpoint, the optimizer and the update count start afresh."""
    train(binarized, tmp_path / "run", "4", "--lr", "0.005", *group)
    before = torch.load(tmp_path / "run" / "checkpoint_last.pt")["model"]
    log = train(binarized, tmp_path / "run", "2", "--lr", "0.005", "--reset-optimizer", *group)
    assert "loaded checkpoint" in log.lower(), log[-2000:]
    assert re.findall(r"num_updates (\d+)", log)[-1] == "2"
    after = torch.load(tmp_path / "run" / "checkpoint_last.pt")
    assert after["optimizer_history"][-1]["num_updates"] == 2
    assert not all(torch.equal(after["model"][name], value) for name, value in before.items())


@SIDES
def test_log_formats_tensorboard_and_the_groups_device_metrics(binarized, tmp_path, group):
    """--log-format json (every line parses; a group adds devK_busy and
    group_fill, fractions of the step, to every train_inner line, and, with
    --hybrid-chunk-length auto and --hybrid-micro-batches auto, chunk_len
    and micro_batches, what it chose), --log-format tqdm, and
    --tensorboard-logdir writing event files out of the box."""
    import json

    auto = ["--hybrid-chunk-length", "auto", "--hybrid-micro-batches", "auto"] if group else []
    log = train(binarized, tmp_path / "json", "4", "--lr", "0.005", "--log-format", "json", "--log-interval", "1",
                "--tensorboard-logdir", tmp_path / "tb", *group, *auto)
    inner = [json.loads(line.split("| INFO | train_inner | ", 1)[1]) for line in log.splitlines()
             if "| INFO | train_inner | " in line]
    assert len(inner) == 4, log[-2000:]
    metrics = {"dev0_busy", "dev1_busy", "group_fill"}
    if group:
        for row in inner:
            assert metrics <= row.keys(), row
            assert all(0.0 < float(row[name]) <= 1.0 for name in metrics), row
            assert float(row["chunk_len"]) >= 0 and float(row["micro_batches"]) >= 1, row
    else:
        assert not (metrics | {"chunk_len", "micro_batches"}) & inner[0].keys()
    events = [name for _, _, names in os.walk(tmp_path / "tb") for name in names if "tfevents" in name]
    assert events, "no tensorboard event files"
    tqdm = train(binarized, tmp_path / "tqdm", "2", "--lr", "0.005", "--log-format", "tqdm", *group)
    assert re.search(r"epoch 001.*\|", tqdm), tqdm[-2000:]


def test_fairseq_hydra_train_with_a_group(binarized, tmp_path):
    """fairseq-hydra-train with the group given as model options on the
    command line: +model.hybrid_devices='cpu,cpu' (a key the yaml does not
    set takes a +, and hydra wants a list quoted)."""
    from test_end_to_end import HYDRA_CONFIG

    config_dir = tmp_path / "config"
    config_dir.mkdir()
    (config_dir / "tiny.yaml").write_text(
        HYDRA_CONFIG.format(user_dir=USER_DIR, data=binarized / "bin", save_dir=tmp_path / "checkpoints")
    )
    result = run(os.path.join(BIN, "fairseq-hydra-train"), "--config-dir", config_dir, "--config-name", "tiny",
                 "+model.hybrid_devices='cpu,cpu'", "+model.hybrid_mode=hybrid", "optimization.max_update=6",
                 cwd=tmp_path)
    assert "hybrid group (hybrid mode, 2 devices)" in result.stdout + result.stderr
    state = torch.load(tmp_path / "checkpoints" / "checkpoint_last.pt")
    assert state["cfg"]["model"]["hybrid_devices"] == "cpu,cpu"
    assert state["optimizer_history"][-1]["num_updates"] == 6


def test_averaging_the_checkpoints_of_a_group(binarized, tmp_path):
    """fairseq-hybrid-average on checkpoints a group wrote: the mean of
    their weights, and the average translates with fairseq-generate."""
    run_dir = tmp_path / "run"
    train(binarized, run_dir, "4", "--lr", "0.005", "--save-interval-updates", "2", "--hybrid-devices", "cpu,cpu")
    run(os.path.join(BIN, "fairseq-hybrid-average"), "--last", "2", run_dir, "--output", tmp_path / "average.pt")
    first, second = torch.load(run_dir / "checkpoint_1_2.pt"), torch.load(run_dir / "checkpoint_1_4.pt")
    average = torch.load(tmp_path / "average.pt")
    assert average["cfg"]["model"]["hybrid_devices"] == "cpu,cpu"
    for name, value in first["model"].items():
        torch.testing.assert_close(average["model"][name],
                                   (value.double() + second["model"][name].double()).div(2).float())
    generated = run(os.path.join(BIN, "fairseq-generate"), binarized / "bin", "--user-dir", USER_DIR, "--cpu",
                    "--path", tmp_path / "average.pt", "--beam", "2", "--max-tokens", "4000", "--max-len-b", "10")
    assert len([line for line in generated.stdout.splitlines() if line.startswith("H-")]) == 200
