"""What the GPU check's phases share: where things are, a phase's result
kept on every change, the hard limit a phase keeps itself, the devices of
a group, the fixture binarized, a command run under a limit with its log,
a model's training steps timed (``benchmarks/gpu_phases.py`` runs the
phases; docs/gpu.md says what each measures)."""

import faulthandler
import json
import os
import signal
import subprocess
import sys
import threading

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
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
