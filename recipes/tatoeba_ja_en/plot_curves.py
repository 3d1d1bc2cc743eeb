#!/usr/bin/env python3
"""A picture of a training run: validation loss (and BLEU, where the run
validated with ``--eval-bleu``) against updates and against minutes of
training, for one run and any others given to compare with (the recipe
passes the peer's run of the same work folder when it is there).

Everything comes from each run's ``train.log`` (fairseq-train's output with
``--log-format simple``, appended to across resumptions): the validation
lines give the loss and BLEU at an update; the minutes are fairseq's own
``wall`` meter of the last training line before that validation (it is
kept in the checkpoints, so a resumed run goes on counting from where it
stopped, without the time it was not running).

  python recipes/tatoeba_ja_en/plot_curves.py work/tatoeba_ja_en/hybrid_lstm_base \\
      --compare work/tatoeba_ja_en/lstm --out work/tatoeba_ja_en/hybrid_lstm_base/curves.png
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List

from fairseq_hybrid.timing.training_log import Curve, read_curve


def plot(curves: List[Curve], out: str, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [("loss", "validation loss")]
    if any(curve.bleu for curve in curves):
        rows.append(("bleu", "validation BLEU"))
    figure, axes = plt.subplots(len(rows), 2, figsize=(10, 3.6 * len(rows)), squeeze=False)
    for row, (metric, label) in enumerate(rows):
        for curve in curves:
            points = getattr(curve, metric)
            updates = sorted(points)
            if not updates:
                continue
            axes[row][0].plot(updates, [points[u] for u in updates], marker=".", label=curve.name)
            timed = [u for u in updates if u in curve.minutes]
            axes[row][1].plot([curve.minutes[u] for u in timed], [points[u] for u in timed], marker=".",
                              label=curve.name)
        axes[row][0].set_xlabel("updates")
        axes[row][1].set_xlabel("minutes of training (fairseq's wall meter)")
        for axis in axes[row]:
            axis.set_ylabel(label)
            axis.grid(alpha=0.3)
            axis.legend()
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    figure.savefig(out, dpi=100)
    plt.close(figure)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", help="the run folder (its train.log)")
    parser.add_argument("--compare", nargs="*", default=[],
                        help="other run folders drawn beside it (skipped when they have no train.log)")
    parser.add_argument("--out", default=None, help="the PNG (default: RUN/curves.png)")
    parser.add_argument("--title", default="")
    args = parser.parse_args(argv)
    try:
        curves = [read_curve(args.run)]
        for other in args.compare:
            if os.path.isfile(os.path.join(other, "train.log")):
                curves.append(read_curve(other))
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    out = args.out or os.path.join(args.run, "curves.png")
    plot(curves, out, args.title)
    for curve in curves:
        best = min(curve.loss, key=curve.loss.get)
        print(f"{curve.name}: {len(curve.loss)} validations, lowest loss {curve.loss[best]:.3f} at update {best}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
