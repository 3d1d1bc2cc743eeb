"""Checkpoints load with torch.load's weights_only mode kept on."""

import argparse
import collections
import os

import numpy as np
import pytest
import torch
from fairseq import checkpoint_utils
from omegaconf import OmegaConf

from fairseq_hybrid.fairseq_patches.checkpoint_safety import UnsafeCheckpointError

SIDE_EFFECTS = []


class Payload:
    """Stands for a malicious object: unpickling it would run code."""

    def __reduce__(self):
        return (SIDE_EFFECTS.append, ("code ran",))


def test_legacy_fairseq_state_loads_with_weights_only(tmp_path):
    path = str(tmp_path / "legacy.pt")
    torch.save({
        "args": argparse.Namespace(arch="hybrid_lstm_tiny", lr=[0.1]),
        "cfg": OmegaConf.create({"model": {"dropout": 0.1, "name": None}, "lr": [0.1]}),
        "model": collections.OrderedDict(w=torch.ones(2)),
        "extra_state": {"best": np.float64(1.25), "stats": collections.defaultdict(int)},
        "optimizer_history": [], "last_optimizer_state": None,
    }, path)
    state = torch.load(path)  # weights_only is the default, and stays so
    assert state["args"].arch == "hybrid_lstm_tiny"
    assert state["extra_state"]["best"] == 1.25
    assert torch.equal(state["model"]["w"], torch.ones(2))


def test_unexpected_global_is_refused_with_a_clear_error(tmp_path):
    path = str(tmp_path / "evil.pt")
    torch.save({"model": {}, "x": Payload()}, path)
    with pytest.raises(UnsafeCheckpointError) as err:
        checkpoint_utils.load_checkpoint_to_cpu(path)
    message = str(err.value)
    assert message.startswith(f"refusing to load checkpoint {path}: it contains the pickled global getattr")
    assert "weights_only=False" not in message
    assert SIDE_EFFECTS == []


def test_allowlist_holds_no_code_running_callables():
    import builtins
    import subprocess

    from fairseq_hybrid.fairseq_patches.checkpoint_safety import allowed_globals

    allowed = allowed_globals()
    for dangerous in (builtins.eval, builtins.exec, builtins.getattr, builtins.__import__, os.system, subprocess.Popen):
        assert dangerous not in allowed


def test_fairseq_copies_checkpoints_atomically(tmp_path, monkeypatch):
    """A copy that dies half-way leaves the old checkpoint_last.pt whole."""
    import shutil

    from fairseq import checkpoint_utils

    source, last = tmp_path / "checkpoint_1_8.pt", tmp_path / "checkpoint_last.pt"
    source.write_bytes(b"new" * 1000)
    last.write_bytes(b"old checkpoint")

    def dies_half_way(src, dst, *args, **kwargs):
        with open(dst, "wb") as f:
            f.write(b"ne")
        raise KeyboardInterrupt("killed during the copy")

    monkeypatch.setattr(shutil, "copyfile", dies_half_way)
    with pytest.raises(KeyboardInterrupt):
        checkpoint_utils.PathManager.copy(str(source), str(last), overwrite=True)
    assert last.read_bytes() == b"old checkpoint"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_1_8.pt", "checkpoint_last.pt"]
    monkeypatch.undo()
    assert checkpoint_utils.PathManager.copy(str(source), str(last), overwrite=True)
    assert last.read_bytes() == b"new" * 1000
    assert not checkpoint_utils.PathManager.copy(str(source), str(last))  # no overwrite asked


def test_a_killed_copys_temporary_file_goes_with_the_next_copy(tmp_path):
    """SIGKILL skips the clean-up of a copy's temporary file; the next copy
    to the same name removes it, and leaves other files alone."""
    from fairseq import checkpoint_utils

    source, last = tmp_path / "checkpoint_1_8.pt", tmp_path / "checkpoint_last.pt"
    source.write_bytes(b"new")
    (tmp_path / "checkpoint_last.pt.k1ll3d_x.tmp").write_bytes(b"ne")
    (tmp_path / "checkpoint_best.pt.other.tmp").write_bytes(b"not ours to remove")
    assert checkpoint_utils.PathManager.copy(str(source), str(last), overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint_1_8.pt", "checkpoint_best.pt.other.tmp", "checkpoint_last.pt"]


def test_a_checkpoint_loads_where_its_devices_or_cost_model_are_missing(tmp_path):
    from argparse import Namespace

    import torch

    from fairseq_hybrid.fairseq_patches.checkpoint_portability import make_portable

    present = tmp_path / "simulation.json"
    present.write_text("{}")
    kept = make_portable({"cfg": {"model": Namespace(hybrid_devices="cpu,cpu", hybrid_placement="auto",
                                                     hybrid_cost_model=str(present))}})["cfg"]["model"]
    assert (kept.hybrid_devices, kept.hybrid_placement, kept.hybrid_cost_model) == ("cpu,cpu", "auto", str(present))
    moved = make_portable({"cfg": {"model": Namespace(hybrid_devices="cpu,cpu", hybrid_placement="auto",
                                                      hybrid_cost_model=str(tmp_path / "gone.json"))}})
    assert moved["cfg"]["model"].hybrid_placement == "auto" and moved["cfg"]["model"].hybrid_cost_model == ""
    far = make_portable({"cfg": {"model": Namespace(hybrid_devices="cuda:0,cuda:7", hybrid_placement="auto",
                                                    hybrid_cost_model=str(present))}})["cfg"]["model"]
    if torch.cuda.device_count() < 8:
        assert (far.hybrid_devices, far.hybrid_placement, far.hybrid_cost_model) == ("", "", "")
