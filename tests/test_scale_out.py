"""Several hybrid groups over torch.distributed (gloo on CPU), and faults:
two processes x two CPU devices equal one process fed the union of their
batches; a run killed with SIGKILL and restarted ends where an
uninterrupted run ends; a dead process stops the others."""

import os
import signal
import subprocess
import time

import pytest
import torch

from conftest import BIN, USER_DIR, alive, run
import fairseq_hybrid
from fairseq_hybrid.commands.train import parse, process_arguments, torchrun_command

TINY = ["--arch", "hybrid_lstm_tiny", "--criterion", "hybrid_cross_entropy", "--label-smoothing", "0.1",
        "--optimizer", "adam", "--lr", "0.005", "--max-tokens", "600", "--no-epoch-checkpoints", "--seed", "3",
        "--no-progress-bar", "--log-format", "simple", "--log-interval", "1"]


def parameters(checkpoint):
    state = torch.load(checkpoint)
    return state["optimizer_history"][-1]["num_updates"], state["model"]


def assert_same_parameters(a, b, rtol=1e-5):
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=rtol, atol=1e-6, msg=name)


def assert_equals_one_process_with_update_freq_2(binarized, save_dir, checkpoint):
    """``checkpoint``, written by two processes after 10 updates, holds the
    parameters of one process of 2 CPU devices with --update-freq 2 (the
    same union of batches)."""
    run(os.path.join(BIN, "fairseq-train"), binarized / "bin", "--user-dir", USER_DIR, "--cpu", *TINY,
        "--max-update", "10", "--hybrid-devices", "cpu,cpu", "--update-freq", "2", "--save-dir", save_dir)
    updates_two, two = parameters(checkpoint)
    updates_one, one = parameters(save_dir / "checkpoint_last.pt")
    assert updates_two == updates_one == 10
    assert_same_parameters(two, one)


def test_launcher_supplies_the_distributed_flags():
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}
    cpu = process_arguments("cpu", 2, ["data", "--arch", "hybrid_lstm_base"], env)
    assert cpu[:3] == ["data", "--arch", "hybrid_lstm_base"]
    text = " ".join(cpu)
    assert "--hybrid-devices cpu,cpu" in text and "--cpu" in cpu and "--distributed-backend gloo" in text
    assert "--distributed-world-size 4 --distributed-rank 3" in text and "--ddp-backend legacy_ddp" in text
    # the package itself, which fairseq imports as the user dir (a folder inside it would be imported as a
    # top-level module of its own, and recorded so in checkpoints)
    assert cpu[cpu.index("--user-dir") + 1] == os.path.dirname(os.path.abspath(fairseq_hybrid.__file__))
    gpu = " ".join(process_arguments("cuda", 2, ["data"], env))
    assert "--hybrid-devices cuda:2,cuda:3" in gpu and "--device-id 2" in gpu and "nccl" in gpu

    args, train_args = parse(["--nproc-per-node", "2", "--devices-per-process", "2", "--device", "cpu", "--",
                              "data", "--lr", "1"])
    command = torchrun_command(args, train_args)
    assert command[1:3] == ["-m", "torch.distributed.run"] and "--nproc-per-node" in command
    assert command[-6:] == ["--process", "cpu", "2", "data", "--lr", "1"]


@pytest.mark.parametrize("argv, message", [
    (["--nproc-per-node", "2"], "after --"),
    (["--", "data", "--distributed-world-size", "2"], "--distributed-world-size is set by"),
    (["--devices-per-process", "0", "--", "data"], "must be at least 1"),
])
def test_launcher_rejects_bad_arguments(argv, message, capsys):
    with pytest.raises(SystemExit):
        parse(argv)
    assert message in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("workers,port", [("threads", 29631), ("processes", 29641)])
def test_two_processes_equal_one_process_on_the_union_of_their_batches(binarized, tmp_path, workers, port):
    """fairseq gives rank r the batches r, r + 2, ...; one process with
    --update-freq 2 takes batches 2u and 2u + 1 for update u: the same
    union, so the same parameters after 10 updates (with a process per
    device too: each rank's group forks its stages)."""
    run(os.path.join(BIN, "fairseq-hybrid-train"), "--nproc-per-node", "2", "--devices-per-process", "2",
        "--device", "cpu", "--master-port", str(port), "--",
        binarized / "bin", *TINY, "--max-update", "10", "--save-dir", tmp_path / "two", "--hybrid-workers", workers)
    assert_equals_one_process_with_update_freq_2(binarized, tmp_path / "one", tmp_path / "two" / "checkpoint_last.pt")
    assert sorted(os.listdir(tmp_path / "two")) == ["checkpoint_best.pt", "checkpoint_last.pt"]


