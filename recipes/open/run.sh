#!/usr/bin/env bash
# The open recipe: a Conformer transducer trained from nothing on open-vocabulary English
# (`asrkit corpus synth --preset open`: WordNet's example sentences, ~27 thousand words,
# spoken by eSpeak NG, flite and festival voices; held-out voices, names and words).
#
# Usage: recipes/open/run.sh [--stage N] [--stop-stage M] [--work DIR] [--preset open|open-tiny]
#                            [--config FILE] [--seed N] [--vocab N] [--set key=value]...
#   --seed N picks the corpus (text split, voices) and the training seed
#   0  synthesise the corpus (installs Debian's wordnet-base and voices with apt when run
#      as root unless ASRKIT_NO_APT=1); TEXT.json, names.txt and lm.txt beside it
#   1  prepare LibriSpeech-style manifests
#   2  train a SentencePiece tokenizer (unigram, --vocab pieces, 256 by default)
#   3  extract features to TFRecord shards (+ CMVN); half the training utterances joined
#      with the speaker's next ones up to 12 s, pauses between
#   4  train
#   5  decode test-clean (voices, names and words never heard in training) with the
#      average of the last two checkpoints: greedy and beam 4; beam 4 with a 4-gram LM of
#      corpus/lm.txt (text disjoint from every transcript) and LODR (a 2-gram of the
#      training transcripts); beam 4 boosting corpus/names.txt; both; calibrate word times
#   6  report: WER and CER, WER of the sentences with out-of-vocabulary words and of the
#      others, of those with held-out names and the others, the share of OOV words and of
#      the names recognised exactly, for each decode
#   7  export a SavedModel of that average (exp/saved_model)
# Each finished stage leaves <work>/.done/<stage>; a rerun skips it (delete it to redo).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
stage=0; stop_stage=7; work=exp/open; preset=open; config="$here/conf/conformer_open.yaml"
seed=0; vocab=256; sets=()
while (( $# )); do
  case "$1" in
    --stage) stage=$2; shift 2 ;;
    --stop-stage) stop_stage=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --preset) preset=$2; shift 2 ;;
    --config) config=$(cd "$(dirname "$2")" && pwd)/$(basename "$2"); shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --vocab) vocab=$2; shift 2 ;;
    --set) sets+=(--set "$2"); shift 2 ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ $preset == open || $preset == open-tiny ]] || {
  echo "run.sh: --preset $preset: open or open-tiny" >&2; exit 2; }
asrkit=${ASRKIT:-asrkit}
python=$(dirname "$(command -v "$asrkit")")/python
[[ -x $python ]] || python=python3
mkdir -p "$work/.done"; cd "$work"
# shellcheck source=../lib/stages.sh
source "$here/../lib/stages.sh"

corpus() {
  if [[ $(id -u) == 0 && -z ${ASRKIT_NO_APT:-} ]] && command -v apt-get >/dev/null; then
    apt-get install -y -qq wordnet-base wamerican flite festival festvox-kallpc16k \
      festvox-us-slt-hts sox >/dev/null 2>&1 || log "could not install Debian's packages"
  fi
  rm -rf corpus
  # a quarter of the training speakers from the natural (recorded-person) voices
  "$asrkit" corpus synth --out corpus --preset "$preset" --seed "$seed" --natural-share 0.25
}
decode() {
  local method name
  for method in greedy beam; do
    "$asrkit" decode --exp-dir exp --shards shards/test --average 2 --method "$method" \
      --beam 4 --out "exp/decode_test_$method"
  done
  # the LM's and LODR's weights are the config's decode.lm_weight and decode.lodr_weight;
  # the names' bonus its decode.boost_weight
  mkdir -p exp/lm
  local unknown=()  # open-tiny's 40 pieces miss letters its dozen sentences never say
  [[ $preset == open-tiny ]] && unknown=(--allow-unknown)
  "$asrkit" lm train --tokenizer exp --text corpus/lm.txt --order 4 --out exp/lm/text4.arpa \
    "${unknown[@]}"
  "$asrkit" lm train --tokenizer exp --manifest data/train-clean-100.jsonl --order 2 \
    --out exp/lm/transcripts2.arpa
  local lm=(--lm exp/lm/text4.arpa --lodr exp/lm/transcripts2.arpa) boost=(--boost corpus/names.txt)
  local -A fusion=([lm]="${lm[*]}" [boost]="${boost[*]}" [lm_boost]="${lm[*]} ${boost[*]}")
  for name in lm boost lm_boost; do
    # shellcheck disable=SC2086  # the options are words without spaces
    "$asrkit" decode --exp-dir exp --shards shards/test --average 2 --method beam --beam 4 \
      ${fusion[$name]} --out "exp/decode_test_beam_$name"
  done
  "$asrkit" calibrate --exp-dir exp --manifest data/dev-clean.jsonl --average 2 \
    --method beam --beam 4 || echo "word times stay uncalibrated (see the error above)"
}
report() {
  local method
  local name
  for name in greedy beam beam_lm beam_boost beam_lm_boost; do
    "$python" "$here/local/oov_report.py" --corpus corpus --decode "exp/decode_test_$name" \
      | tee "exp/decode_test_$name/oov.txt"
  done
}

run_stage 0 corpus corpus
run_stage 1 prepare "$asrkit" prepare librispeech --root corpus \
  --parts train-clean-100,dev-clean,test-clean --out data
[[ $preset == open-tiny ]] && vocab=40  # a dozen sentences cannot fill more
run_stage 2 tokenizer "$asrkit" tokenizer train --manifest data/train-clean-100.jsonl \
  --vocab-size "$vocab" --model-type unigram --out tokenizer
run_stage 3 features corpus_features "$config" "${sets[@]}"
run_stage 4 train "$asrkit" train --config "$config" --exp-dir exp --set "train.seed=$seed" \
  "${sets[@]}"
run_stage 5 decode decode
run_stage 6 report report
run_stage 7 export "$asrkit" export --exp-dir exp --average 2 --out exp/saved_model --force
