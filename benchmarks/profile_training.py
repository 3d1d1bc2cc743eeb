#!/usr/bin/env python3
"""Where a training update of the main job spends its time, on one device
(docs/benchmarks.md, "Where an update of the main job goes").

The main job's model, criterion and optimizer, built through fairseq's
parser from the recipe's ``training.args`` and ``schedule.args``, run
fairseq's ``Trainer.train_step`` on the recipe's batches under
``torch.profiler``: the update by phase, the ops with the most self time,
the matrix products' and LSTM kernels' FLOPs per millisecond beside this
machine's sgemm rate, each layer's forward time.  ``--time-only`` times
the updates without the profiler (two trees' timings, in alternating runs,
compare two commits).

  python benchmarks/profile_training.py work/tatoeba_ja_en/bin --json docs/bench/profile_one_device.json
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections import defaultdict

import torch

from fairseq_hybrid.harness import measuring
from fairseq_hybrid.harness.measuring import write_report

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = os.path.join(REPO, "recipes", "tatoeba_ja_en")


def recipe_args(data: str, arch: str) -> list:
    """fairseq-train's arguments as the main job's recipe gives them (its
    ``training.args`` and ``schedule.args``, which ``run.sh`` reads; fairseq's
    ``lstm`` at the same size for ``--arch lstm``)."""
    model = measuring.fairseq_lstm_args() if arch == "lstm" else measuring.preset_args(arch)
    settings = [*measuring.read_args(os.path.join(RECIPE, "training.args")),
                *measuring.read_args(os.path.join(RECIPE, "schedule.args"))]
    return [data, "--cpu", *model, *settings, "--no-save", "--disable-validation"]


def part_hooks(model) -> list:
    """Label the forward of each top-level part in the profile: the
    encoder's and decoder's layers and embeddings, the attention-softmax
    part (fairseq's lstm: the whole decoder)."""
    handles = []

    def label(module, name):
        state = {}

        def pre(_module, _inputs):
            state["ctx"] = torch.profiler.record_function(f"part: {name}")
            state["ctx"].__enter__()

        def post(_module, _inputs, _outputs):
            state.pop("ctx").__exit__(None, None, None)

        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post))

    class Unwrap:
        """A handle that takes a stack's labelled ``run_layer`` back off."""

        def __init__(self, stack):
            self.stack = stack

        def remove(self):
            del self.stack.run_layer

    def label_layers(stack, side):
        # the stacks call their layers' kernel past nn.LSTM.forward (no module hooks fire): label run_layer
        run_layer = stack.run_layer

        def labelled(index, *args, **kwargs):
            with torch.profiler.record_function(f"part: {side} layer {index}"):
                return run_layer(index, *args, **kwargs)

        stack.run_layer = labelled
        handles.append(Unwrap(stack))

    parts = {}
    encoder, decoder = model.encoder, model.decoder
    for side, stack in (("encoder", getattr(encoder, "stack", encoder)), ("decoder", getattr(decoder, "stack", decoder))):
        if hasattr(stack, "layers") and hasattr(stack, "embed_tokens"):
            parts[f"{side} embedding"] = stack.embed_tokens
            if hasattr(stack, "run_layer"):
                label_layers(stack, side)
            else:
                for index, layer in enumerate(stack.layers):
                    parts[f"{side} layer {index}"] = layer
    attention_softmax = getattr(decoder, "attention_softmax", None)
    if attention_softmax is not None:
        parts["attention-softmax features"] = attention_softmax
    for name, module in parts.items():
        label(module, name)
    return handles


def lstm_flops(model, samples) -> float:
    """Multiply-add FLOPs of the LSTM layers' forward over ``samples`` (the
    gate products ``4H x (I + H)`` per position and direction): the encoder
    runs packed (the sentences' own tokens), the decoder over the padded
    target width.  Backward does two products of each size (input and
    weight gradients), so forward + backward is three times this.  None for
    a model without ``hybrid_lstm``'s stacks."""
    encoder = getattr(model.encoder, "stack", None)
    decoder = getattr(model.decoder, "stack", None)
    if encoder is None or decoder is None:
        return None
    flops = 0.0
    for sample in samples:
        source_tokens = float(sample["net_input"]["src_lengths"].sum())
        target_positions = float(sample["net_input"]["prev_output_tokens"].numel())
        for stack, positions in ((encoder, source_tokens), (decoder, target_positions)):
            for layer in stack.layers:
                directions = 2 if layer.bidirectional else 1
                gates = 4 * layer.hidden_size
                flops += 2 * positions * directions * gates * (layer.input_size + layer.hidden_size)
    return flops


