"""--hybrid-workers processes through fairseq's own commands: the trainer
sees what it sees with threads (the single-device parameters after 20
updates, checkpoints that load anywhere, a resume after SIGKILL equal to
a run never stopped, groups under DDP), and no stage outlives it."""

import os
import signal
import subprocess
import time

import pytest
import torch

from conftest import BIN, USER_DIR, run
from test_end_to_end import train_updates
from test_scale_out import TINY, assert_equals_one_process_with_update_freq_2, assert_same_parameters, parameters
from test_stage_processes import alive

pytestmark = pytest.mark.slow

PROCESSES = ["--hybrid-workers", "processes"]


def children(pid):
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def test_processes_through_fairseq_train_equal_one_device_and_generate_with_threads(binarized, tmp_path):
    single = torch.load(train_updates(binarized, "single"))
    checkpoint = train_updates(binarized, "processes", "--hybrid-devices", "cpu,cpu", *PROCESSES)
    group = torch.load(checkpoint)
    assert group["cfg"]["model"]["hybrid_workers"] == "processes"
    assert group["model"].keys() == single["model"].keys()
    for name, value in single["model"].items():
        torch.testing.assert_close(group["model"][name], value, rtol=1e-5, atol=1e-6, msg=name)
    # the checkpoint generates on one device, and on a group of threads
    for extra in ([], ["--model-overrides", "{'hybrid_workers': 'threads'}"]):
        generated = run(os.path.join(BIN, "fairseq-generate"), binarized / "bin", "--user-dir", USER_DIR, "--cpu",
                        "--path", checkpoint, "--beam", "2", "--max-tokens", "4000", "--max-len-b", "10",
                        "--required-batch-size-multiple", "1", *extra)
        assert len([line for line in generated.stdout.splitlines() if line.startswith("H-")]) == 200


def test_groups_of_processes_under_ddp_equal_one_process(binarized, tmp_path):
    """fairseq-hybrid-train, 2 ranks of 2 CPU devices each, every device a
    process of its own: the parameters of one group with --update-freq 2."""
    run(os.path.join(BIN, "fairseq-hybrid-train"), "--nproc-per-node", "2", "--devices-per-process", "2",
        "--device", "cpu", "--master-port", "29641", "--",
        binarized / "bin", *TINY, "--max-update", "10", "--save-dir", tmp_path / "two", *PROCESSES)
    assert_equals_one_process_with_update_freq_2(binarized, tmp_path / "one", tmp_path / "two" / "checkpoint_last.pt")


def command_of(binarized, save_dir):
    return [os.path.join(BIN, "fairseq-train"), str(binarized / "bin"), "--user-dir", USER_DIR, "--cpu", *TINY,
            "--dropout", "0.2", "--max-update", "16", "--save-interval-updates", "4", "--hybrid-devices", "cpu,cpu",
            *PROCESSES, "--save-dir", str(save_dir)]


def test_sigkill_mid_epoch_and_restart_ends_like_an_uninterrupted_run(binarized, tmp_path):
    """The trainer killed with SIGKILL after update 8: its stages end with
    it, and the resumed run ends where the uninterrupted one does."""
    run(*command_of(binarized, tmp_path / "whole"))
    command = command_of(binarized, tmp_path / "killed")
    last = tmp_path / "killed" / "checkpoint_last.pt"
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stages = []
    deadline = time.time() + 300
    try:
        while time.time() < deadline:
            try:
                if last.exists() and parameters(last)[0] >= 8:
                    break
            except Exception:  # being written
                pass
            assert process.poll() is None, "training ended before it could be killed"
            time.sleep(0.05)
        else:
            pytest.fail("no checkpoint at update 8 within 300 s")
        stages = children(process.pid)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    assert len(stages) >= 2  # the two stages (and whatever else fairseq started)
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in stages) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in stages if alive(pid)]
    killed_at = parameters(last)[0]
    assert 8 <= killed_at < 16
    resumed = run(*command)
    assert f"@ {killed_at} updates" in resumed.stdout + resumed.stderr
    updates, after_restart = parameters(last)
    assert updates == 16
    assert_same_parameters(after_restart, parameters(tmp_path / "whole" / "checkpoint_last.pt")[1])
