#!/usr/bin/env python3
"""The GPU check's phases, one a process: ``benchmarks/gpu_check.py`` runs
each as ``gpu_phases.py NAME`` in a process group of its own under a hard
limit (``--limit``), which this process also keeps itself: at the limit
every thread's stack is dumped, the result kept (written on every change)
and the whole group ended.  What each phase runs: docs/gpu.md.
"""

import argparse
import faulthandler
import json
import os
import re
import signal
import subprocess
import sys
import threading

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
# fairseq's commands as modules of this interpreter: a GPU machine's python may carry fairseq on PYTHONPATH
# (installed with --target) without its console scripts beside the interpreter
FAIRSEQ_PREPROCESS = [sys.executable, "-m", "fairseq_cli.preprocess"]
FAIRSEQ_TRAIN = [sys.executable, "-m", "fairseq_cli.train"]
COST_FILE = "cost_file.json"  # what calibrate measured, as a cost set (fairseq_hybrid.forecasts.cost_file)
# what one GPU cannot measure (the link between GPUs, the step's time outside the cells, an LSTM time step's
# latency) the cost file takes from this set: NVLink 3, the nearest of the named sets to an H100/H200 server's
COST_BASE = "a100"
FIXTURE = os.path.join(REPO, "tests", "data", "tatoeba_ja_en_2k")
CHUNK_SWEEP = ("0", "10", "2", "auto")
MICRO_BATCH_SWEEP = (2, 4)  # a group of 4 at chunk length 0 with this many micro-batches
TRAIN_LIMIT = 40  # seconds for one fairseq-train run of the precision phase (its stacks are dumped past it)


class PhaseResult(dict):
    """A phase's result, written to its JSON file on every top-level change
    (and by :meth:`save`), so that a phase killed at its limit leaves what
    it had measured."""

    def __init__(self, path):
        super().__init__()
        self.path = path
        self.lock = threading.Lock()

    def save(self):
        with self.lock:
            for _ in range(3):  # another thread may be changing a nested value while it is written
                try:
                    text = json.dumps(self, indent=2, default=str)
                    break
                except RuntimeError:
                    continue
            else:
                return
            with open(self.path + ".tmp", "w") as file:
                file.write(text)
            os.replace(self.path + ".tmp", self.path)

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self.save()

    def update(self, *args, **kwargs):
        super().update(*args, **kwargs)
        self.save()


def watch_limit(result, limit):
    """At ``limit`` seconds dump every thread's stack, mark the result timed
    out and kill the phase's whole process group; a thread needs the GIL,
    so ``faulthandler``'s hard exit 5 s later stands behind it."""

    def expire():
        faulthandler.dump_traceback(all_threads=True)
        try:
            result.update(timed_out=True, ok=False)
        finally:
            sys.stderr.flush()
            os.killpg(os.getpgid(0), signal.SIGKILL)

    timer = threading.Timer(limit, expire)
    timer.daemon = True
    timer.start()
    faulthandler.dump_traceback_later(limit + 5, exit=True)


def devices_for(device, count, k):
    """K device names: real GPUs where there are enough, else virtual ones
    on the GPUs there are (cuda:0,cuda:0,...); K CPU devices on CPU."""
    if device == "cpu":
        return ["cpu"] * k
    return [f"cuda:{i % count}" for i in range(k)]


def phase_exactness(args, result):
    tests = [os.path.join(REPO, "tests", name)
             for name in ("test_hybrid_exactness.py", "test_hybrid_cells.py", "test_cell_graph.py",
                          "test_single_device_masks.py", "test_worker.py")]
    tests.append(os.path.join(REPO, "tests", "test_stage_processes.py") + "::test_cuda_processes_equal_one_device")
    report = os.path.join(args.work, "exactness.xml")
    code = subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
                            *tests], cwd=REPO)
    text = open(report).read() if os.path.exists(report) else ""
    counts = {key: int(value) for key, value in re.findall(r'(tests|failures|errors|skipped)="(\d+)"', text)[:4]}
    cuda_cases = re.findall(r'<testcase [^>]*name="([^"]*cuda[^"]*)"', text)
    result.update(ok=code == 0, counts=counts, cuda_tests=cuda_cases)


