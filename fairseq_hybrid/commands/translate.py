"""``fairseq-hybrid-translate``: standard input to standard output, one
translation per input line, always in its place.

    fairseq-hybrid-translate --run work/tatoeba_ja_en/hybrid_lstm_base < input.ja > output.en

What recipes/tatoeba_ja_en/translate.sh runs.  Lines are read as bytes
and split at ``\\n`` only (:mod:`fairseq_hybrid.translation.line_input`), translated
``--buffer-size`` lines at a time (:mod:`fairseq_hybrid.translation.line_translation`)
and written as soon as their buffer is done.  On standard error: one
message per line that was changed before translating (invalid UTF-8,
control characters, too long for the model) or could not be translated,
each naming the line's number, a progress line every
``--progress-seconds`` on long inputs, and at the end the count of every
line read, with how many have a translation.

Exit status: 0 when every line was translated (notes or not), 1 when some
lines could not be translated (each named on standard error, each an
empty output line), 2 for a usage error (no run, no checkpoint).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import warnings

from ..translation.line_input import read_lines

EXIT_SOME_LINES_FAILED = 1
EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fairseq-hybrid-translate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, help="a run folder (checkpoints/ inside, bin/ and spm/ above)")
    parser.add_argument("--checkpoint", help="a checkpoint, or several joined with ':' (default: the run's best)")
    parser.add_argument("--data", help="the binarized data's folder, for its dictionaries (default: bin/ above the run)")
    parser.add_argument("--sentencepiece-model", help="default: spm/spm.model above the run")
    parser.add_argument("--beam", type=int, default=5, help="beam size (default: 5)")
    parser.add_argument("--buffer-size", type=int, default=64,
                        help="lines read before translating them as a batch (default: 64)")
    parser.add_argument("--progress-seconds", type=float, default=30.0,
                        help="a progress line on standard error this often (default: 30; 0: none)")
    parser.add_argument("--cuda", action="store_true", help="translate on the GPU (default: the CPU)")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.beam < 1 or args.buffer_size < 1:
        print("error: --beam and --buffer-size must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    from ..translation.hub import load_translator  # fairseq imports take seconds: after the argument check
    from ..translation.line_translation import LineTranslator

    # fairseq's task modules set the root logger to INFO when imported: only
    # warnings here, so that standard error holds what concerns the lines
    logging.basicConfig(format="%(message)s", level=logging.WARNING, stream=sys.stderr, force=True)
    warnings.filterwarnings("ignore", message=".*pin_memory.*")

    try:
        hub = load_translator(args.run, checkpoint=args.checkpoint, data=args.data,
                              sentencepiece_model=args.sentencepiece_model, beam=args.beam, cpu=not args.cuda)
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    if args.cuda:
        hub.cuda()
    translator = LineTranslator(hub, beam=args.beam, buffer_size=args.buffer_size)

    out = sys.stdout
    out.reconfigure(encoding="utf-8", newline="\n")  # whatever the locale says
    failed, done, started = [], 0, time.monotonic()
    last_report = started
    for result in translator.translate(read_lines(sys.stdin.buffer)):
        out.write(result.translation + "\n")
        for message in result.messages():
            print(message, file=sys.stderr)
        if result.error is not None:
            failed.append(result.number)
        done += 1
        now = time.monotonic()
        if args.progress_seconds and now - last_report >= args.progress_seconds:
            out.flush()
            print(f"{done} lines translated, {done / (now - started):.1f} lines/s", file=sys.stderr)
            last_report = now
        if done % args.buffer_size == 0:
            out.flush()
    out.flush()
    elapsed = time.monotonic() - started
    # the last line on standard error counts every line, whatever the progress lines said before it
    print(f"{done} lines translated ({done - len(failed)} with a translation, {len(failed)} empty after an error) "
          f"in {elapsed:.1f} s", file=sys.stderr)
    if failed:
        shown = ", ".join(map(str, failed[:20])) + (" ..." if len(failed) > 20 else "")
        print(f"error: {len(failed)} of {done} lines not translated (empty in the output): lines {shown}",
              file=sys.stderr)
        return EXIT_SOME_LINES_FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main())
