#!/usr/bin/env bash
# A licensed ja-en patent corpus (JPO-NICT, NTCIR PatentMT, ...) from plain
# aligned files to BLEU, both directions, with hybrid_lstm.
#
#   Tab-separated ja<TAB>en files:
#     bash recipes/patent_ja_en/run.sh --tsv train.tsv dev.tsv test.tsv
#   One sentence a line, PREFIX.ja and PREFIX.en side by side:
#     bash recipes/patent_ja_en/run.sh --lines corpus/train corpus/dev corpus/test
#   Add --gpus 4 for one 4-GPU hybrid group, --tiny --device cpu for a smoke run.
#
# The second file (dev) selects the model, the third (test) gives the final
# score; training sentences up to --max-len 50 words.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
recipe=patent_ja_en

prepare_input=()
rest=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --tsv|--lines)
      [[ $# -ge 4 ]] || { echo "error: $1 needs three arguments: TRAIN DEV TEST" >&2; exit 2; }
      prepare_input=(--format "${1#--}" --train "$2" --valid "$3" --test "$4"); shift 4 ;;
    -h|--help)
      sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | grep '^#' | sed 's/^# \{0,1\}//'
      echo "Options:"
      echo "  --tsv TRAIN DEV TEST        tab-separated ja<TAB>en files"
      echo "  --lines TRAIN DEV TEST      prefixes of aligned PREFIX.ja / PREFIX.en files"
      rest=(--help); break ;;
    --) rest+=("$@"); break ;;
    *) rest+=("$1"); shift ;;
  esac
done
prepare_missing="the corpus: --tsv TRAIN DEV TEST or --lines TRAIN DEV TEST"

# shellcheck source=../common/ja_en_pipeline.sh
source "$repo/recipes/common/ja_en_pipeline.sh" "${rest[@]}"