def sgemm_gflops(threads: int, size: int = 1024, repeats: int = 20) -> float:
    """The machine's float32 matrix-product rate at these threads: the
    ceiling for the model's products (best of a few timings)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(repeats):
            torch.mm(a, b)
        best = min(best, (time.perf_counter() - start) / repeats)
    return 2 * size ** 3 / best / 1e9


LABELS = ("phase:", "part:", "Optimizer", "autograd::")  # our own record_function labels and wrappers, not ops


def is_op(event) -> bool:
    return not event.key.startswith(LABELS)


PHASES = ("data", "forward+loss", "backward", "clip", "optimizer", "other")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", help="fairseq-preprocess output (ja-en)")
    parser.add_argument("--arch", default="hybrid_lstm_base")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads (the recipe's default)")
    parser.add_argument("--warmup", type=int, default=10, help="updates before the profiled ones")
    parser.add_argument("--steps", type=int, default=30, help="profiled updates")
    parser.add_argument("--top", type=int, default=15, help="ops shown")
    parser.add_argument("--json", default=None, help="write the tables here")
    parser.add_argument("--time-only", action="store_true",
                   help="no profiler: print the wall time of an update and stop")
    parser.add_argument("--no-mkldnn", action="store_true",
                   help="torch.backends.mkldnn off (PyTorch's native LSTM kernels)")
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []  # further fairseq-train arguments
    args = parser.parse_args(argv[: len(argv) - len(extra) - (1 if "--" in argv else 0)])
    if not os.path.isdir(args.data):
        parser.error(f"{args.data}: {measuring.NO_DATA}")
    torch.set_num_threads(args.threads)
    logging.disable(logging.WARNING)
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    train_parser = options.get_training_parser()
    cfg = convert_namespace_to_omegaconf(
        options.parse_args_and_arch(train_parser, recipe_args(args.data, args.arch) + extra))
    torch.manual_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    task.load_dataset("train")
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    trainer = Trainer(cfg, task, model, criterion)
    iterator = trainer.get_train_iterator(epoch=1).next_epoch_itr(shuffle=True)

    phase_seconds = defaultdict(float)
    patched = []

    def timed(obj, attr, phase):
        original = getattr(obj, attr)

        def wrapper(*a, **k):
            start = time.perf_counter()
            with torch.profiler.record_function(f"phase: {phase}"):
                result = original(*a, **k)
            phase_seconds[phase] += time.perf_counter() - start
            return result

        setattr(obj, attr, wrapper)
        patched.append((obj, attr, original))

    # What Trainer.train_step calls, each timed on its own.
    timed(task, "train_step", "forward+loss+backward")
    timed(trainer, "clip_grad_norm", "clip")
    timed(trainer.optimizer, "step", "optimizer")
    timed(trainer.optimizer, "backward", "backward")
    handles = part_hooks(model)

    profiled_samples = []

    def update(profiling: bool):
        start = time.perf_counter()
        with torch.profiler.record_function("phase: data"):
            sample = next(iterator)
        phase_seconds["data"] += time.perf_counter() - start
        if profiling:
            profiled_samples.append(sample)
        trainer.train_step([sample])
        return time.perf_counter() - start

    if args.no_mkldnn:
        torch.backends.mkldnn.enabled = False
    for _ in range(args.warmup):
        update(False)
    phase_seconds.clear()
    if args.time_only:
        total = sum(update(False) for _ in range(args.steps))
        print(f"{args.arch}, {args.threads} threads, {args.steps} updates after {args.warmup}: "
              f"{total / args.steps * 1000:.1f} ms an update")
        return
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                           with_flops=True) as prof:
        total = sum(update(True) for _ in range(args.steps))
    for obj, attr, original in patched:
        setattr(obj, attr, original)
    for handle in handles:
        handle.remove()

    per_update = total / args.steps
    phases = {
        "data": phase_seconds["data"],
        "forward+loss": phase_seconds["forward+loss+backward"] - phase_seconds["backward"],
        "backward": phase_seconds["backward"],
        "clip": phase_seconds["clip"],
        "optimizer": phase_seconds["optimizer"],
    }
    phases["other"] = total - sum(phases.values())
    print(f"{args.arch}, {args.threads} threads, {args.steps} updates after {args.warmup}: "
          f"{per_update * 1000:.0f} ms an update (profiler on)")
    print(f"\n{'phase':<24}{'ms/update':>10}{'share':>8}")
    for name in PHASES:
        print(f"{name:<24}{phases[name] / args.steps * 1000:>10.1f}{phases[name] / total:>8.1%}")

    events = prof.key_averages(group_by_input_shape=True)
    ops = sorted((e for e in events if is_op(e)),
                 key=lambda e: e.self_cpu_time_total, reverse=True)
    profiled_us = sum(e.self_cpu_time_total for e in events)
    op_rows = [{"op": e.key, "shapes": str(e.input_shapes)[:80], "calls_per_update": e.count / args.steps,
                "self_ms_per_update": e.self_cpu_time_total / args.steps / 1000,
                "share": e.self_cpu_time_total / profiled_us} for e in ops[: args.top]]
    print(f"\n{'op (input shapes)':<72}{'calls':>7}{'ms/upd':>8}{'share':>7}")
    for row in op_rows:
        print(f"{(row['op'] + ' ' + row['shapes'])[:71]:<72}{row['calls_per_update']:>7.1f}"
              f"{row['self_ms_per_update']:>8.1f}{row['share']:>7.1%}")

    by_op = defaultdict(float)
    for e in prof.key_averages():
        if is_op(e):
            by_op[e.key] += e.self_cpu_time_total
    op_totals = sorted(by_op.items(), key=lambda kv: kv[1], reverse=True)[: args.top]
    print(f"\n{'op (all shapes)':<40}{'ms/upd':>8}{'share':>7}")
    for name, us in op_totals:
        print(f"{name[:39]:<40}{us / args.steps / 1000:>8.1f}{us / profiled_us:>7.1%}")

    # How close the heavy work runs to the machine's matrix-product rate.
    peak = sgemm_gflops(args.threads)
    matmul_ops = ("aten::addmm", "aten::addmm_", "aten::mm", "aten::bmm")
    matmul_events = [e for e in prof.key_averages() if e.key in matmul_ops]
    matmul = {"gflop_per_update": sum(e.flops for e in matmul_events) / args.steps / 1e9,
              "ms_per_update": sum(e.self_cpu_time_total for e in matmul_events) / args.steps / 1000}
    rnn_events = [e for e in prof.key_averages() if e.key.startswith("aten::mkldnn_rnn_layer")
                  or e.key.startswith("aten::_thnn_fused_lstm_cell") or e.key == "aten::lstm"]
    forward_flops = lstm_flops(model, profiled_samples)
    lstm = None
    if forward_flops is not None and rnn_events:
        lstm = {"gflop_per_update": 3 * forward_flops / args.steps / 1e9,
                "ms_per_update": sum(e.self_cpu_time_total for e in rnn_events) / args.steps / 1000}
    print(f"\n{'work':<34}{'GFLOP/upd':>10}{'ms/upd':>8}{'GFLOP/s':>9}")
    for name, row in (("matrix products (profiler's count)", matmul), ("LSTM kernels fwd+bwd (counted)", lstm)):
        if row:
            row["gflop_per_s"] = row["gflop_per_update"] / row["ms_per_update"] * 1000
            print(f"{name:<34}{row['gflop_per_update']:>10.2f}{row['ms_per_update']:>8.1f}{row['gflop_per_s']:>9.1f}")
    print(f"{'sgemm 1024 x 1024 here':<34}{'':>10}{'':>8}{peak:>9.1f}")
    heavy_ms = matmul["ms_per_update"] + (lstm["ms_per_update"] if lstm else 0.0)
    heavy_gflop = matmul["gflop_per_update"] + (lstm["gflop_per_update"] if lstm else 0.0)
    at_peak_ms = heavy_gflop / peak * 1000
    print(f"products and LSTM kernels: {heavy_ms / (per_update * 1000):.0%} of the profiled update; "
          f"the same FLOPs at the sgemm rate would take {at_peak_ms:.0f} ms")

    parts = {e.key[len("part: "):]: e.cpu_time_total / args.steps / 1000
             for e in prof.key_averages() if e.key.startswith("part: ")}
    print(f"\n{'forward of part':<32}{'ms/update':>10}")
    for name, ms in parts.items():
        print(f"{name:<32}{ms:>10.1f}")

    write_report({"arch": args.arch, "threads": args.threads, "steps": args.steps, "warmup": args.warmup,
                  "extra": extra, "ms_per_update": per_update * 1000,
                  "phases_ms_per_update": {k: v / args.steps * 1000 for k, v in phases.items()},
                  "ops": op_rows,
                  "ops_all_shapes_ms_per_update": {k: v / args.steps / 1000 for k, v in op_totals},
                  "forward_parts_ms_per_update": parts,
                  "matrix_products": matmul, "lstm_kernels": lstm, "sgemm_gflop_per_s": peak,
                  "heavy_at_sgemm_rate_ms": at_peak_ms,
                  "torch": torch.__version__}, args.json)


if __name__ == "__main__":
    main()
