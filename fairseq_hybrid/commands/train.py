"""``fairseq-hybrid-train``: several hybrid groups, one per process, trained
data-parallel over torch.distributed, with one command.

    fairseq-hybrid-train --nproc-per-node 2 --devices-per-process 2 -- DATA --arch hybrid_lstm_base ...

runs ``torchrun`` with ``nproc-per-node`` processes per node (``--nnodes``,
``--node-rank``, ``--master-addr``, ``--master-port`` for several nodes).
Each process drives one hybrid group of ``devices-per-process`` devices
(CUDA devices ``local_rank * K ... local_rank * K + K - 1`` of its node, or K
CPU devices with ``--device cpu``) and runs ``fairseq-train`` with the
distributed flags taken from torchrun's environment.  These are the flags
that work for fairseq on CPU too (docs/design.md, "One process per group"): ``env://``
initialisation, no spawning, gloo on CPU and NCCL on GPU, and fairseq's
``legacy_ddp``, which all-reduces every gradient once after the whole
backward pass (the hybrid engine's backward runs on its worker threads, not
inside one autograd call that PyTorch's DDP hooks could follow).  Batches
are split across processes only; checkpoints are written by rank 0 only.

When a process dies, torchrun stops the others on its node and names the
failed rank; on the other nodes the processes fail in their next
collective, and each names the ranks (and nodes) that stopped answering
(:mod:`.liveness`) before it exits.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from typing import List, Optional

from . import rank_liveness as liveness
from ..command_lines.owned_options import SET_BY_TRAIN
from ..command_lines.train_command import USER_DIR



def parse(argv: Optional[List[str]] = None):
    parser = argparse.ArgumentParser(
        prog="fairseq-hybrid-train",
        description=__doc__.split("\n\n")[0] + " Arguments after -- go to fairseq-train.",
    )
    parser.add_argument("--nproc-per-node", type=int, default=1, help="hybrid groups (processes) per node")
    parser.add_argument("--devices-per-process", type=int, default=1, help="devices of each hybrid group (K)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None,
                        help="device kind (default: cuda where available, else cpu)")
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--node-rank", type=int, default=0)
    parser.add_argument("--master-addr", default="127.0.0.1")
    parser.add_argument("--master-port", type=int, default=29500)
    parser.add_argument("--dry-run", action="store_true", help="print the torchrun command and stop")
    if argv is None:
        argv = sys.argv[1:]
    if "--" not in argv:
        if "-h" in argv or "--help" in argv:
            parser.parse_args(["--help"])  # prints the usage and exits 0
        parser.error("put the fairseq-train arguments after --, e.g. -- DATA --arch hybrid_lstm_base ...")
    split = argv.index("--")
    args = parser.parse_args(argv[:split])
    train_args = argv[split + 1:]
    for name, value in (("--nproc-per-node", args.nproc_per_node), ("--devices-per-process", args.devices_per_process),
                        ("--nnodes", args.nnodes)):
        if value < 1:
            parser.error(f"{name} must be at least 1, got {value}")
    for option in SET_BY_TRAIN:
        if any(arg == option or arg.startswith(option + "=") for arg in train_args):
            parser.error(f"{option} is set by fairseq-hybrid-train; leave it out of the fairseq-train arguments")
    return args, train_args


def torchrun_command(args, train_args: List[str]) -> List[str]:
    device = args.device
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nproc-per-node", str(args.nproc_per_node), "--nnodes", str(args.nnodes),
        "--node-rank", str(args.node_rank), "--master-addr", args.master_addr, "--master-port", str(args.master_port),
        "-m", "fairseq_hybrid.commands.train", "--process", device, str(args.devices_per_process), *train_args,
    ]


def process_arguments(device: str, per_process: int, train_args: List[str], env=os.environ) -> List[str]:
    """fairseq-train's arguments for the process torchrun started with
    ``env`` (RANK, WORLD_SIZE, LOCAL_RANK)."""
    rank, world_size, local_rank = int(env["RANK"]), int(env["WORLD_SIZE"]), int(env["LOCAL_RANK"])
    if device == "cuda":
        first = local_rank * per_process
        devices = ",".join(f"cuda:{first + i}" for i in range(per_process))
        placement = ["--device-id", str(first)]
        backend = "nccl"
    else:
        devices = ",".join(["cpu"] * per_process)
        placement = [] if "--cpu" in train_args else ["--cpu"]
        backend = "gloo"
    user_dir = [] if any(arg.startswith("--user-dir") for arg in train_args) else ["--user-dir", USER_DIR]
    return [
        *train_args, *user_dir, *placement, "--hybrid-devices", devices,
        "--distributed-world-size", str(world_size), "--distributed-rank", str(rank),
        "--distributed-init-method", "env://", "--distributed-no-spawn", "--distributed-backend", backend,
        "--ddp-backend", "legacy_ddp",
    ]


def process_main(argv: List[str], env=os.environ) -> None:
    """Inside a torchrun process: run fairseq-train for this rank; if it
    fails while other processes take part, say which of them stopped."""
    device, per_process, train_args = argv[0], int(argv[1]), argv[2:]
    sys.argv = ["fairseq-train", *process_arguments(device, per_process, train_args)]
    from fairseq_cli.train import cli_main

    rank, world_size = int(env["RANK"]), int(env["WORLD_SIZE"])
    per_node = int(env.get("LOCAL_WORLD_SIZE", "1"))
    store = None
    if world_size > 1:
        store = liveness.connect(env["MASTER_ADDR"], int(env["MASTER_PORT"]))
        liveness.Heartbeat(store, rank)
    try:
        cli_main()
    except Exception as error:
        if store is not None:
            sys.stderr.write(failure_message(rank, per_node, error, liveness.stopped_ranks(store, world_size, rank)))
        raise


def failure_message(rank: int, per_node: int, error: Exception, stopped: Optional[List[int]]) -> str:
    def where(r):
        return f"rank {r} (node {r // per_node})"

    first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
    if stopped is None:
        cause = "the run's store on --master-addr (node 0) cannot be reached: node 0 has stopped"
    elif stopped:
        cause = "stopped answering: " + ", ".join(where(r) for r in stopped)
    else:
        cause = "every other process still answers, so the failure is this process's own"
    return (f"fairseq-hybrid-train: {where(rank)} stopped training ({type(error).__name__}: {first_line}); "
            f"{cause}. Restart the same command on every node to resume from checkpoint_last.pt.\n")


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--process"]:
        process_main(argv[1:])
        return 0
    args, train_args = parse(argv)
    command = torchrun_command(args, train_args)
    if args.dry_run:
        print(" ".join(command))
        return 0
    return subprocess.call(command)


if __name__ == "__main__":
    sys.exit(main())
