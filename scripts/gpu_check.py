#!/usr/bin/env python3
"""A few-minute check of the hybrid group on the device at hand.

1. runs the exactness and engine tests (``tests/test_hybrid_exactness.py``,
   ``tests/test_hybrid_engine.py``; the CUDA variants run where CUDA is
   present),
2. trains ``hybrid_lstm_base``-sized models on random batches and prints
   target tokens/s for one device and for groups of K devices in each mode,
   where a "device" list may repeat the one GPU (``cuda:0,cuda:0``: virtual
   devices) so the scheme's overheads show even on a single GPU.

  python scripts/gpu_check.py                    # cuda when present, else cpu
  python scripts/gpu_check.py --device cpu --groups 2 --steps 3
"""

import argparse
import os
import subprocess
import sys
import time

import torch

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(REPO, "tests"))
sys.path.insert(0, REPO)


def throughput(devices, mode, device, steps, batch, src_len, tgt_len, vocab):
    from conftest import StandInTask, build_model, make_dictionary, make_sample
    from fairseq_hybrid.criterions.hybrid_cross_entropy import HybridCrossEntropyCriterion

    src_dict, tgt_dict = make_dictionary(vocab), make_dictionary(vocab)
    options = {"hybrid_devices": ",".join(devices), "hybrid_mode": mode} if devices else {}
    torch.manual_seed(0)
    model = build_model("hybrid_lstm_base", src_dict, tgt_dict, encoder_layers=4, decoder_layers=4, **options)
    if not devices:
        model = model.to(device)
    criterion = HybridCrossEntropyCriterion(StandInTask(src_dict, tgt_dict), False, 0.1)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    sample = make_sample(src_dict, tgt_dict, [src_len] * batch, [tgt_len] * batch)
    tokens = 0
    for step in range(steps + 1):
        if step == 1:  # the first step is warm-up
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            start, tokens = time.perf_counter(), 0
        optimizer.zero_grad()
        loss, sample_size, _ = criterion(model, sample)
        (loss / sample_size).backward()
        optimizer.step()
        tokens += sample["ntokens"]
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return tokens / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--groups", default="2,4", help="group sizes K to measure (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--skip-tests", action="store_true")
    args = parser.parse_args()
    if not args.skip_tests:
        tests = [os.path.join(REPO, "tests", name) for name in ("test_hybrid_exactness.py", "test_hybrid_engine.py")]
        code = subprocess.call([sys.executable, "-m", "pytest", "-q", *tests])
        if code != 0:
            return code
    count = torch.cuda.device_count() if args.device == "cuda" else 0
    shape = dict(device=args.device, steps=args.steps, batch=args.batch, src_len=30, tgt_len=30, vocab=8000)
    base = throughput([], "hybrid", **shape)
    print(f"\n{args.device}, hybrid_lstm_base size with 4+4 layers, batch {args.batch} x 30 tokens, {args.steps} steps")
    print(f"| group | mode | target tokens/s | vs one device |\n| --- | --- | ---: | ---: |\n| one device | - | {base:,.0f} | 1.00x |")
    for k in (int(x) for x in args.groups.split(",")):
        devices = [f"cuda:{i % count}" for i in range(k)] if count else ["cpu"] * k
        for mode in ("hybrid", "model", "data"):
            rate = throughput(devices, mode, **shape)
            print(f"| {','.join(devices)} | {mode} | {rate:,.0f} | {rate / base:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
