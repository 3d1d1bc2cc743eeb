#!/usr/bin/env bash
# Translate the Tatoeba test split with one checkpoint and score it: what the
# recipe's generate and score steps run, and what the settings search runs
# for every checkpoint it compares.
#
#   bash recipes/tatoeba_ja_en/evaluate.sh --work-dir work/tatoeba_ja_en \
#       --checkpoint work/tatoeba_ja_en/hybrid_lstm_base/checkpoints/checkpoint_best.pt --out DIR
#
# Writes DIR/generate.out (fairseq-generate's output), DIR/hyp.en (the
# hypotheses in test-set order) and DIR/score.json (sacrebleu BLEU and chrF2
# with their signatures); skipped when DIR/score.json is newer than the
# checkpoint.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
work="$repo/work/tatoeba_ja_en"
checkpoint=""
out=""
beam=5

while [[ $# -gt 0 ]]; do
  case "$1" in
    --work-dir) work="$2"; shift 2 ;;
    --checkpoint) checkpoint="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --beam) beam="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ -n "$checkpoint" && -n "$out" ]] || { echo "error: give --checkpoint FILE and --out DIR" >&2; exit 2; }
[[ -f "$checkpoint" ]] || { echo "error: no checkpoint at $checkpoint" >&2; exit 2; }
if [[ -x "$repo/.venv/bin/python" && -z "${VIRTUAL_ENV:-}" ]]; then
  # shellcheck disable=SC1091
  source "$repo/.venv/bin/activate"
fi
mkdir -p "$out"
if [[ -f "$out/score.json" && "$out/score.json" -nt "$checkpoint" ]]; then
  exit 0
fi
# --required-batch-size-multiple 1: with fairseq's default of 8 the last
# batch is dropped when its size is not a multiple of 8 (fairseq issue 5036).
# --user-dir also for fairseq's lstm: it makes torch.load accept the
# argparse.Namespace such checkpoints hold, with weights_only kept on.
# --truncate-source: a source over --max-source-positions is translated from
# its start (extract_hypotheses.py names it) instead of stopping the run.
fairseq-generate "$work/bin" --user-dir "$repo/fairseq_hybrid" --cpu --path "$checkpoint" \
  --gen-subset test --beam "$beam" --max-tokens 8000 --remove-bpe sentencepiece \
  --required-batch-size-multiple 1 --truncate-source --max-source-positions 1024 \
  --skip-invalid-size-inputs-valid-test > "$out/generate.out"
python "$repo/scripts/extract_hypotheses.py" "$out/generate.out" "$out/hyp.en" --expect "$(wc -l < "$work/raw/test.en")" \
  --source "$work/spm/test.ja" --max-source-positions 1024
sacrebleu "$work/raw/test.en" -i "$out/hyp.en" -m bleu chrf > "$out/score.json.tmp"
mv "$out/score.json.tmp" "$out/score.json"
