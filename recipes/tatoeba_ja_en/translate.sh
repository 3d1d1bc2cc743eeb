#!/usr/bin/env bash
# Translate Japanese from standard input into English with a run of the
# Tatoeba recipe: one sentence a line in, one translation a line out.
#
#   echo "ひとつ質問してもいいですか。" | bash recipes/tatoeba_ja_en/translate.sh
#   bash recipes/tatoeba_ja_en/translate.sh --run work/tatoeba_ja_en/hybrid_lstm_base < input.ja > output.en
#
# It is fairseq-interactive on raw text (--bpe sentencepiece with the run's
# sentencepiece model), with the run's best checkpoint (the one the recipe
# scores), else its last. Blank input lines come out blank.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
run="$repo/work/tatoeba_ja_en/hybrid_lstm_base"
work=""
checkpoint=""
beam=5

usage() {
  sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  echo "Options:"
  echo "  --run DIR          the recipe's run folder (default: $run)"
  echo "  --work-dir DIR     the folder with bin/ and spm/ (default: the run folder's parent)"
  echo "  --checkpoint FILE  a checkpoint to use instead of the run's"
  echo "  --beam N           beam size (default: $beam)"
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    --run) run="$2"; shift 2 ;;
    --work-dir) work="$2"; shift 2 ;;
    --checkpoint) checkpoint="$2"; shift 2 ;;
    --beam) beam="$2"; shift 2 ;;
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
if [[ -z "$checkpoint" ]]; then
  checkpoint="$(python -c 'import sys; from fairseq_hybrid.hub import find_checkpoint; print(find_checkpoint(sys.argv[1]))' \
    "$run" 2>/dev/null)" || { echo "error: no checkpoint in $run/checkpoints" >&2; exit 2; }
fi

log="$(mktemp)"; text="$(mktemp)"; translations="$(mktemp)"
trap 'rm -f "$log" "$text" "$translations"' EXIT
cat > "$text"
# Blank lines are not translated: they come out blank, in their place.
blank='^[[:space:]]*$'
# D-<id> lines hold the detokenised hypothesis; fairseq prints them in input order.
if grep -qv "$blank" "$text" && ! grep -v "$blank" "$text" | fairseq-interactive "$work/bin" \
    --user-dir "$repo/fairseq_hybrid" --cpu --path "$checkpoint" --source-lang ja --target-lang en \
    --bpe sentencepiece --sentencepiece-model "$work/spm/spm.model" \
    --beam "$beam" --buffer-size 64 --max-tokens 8000 2>"$log" | grep '^D-' | cut -f3 > "$translations"; then
  cat "$log" >&2
  exit 1
fi
awk -v translations="$translations" -v blank="$blank" '
  BEGIN { while ((getline line < translations) > 0) out[++n] = line }
  $0 ~ blank { print ""; next }
  { print out[++i] }' "$text"