def binarize(work):
    out = os.path.join(work, "bin")
    if os.path.exists(os.path.join(out, "dict.en.txt")):
        return out
    subprocess.check_call([sys.executable, os.path.join(REPO, "scripts", "spm_encode_parallel.py"), "--raw-dir",
                           FIXTURE, "--out-dir", os.path.join(work, "spm"), "--src", "ja", "--tgt", "en",
                           "--train-model", "--vocab-size", "2000"])
    spm = os.path.join(work, "spm")
    subprocess.check_call([*FAIRSEQ_PREPROCESS, "--source-lang", "ja", "--target-lang", "en",
                           "--joined-dictionary", "--trainpref", f"{spm}/train", "--validpref", f"{spm}/valid",
                           "--destdir", out, "--workers", "1"])
    return out


def run_logged(command, log_path, limit):
    """Run ``command`` with its output in ``log_path`` (kept if the phase is
    ended); past ``limit`` seconds every thread's stack is dumped into the
    log (SIGABRT to Python's faulthandler) and it is killed.  The exit code
    ("timed out" past the limit) and the log's text."""
    with open(log_path, "w") as log:
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                 env={**os.environ, "PYTHONFAULTHANDLER": "1"})
        try:
            code = child.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGABRT)
            try:
                child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            code = "timed out"
    return code, open(log_path, errors="replace").read()


def phase_precision(args, result):
    import torch

    data = binarize(args.work)
    count = torch.cuda.device_count() if args.device == "cuda" else 0
    group = ",".join(devices_for(args.device, count, 2))
    runs = {}
    result["runs"] = runs  # kept run by run
    for precision in args.precisions.split(","):
        if precision == "bf16":  # fairseq/options.py: "if args.bf16: args.tpu = True"
            runs[precision] = {"skipped": "fairseq 0.12's --bf16 means a TPU: on a GPU its Trainer stops for want "
                                          "of torch_xla (the second GPU check); --amp and --fp16 are its GPU options"}
            continue
        if args.device == "cpu" and precision != "fp32":
            runs[precision] = {"skipped": "needs CUDA"}
            continue
        flags = [] if precision == "fp32" else [f"--{precision}"]
        sides = [("one device", "one", []), (f"group {group}", "group", ["--hybrid-devices", group])]
        if precision != "fp32":  # a process per device under --amp and --fp16 (fp32: the exactness phase)
            sides.append((f"group {group}, processes", "processes",
                          ["--hybrid-devices", group, "--hybrid-workers", "processes"]))
        for side, name, extra in sides:
            save = os.path.join(args.work, f"precision_{precision}_{name}")
            command = [*FAIRSEQ_TRAIN, data, "--user-dir", os.path.join(REPO, "fairseq_hybrid"),
                       "--arch", "hybrid_lstm_tiny", "--criterion", "hybrid_cross_entropy", "--label-smoothing", "0.1",
                       "--optimizer", "adam", "--lr", "0.005", "--clip-norm", "1.0", "--max-tokens", "600",
                       "--max-update", str(args.updates), "--save-dir", save, "--no-epoch-checkpoints",
                       "--no-save-optimizer-state", "--seed", "3", "--no-progress-bar", "--log-format", "simple",
                       "--log-interval", "1", "--disable-validation", *(["--cpu"] if args.device == "cpu" else []),
                       *flags, *extra]
            code, log = run_logged(command, save + ".log", TRAIN_LIMIT)
            losses = [float(x) for x in re.findall(r"\| loss ([\d.]+|nan|inf)", log)]
            entry = {"ok": code == 0, "losses": losses[-3:],
                     "finite": bool(losses) and all(x == x and x != float("inf") for x in losses)}
            if code != 0:
                entry["error"] = log[-3000:]
            runs.setdefault(precision, {})[side] = entry
            result.save()
        if precision == "fp32" and all(r.get("ok") for r in runs["fp32"].values()):
            one = torch.load(os.path.join(args.work, "precision_fp32_one", "checkpoint_last.pt"), map_location="cpu")
            two = torch.load(os.path.join(args.work, "precision_fp32_group", "checkpoint_last.pt"), map_location="cpu")
            worst = max(float(((two["model"][k].float() - v.float()).abs().max() / (v.float().abs().max() + 1e-12)))
                        for k, v in one["model"].items())
            runs["fp32"]["largest relative parameter difference"] = worst
    result.update(runs=runs, ok=all(entry.get("ok", True) and entry.get("finite", True)
                                    for sides in runs.values() for entry in sides.values() if isinstance(entry, dict)))


