#!/usr/bin/env python3
"""How far a hybrid group's training step is from one device's, on real
batches and real (for example trained) weights, next to how far one device
is from itself with another thread count: the unit tests prove equality on
small fixtures, this measures it where training happens.

For each batch: loss and gradients on one device with ``--threads`` (the
reference), with 1 thread (the rounding floor) and on the group
(``--devices``, ``--mode``), dropout off or, with ``--dropout-masks
single-device``, on with the same masks; the relative difference of each
to the reference (loss, gradient norm, the worst parameter).

  python benchmarks/check_exactness.py work/tatoeba_ja_en/bin \\
      --checkpoint work/tatoeba_ja_en/parity/one_seed1/checkpoints/checkpoint_last.pt
"""

import argparse
import logging
import os
import sys

import torch

from fairseq_hybrid.harness import measuring
from fairseq_hybrid.harness.measuring import NO_DATA, batches, build, preset_args


def loss_and_grads(model, criterion, sample, seed, threads):
    """One step's loss (double) and gradients with ``threads`` intra-op
    threads, dropout drawn from ``seed``."""
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    model.train()
    loss, _, grads = measuring.loss_and_grads(model, criterion, sample)
    return loss.double(), grads


def differences(loss, grads, loss_ref, grads_ref):
    flat = torch.cat([grads[n].flatten().double() for n in grads_ref])
    flat_ref = torch.cat([grads_ref[n].flatten().double() for n in grads_ref])
    per_param = max(float((grads[n] - grads_ref[n]).double().norm() / grads_ref[n].double().norm().clamp_min(1e-30))
                    for n in grads_ref)
    return (float((loss - loss_ref).abs() / loss_ref.abs()),
            float((flat - flat_ref).norm() / flat_ref.norm()), per_param)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", help="fairseq-preprocess output (ja-en)")
    parser.add_argument("--checkpoint", default=None, help="load these weights (default: a fresh model, seed 1)")
    parser.add_argument("--arch", default="hybrid_lstm_base")
    parser.add_argument("--devices", default="cpu,cpu", help="the group's --hybrid-devices")
    parser.add_argument("--mode", default="hybrid", choices=["hybrid", "model", "data"])
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--dropout-masks", default="off", choices=["off", "single-device"],
                        help="off: dropout 0 everywhere; single-device: --dropout with the same masks on all")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads of the reference")
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=2000)
    args = parser.parse_args(argv)
    if not os.path.isdir(args.data):
        parser.error(f"{args.data}: {NO_DATA}")
    logging.disable(logging.WARNING)

    dropout = 0.0 if args.dropout_masks == "off" else args.dropout
    masks = "single-device" if args.dropout_masks == "single-device" else "per-cell"
    task, single, criterion = build(args.data, preset_args(args.arch, dropout=dropout))
    _, group, _ = build(args.data, preset_args(args.arch, args.devices, args.mode, dropout=dropout, dropout_masks=masks))
    if args.checkpoint:
        from fairseq import checkpoint_utils

        state = checkpoint_utils.load_checkpoint_to_cpu(args.checkpoint)["model"]
        single.load_state_dict(state)
    group.load_state_dict(single.state_dict())

    print(f"{args.arch}, {'checkpoint ' + args.checkpoint if args.checkpoint else 'fresh weights'}, "
          f"dropout {dropout} ({args.dropout_masks}), batches of {args.max_tokens} tokens; "
          f"relative differences to one device with {args.threads} threads")
    print(f"{'batch':>5} {'target tokens':>13} | {'1 device, 1 thread':^30} | {args.devices + ' ' + args.mode:^30}")
    print(f"{'':>5} {'':>13} | {'loss':>9} {'grad':>9} {'max param':>10} | {'loss':>9} {'grad':>9} {'max param':>10}")
    worst = [0.0, 0.0]
    for index, sample in enumerate(batches(task, args.max_tokens, args.batches)):
        loss_ref, grads_ref = loss_and_grads(single, criterion, sample, index, args.threads)
        floor = differences(*loss_and_grads(single, criterion, sample, index, 1), loss_ref, grads_ref)
        hybrid = differences(*loss_and_grads(group, criterion, sample, index, args.threads), loss_ref, grads_ref)
        worst = [max(worst[0], floor[1]), max(worst[1], hybrid[1])]
        print(f"{index:>5} {sample['ntokens']:>13} | " + " ".join(f"{v:9.1e}" for v in floor[:2]) + f" {floor[2]:10.1e}"
              + " | " + " ".join(f"{v:9.1e}" for v in hybrid[:2]) + f" {hybrid[2]:10.1e}", flush=True)
    print(f"largest gradient difference: 1 thread {worst[0]:.1e}, group {worst[1]:.1e}")


if __name__ == "__main__":
    sys.exit(main())
