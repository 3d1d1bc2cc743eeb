#!/usr/bin/env bash
# Translate Japanese from standard input into English with a run of the
# Tatoeba recipe: one sentence a line in, one translation a line out.
#
#   echo "ひとつ質問してもいいですか。" | bash recipes/tatoeba_ja_en/translate.sh
#   bash recipes/tatoeba_ja_en/translate.sh --run work/tatoeba_ja_en/hybrid_lstm_base < input.ja > output.en
#
# One line out for every line in, always in its place: blank lines come out
# blank, invalid UTF-8 is replaced (U+FFFD), control characters become
# spaces, a line too long for the model is translated sentence by sentence;
# each such line is named on stderr. A line that cannot be translated is
# named on stderr and comes out empty; the others are translated, and the
# exit status is then 1. It runs fairseq-hybrid-translate (python -m
# fairseq_hybrid.commands.translate) with the run's best checkpoint, else its last.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
run="$repo/work/tatoeba_ja_en/hybrid_lstm_base"
work=""
checkpoint=""
beam=5
buffer_size=64

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | grep '^#' | sed 's/^# \{0,1\}//'
  echo "Options:"
  echo "  --run DIR          the recipe's run folder (default: $run)"
  echo "  --work-dir DIR     the folder with bin/ and spm/ (default: the run folder's parent)"
  echo "  --checkpoint FILE  a checkpoint to use instead of the run's"
  echo "  --beam N           beam size (default: $beam)"
  echo "  --buffer-size N    lines translated together as a batch (default: $buffer_size)"
  echo "Exit status: 0 all lines translated, 1 some lines not (named on stderr), 2 usage errors."
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    --run) run="$2"; shift 2 ;;
    --work-dir) work="$2"; shift 2 ;;
    --checkpoint) checkpoint="$2"; shift 2 ;;
    --beam) beam="$2"; shift 2 ;;
    --buffer-size) buffer_size="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

if [[ -x "$repo/.venv/bin/python" && -z "${VIRTUAL_ENV:-}" ]]; then
  # shellcheck disable=SC1091
  source "$repo/.venv/bin/activate"
fi
work="${work:-$(dirname "$run")}"
[[ -d "$run" ]] || { echo "error: no run at $run (train one with recipes/tatoeba_ja_en/run.sh, or give --run)" >&2; exit 2; }
for needed in "$work/bin/dict.ja.txt" "$work/spm/spm.model"; do
  [[ -f "$needed" ]] || { echo "error: $needed not found (give --work-dir)" >&2; exit 2; }
done
options=(--run "$run" --data "$work/bin" --sentencepiece-model "$work/spm/spm.model" --beam "$beam"
         --buffer-size "$buffer_size")
[[ -n "$checkpoint" ]] && options+=(--checkpoint "$checkpoint")
exec python -m fairseq_hybrid.commands.translate "${options[@]}"