def timed(arch, devices, device, steps, batch, length, vocab, **options):
    """``arch`` on one device (no ``devices``) or a group with ``options``,
    ``steps`` steps of one batch after a warm-up: the model, its batch,
    target tokens/s, seconds a step, each device's busy share."""
    import torch
    from fairseq.logging import metrics

    from fairseq_hybrid.criterions.hybrid_cross_entropy import HybridCrossEntropyCriterion
    from fairseq_hybrid.harness.measuring import train_steps
    from fairseq_hybrid.harness.stand_ins import StandInTask, build_model, make_dictionary, make_sample

    src_dict, tgt_dict = make_dictionary(vocab), make_dictionary(vocab)
    torch.manual_seed(0)
    model = build_model(arch, src_dict, tgt_dict, **({"hybrid_devices": ",".join(devices), **options} if devices
                                                     else {}))
    model = model if devices else model.to(device)
    criterion = HybridCrossEntropyCriterion(StandInTask(src_dict, tgt_dict), False, 0.1)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    # on the host: train_steps hands it over as fairseq's trainer does
    sample = make_sample(src_dict, tgt_dict, [length] * batch, [length] * batch)
    try:
        train_steps(model, criterion, optimizer, [sample], device)  # warm-up (and the stages' start)
        with metrics.aggregate(new_root=True) as logged:
            tokens, seconds = train_steps(model, criterion, optimizer, [sample] * steps, device)
        busy = [float(logged.get_smoothed_values()[f"dev{index}_busy"]) for index in range(len(devices))]
    finally:
        if devices and model.hybrid_group.stages is not None:
            model.hybrid_group.stages.close()
    return model, sample, tokens / seconds, seconds / steps, busy


def group_step(arch, devices, workers, device, steps, batch, length, vocab):
    """A group of ``devices`` with ``workers``: :func:`timed`'s figures and
    each device's cells a step (forward and backward)."""
    from fairseq_hybrid.parallel import build_step

    model, sample, rate, wall, busy = timed(arch, devices, device, steps, batch, length, vocab,
                                            hybrid_workers=workers)
    group = model.hybrid_group
    built = build_step(model, group.plan, sample["net_input"], sample["target"], None, group.chunk_length, 1,
                       group.replicas)
    cells = [2 * sum(1 for cell in built.step.cells if cell.worker == index) for index in range(len(devices))]
    return rate, wall, busy, cells


def phase_workers(args, result):
    """Threads against processes at K = 1, 2, 4 (docs/gpu.md): the host
    time per cell call of each device, and how far the hosts overlap."""
    import torch

    cuda = args.device == "cuda"
    count = torch.cuda.device_count() if cuda else 0
    arch, shape = (("hybrid_lstm_paper", dict(batch=128, length=50, vocab=32000)) if cuda else
                   ("hybrid_lstm_tiny", dict(batch=8, length=6, vocab=50)))
    rows = []
    result.update(rows=rows, shape=f"{arch}, {shape['batch']} sentences of {shape['length']} + {shape['length']} "
                                   f"tokens, {args.steps} timed steps after one warm-up")  # kept row by row
    for k in (1, 2, 4) if cuda else (1, 2):
        devices = devices_for(args.device, count, k)
        for workers in ("threads", "processes"):
            rate, wall, busy, cells = group_step(arch, devices, workers, args.device, args.steps, **shape)
            rows.append({"devices": ",".join(devices), "workers": workers, "target_tokens_per_s": rate,
                         "step_ms": wall * 1e3, "busy": busy,
                         "host_us_per_call": [share * wall / calls * 1e6 for share, calls in zip(busy, cells)],
                         "hosts_at_once": sum(busy)})
            result.save()
            print(rows[-1], flush=True)
    path = os.path.join(args.work, COST_FILE)
    if os.path.exists(path):  # calibrate's cost file: what each kind of worker measured, beside its host time
        data = json.load(open(path))
        data["workers"] = {"shape": result["shape"], "rows": rows}
        with open(path, "w") as file:
            json.dump(data, file, indent=2)
        result["cost_file"] = path
    result["ok"] = True