def train_command(binarized, save_dir, workers="threads"):
    return [os.path.join(BIN, "fairseq-train"), str(binarized / "bin"), "--user-dir", USER_DIR, "--cpu", *TINY,
            "--dropout", "0.2", "--max-update", "16", "--save-interval-updates", "4", "--hybrid-devices", "cpu,cpu",
            "--hybrid-workers", workers, "--save-dir", str(save_dir)]


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["threads", "processes"])
def test_sigkill_mid_epoch_and_restart_ends_like_an_uninterrupted_run(binarized, tmp_path, workers):
    """Killed with SIGKILL after update 8 and run again, training ends where
    the uninterrupted run does; with a process per device the stages end
    with the trainer."""
    run(*train_command(binarized, tmp_path / "whole", workers))
    command = train_command(binarized, tmp_path / "killed", workers)
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
    if workers == "processes":
        assert len(stages) >= 2
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in stages) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in stages if alive(pid)]
    killed_at = parameters(last)[0]
    assert 8 <= killed_at < 16  # killed in the middle of the first epoch (64 batches)
    resumed = run(*command)
    assert f"@ {killed_at} updates" in resumed.stdout + resumed.stderr
    updates, after_restart = parameters(last)
    assert updates == 16
    assert_same_parameters(after_restart, parameters(tmp_path / "whole" / "checkpoint_last.pt")[1])


def children(pid):
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


@pytest.mark.slow
def test_a_dead_process_stops_the_others(binarized, tmp_path):
    launcher = subprocess.Popen(
        [os.path.join(BIN, "fairseq-hybrid-train"), "--nproc-per-node", "2", "--devices-per-process", "1",
         "--device", "cpu", "--master-port", "29632", "--", str(binarized / "bin"), *TINY, "--max-update", "100000",
         "--save-dir", str(tmp_path / "run")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        output = []
        for line in launcher.stdout:
            output.append(line)
            if "num_updates=3," in line:
                break
        (torchrun,) = children(launcher.pid)
        ranks = children(torchrun)
        assert len(ranks) == 2, ranks
        os.kill(ranks[-1], signal.SIGKILL)
        start = time.time()
        rest, _ = launcher.communicate(timeout=120)
        elapsed = time.time() - start
    finally:
        if launcher.poll() is None:
            launcher.kill()
    text = "".join(output) + rest
    assert launcher.returncode != 0
    assert elapsed < 120
    assert "ChildFailedError" in text and "SIGKILL" in text, text[-3000:]


def two_nodes(binarized, port, devices_per_process, max_update, save_dir):
    """Two "nodes" on this machine: two launchers with --nnodes 2 over
    loopback, each one process of ``devices_per_process`` CPU devices."""
    return [
        subprocess.Popen([os.path.join(BIN, "fairseq-hybrid-train"), "--nnodes", "2", "--node-rank", str(rank),
                          "--master-addr", "127.0.0.1", "--master-port", str(port), "--nproc-per-node", "1",
                          "--devices-per-process", str(devices_per_process), "--device", "cpu", "--",
                          str(binarized / "bin"), *TINY, "--max-update", str(max_update), "--save-dir", str(save_dir)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for rank in (0, 1)
    ]


@pytest.mark.slow
def test_two_nodes_on_one_machine_equal_one_process_on_the_union_of_their_batches(binarized, tmp_path):
    """Two "nodes" over loopback (two launchers, --nnodes 2, each one process
    of 2 CPU devices) give the parameters of one process with --update-freq 2
    after 10 updates, as two processes on one node do."""
    launchers = two_nodes(binarized, 29633, 2, 10, tmp_path / "nodes")
    outputs = []
    try:
        for launcher in launchers:
            outputs.append(launcher.communicate(timeout=300)[0])
    finally:
        for launcher in launchers:
            if launcher.poll() is None:
                launcher.kill()
    assert [launcher.returncode for launcher in launchers] == [0, 0], outputs[0][-2000:] + outputs[1][-2000:]
    assert_equals_one_process_with_update_freq_2(binarized, tmp_path / "one",
                                                 tmp_path / "nodes" / "checkpoint_last.pt")


def tree(pid):
    """``pid`` and all its descendants."""
    found = [pid]
    for child in children(pid):
        found += tree(child)
    return found


@pytest.mark.slow
def test_a_dead_node_stops_the_other_naming_it(binarized, tmp_path):
    """Two "nodes" over loopback; node 1 dies whole (launcher, torchrun and
    its process killed): node 0 stops within a bounded time, and its output
    names the rank and node that stopped answering."""
    launchers = two_nodes(binarized, 29634, 1, 100000, tmp_path / "run")
    try:
        output = []
        for line in launchers[0].stdout:
            output.append(line)
            if "num_updates=3," in line:
                break
        for pid in reversed(tree(launchers[1].pid)):
            os.kill(pid, signal.SIGKILL)
        start = time.time()
        rest, _ = launchers[0].communicate(timeout=120)
        elapsed = time.time() - start
    finally:
        for launcher in launchers:
            if launcher.poll() is None:
                launcher.kill()
            launcher.wait()
    text = "".join(output) + rest
    assert launchers[0].returncode != 0
    assert elapsed < 120
    assert "rank 0 (node 0) stopped training" in text and "stopped answering: rank 1 (node 1)" in text, text[-3000:]