def phase_calibrate(args, result):
    """``fairseq-hybrid-plan calibrate`` on the paper's model into
    ``COST_FILE``, then a group of 4 by chunk length and micro-batches.  On
    CPU a smoke run of the same measurements at tiny sizes."""
    import torch

    from fairseq_hybrid.forecasts import cost_file
    from fairseq_hybrid.timing import gpu_calibration

    cuda = args.device == "cuda"
    count = torch.cuda.device_count() if cuda else 0
    arch = "hybrid_lstm_paper" if cuda else "hybrid_lstm_tiny"
    train = [binarize(args.work), "--arch", arch, "--max-tokens", "6400", "--source-lang", "ja", "--target-lang",
             "en", "--criterion", "hybrid_cross_entropy", "--label-smoothing", "0.1", *([] if cuda else ["--cpu"])]
    path = os.path.join(args.work, COST_FILE)
    if cuda:
        gpus = ",".join(f"cuda:{index}" for index in range(min(count, 4)))
        code, log = run_logged([sys.executable, "-c", "import sys; from fairseq_hybrid.commands.plan import main; "
                                "sys.exit(main())", "calibrate", gpus, "--base", COST_BASE, "--batches",
                                str(args.steps), "--out", path, "--", "fairseq-train", *train],
                               os.path.join(args.work, "calibrate.log"), args.limit - 25)
        if code != 0:
            result.update(ok=False, error=log[-3000:])
            return
    else:
        from fairseq_hybrid.command_lines.train_command import with_group_criterion
        from fairseq_hybrid.timing.plan_candidate import build

        measured = gpu_calibration.run({"train": with_group_criterion(train), "devices": ["cpu", "cpu"],
                                        "batches": args.steps, "reference": (8, 6, 6)}, build)
        cost_file.write(path, base=COST_BASE, tokens_per_s=measured["tokens_per_s"], lstm_seconds=measured["lstm"],
                        host_cost=measured["host_cost"], measured_on="CPU smoke run of benchmarks/gpu_check.py",
                        shape=measured["shape"])
    written = cost_file.load(path)
    result.update(cost_file=path, measured_on=written["measured_on"],
                  one_device_tokens_per_s=written["one_device_tokens_per_s"],
                  host_us_per_cell={f"K={row['k']}": row["cell_us"] for row in written["host_cost"]["rows"]},
                  lstm_seconds_per_step=written["lstm"]["seconds_per_step"])

    # the paper's setting on a GPU; a tiny one for the CPU smoke run
    shape = dict(batch=128, length=50, vocab=32000) if cuda else dict(batch=8, length=6, vocab=50)
    result["shape"] = f"{arch}, {shape['batch']} sentences of {shape['length']} + {shape['length']} tokens"
    common = dict(device=args.device, steps=args.steps, **shape)
    one = timed(arch, [], **common)[2]
    devices = devices_for(args.device, count, 4 if cuda else 2)
    sweep = {}
    result["chunk_sweep"] = {"devices": ",".join(devices), "rows": sweep}  # kept row by row
    for length in CHUNK_SWEEP:
        rate = timed(arch, devices, hybrid_chunk_length=length, **common)[2]
        sweep[length] = {"tokens_per_s": 2 * rate, "vs_one_device": rate / one}
        result.save()
        print(length, sweep[length], flush=True)
    for micro_batches in MICRO_BATCH_SWEEP:
        rate = timed(arch, devices, hybrid_micro_batches=micro_batches, **common)[2]
        sweep[f"0, M={micro_batches}"] = {"tokens_per_s": 2 * rate, "vs_one_device": rate / one}
        result.save()
        print(micro_batches, sweep[f"0, M={micro_batches}"], flush=True)
    result["ok"] = True


def phase_cells(args, result):
    """One LSTM cell and one attention-softmax cell as they run, at the
    paper's size (``benchmarks/cell_trace.py``)."""
    path = os.path.join(args.work, "cell_trace.json")
    subprocess.check_call([sys.executable, os.path.join(REPO, "benchmarks", "cell_trace.py"), "--device",
                           args.device, "--json", path])
    result.update(trace=json.load(open(path))["trace"]["cells"], report=path, ok=True)


def phase_streams(args, result):
    import torch

    if args.device != "cuda":
        result.update(ok=True, skipped="needs CUDA (the virtual streams check the same lines on CPU in the tests)")
        return
    from fairseq_hybrid.harness.cuda_sanitizer_workers import SharedSanitizer
    from fairseq_hybrid.harness.exactness import check_equal
    from fairseq_hybrid.harness.stand_ins import make_dictionary

    count = torch.cuda.device_count()
    dictionaries = (make_dictionary(), make_dictionary(37))
    sanitizer, runs = SharedSanitizer(), []
    with sanitizer.enabled():
        for k in (int(x) for x in args.groups.split(",")):
            devices = devices_for("cuda", count, k)
            for mode, micro_batches in (("hybrid", 1), ("hybrid", 3), ("model", 1), ("data", 1)):
                before = len(sanitizer.errors)
                entry = {"devices": ",".join(devices), "mode": mode, "micro_batches": micro_batches}
                try:
                    check_equal(devices, mode, dictionaries, batch_on_first_device=True, hybrid_chunk_length=3,
                                group_options={"hybrid_micro_batches": micro_batches})
                    entry["ok"] = True
                except Exception as error:  # a race (CUDASanitizerErrors) or a wrong result
                    entry.update(ok=False, error=str(error)[-1500:])
                entry["races"] = sanitizer.errors[before:][:5]
                runs.append(entry)
                print(entry, flush=True)
    waits = [step_without_waits(devices_for("cuda", count, int(k))) for k in args.groups.split(",")]
    for entry in waits:
        print(entry, flush=True)
    result.update(ok=all(run["ok"] and not run["races"] for run in runs) and all(run["ok"] for run in waits),
                  runs=runs, races=len(sanitizer.errors), no_waits=waits)


def step_without_waits(devices):
    """One group step after a warm-up under ``set_sync_debug_mode("error")``
    (process-wide: the workers' cells too), which raises on any op that makes
    the host wait for a GPU; the batch kept on the host as fairseq's is."""
    import torch

    from fairseq_hybrid.criterions.hybrid_cross_entropy import HybridCrossEntropyCriterion
    from fairseq_hybrid.harness.measuring import on_device
    from fairseq_hybrid.harness.stand_ins import StandInTask, build_model, make_dictionary, make_sample
    from fairseq_hybrid.parallel.runtime.host_batch import keep_on_host

    src_dict, tgt_dict = make_dictionary(), make_dictionary(37)
    model = build_model("hybrid_lstm_tiny", src_dict, tgt_dict, hybrid_devices=",".join(devices),
                        hybrid_chunk_length=3)
    criterion = HybridCrossEntropyCriterion(StandInTask(src_dict, tgt_dict), False, 0.1)
    entry = {"devices": ",".join(devices), "mode": "hybrid"}
    for checked in (False, True):
        sample = keep_on_host(make_sample(src_dict, tgt_dict, [7, 5, 3, 6], [4, 6, 2, 5]), devices,
                              lambda host: on_device(host, devices[0]))
        torch.cuda.set_sync_debug_mode("error" if checked else 0)
        try:
            loss, _, _ = criterion(model, sample)
            loss.backward()
        except Exception as error:  # the op that waited, raised in a cell or on this thread
            entry.update(ok=False, error=f"{type(error).__name__}: {str(error)[-1500:]}")
            return entry
        finally:
            torch.cuda.set_sync_debug_mode(0)
        model.zero_grad()
    entry["ok"] = True
    return entry


def phase_hang(args, result):
    """A phase that never ends, for the driver's test: a grandchild that
    would sleep ten minutes, a value recorded, then a wait for it."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    result.update(grandchild=sleeper.pid, before_the_hang=True)
    sleeper.wait()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("phase")
    parser.add_argument("--device", choices=("cuda", "cpu"), required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--limit", type=float, required=True, help="seconds")
    parser.add_argument("--groups", default="2,4")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--updates", type=int, default=4)
    parser.add_argument("--precisions", default="fp32,amp,fp16")
    args = parser.parse_args(argv)
    result = PhaseResult(os.path.join(args.work, f"{args.phase}.json"))
    watch_limit(result, args.limit)  # the hard limit: stacks dumped, result kept, process group ended
    try:
        globals()[f"phase_{args.phase}"](args, result)
    finally:
        result.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
