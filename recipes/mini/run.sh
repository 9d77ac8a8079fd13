#!/usr/bin/env bash
# The mini recipe: a transducer trained from nothing on the built-in synthetic corpus.
#
# Usage: recipes/mini/run.sh [--stage N] [--stop-stage M] [--work DIR] [--preset mini|tiny]
#                            [--config FILE] [--seed N] [--set key=value]...
#   --seed N picks the corpus (texts, voices and the held-out split) and the training seed
#   0  synthesise the corpus (eSpeak NG; Debian's flite/festival voices too when present,
#      installed with apt when run as root unless ASRKIT_NO_APT=1)
#   1  prepare LibriSpeech-style manifests
#   2  train a SentencePiece tokenizer
#   3  extract features to TFRecord shards (+ global mean/variance statistics); half the
#      training utterances joined with the speaker's next ones up to 12 s, pauses between
#   4  train
#   5  decode test-clean (voices never heard in training) with the average of the last two
#      checkpoints: beam search (4) and greedy, and score both
#   6  report: five test utterances (reference vs hypothesis) and the training curves as
#      exp/curves.png (asrkit plot)
# Each finished stage leaves <work>/.done/<stage>; a rerun skips it (delete it to redo).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
stage=0; stop_stage=6; work=exp/mini; preset=mini; config="$here/conf/conformer_cpu.yaml"; seed=0
sets=()
while (( $# )); do
  case "$1" in
    --stage) stage=$2; shift 2 ;;
    --stop-stage) stop_stage=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --preset) preset=$2; shift 2 ;;
    --config) config=$(cd "$(dirname "$2")" && pwd)/$(basename "$2"); shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --set) sets+=(--set "$2"); shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
asrkit=${ASRKIT:-asrkit}
mkdir -p "$work/.done"; cd "$work"
# shellcheck source=../lib/stages.sh
source "$here/../lib/stages.sh"

install_voices() {
  if [[ $(id -u) == 0 && -z ${ASRKIT_NO_APT:-} ]] && command -v apt-get >/dev/null; then
    apt-get install -y -qq flite festival festvox-kallpc16k festvox-us-slt-hts sox \
      >/dev/null 2>&1 || log "could not install the Debian voices; eSpeak NG only"
  fi
  "$asrkit" corpus synth --out corpus --preset "$preset" --seed "$seed"
}

run_stage 0 corpus install_voices
run_stage 1 prepare "$asrkit" prepare librispeech --root corpus \
  --parts train-clean-100,dev-clean,test-clean --out data
vocab=64; [[ $preset == tiny ]] && vocab=28  # a dozen sentences cannot fill 64 pieces
run_stage 2 tokenizer "$asrkit" tokenizer train --manifest data/train-clean-100.jsonl \
  --vocab-size "$vocab" --model-type unigram --out tokenizer
run_stage 3 features corpus_features "$config" "${sets[@]}"
run_stage 4 train "$asrkit" train --config "$config" --exp-dir exp --set "train.seed=$seed" \
  "${sets[@]}"
decode() {
  "$asrkit" decode --exp-dir exp --shards shards/test --average 2 --method greedy \
    --out exp/decode_test_greedy
  "$asrkit" decode --exp-dir exp --shards shards/test --average 2 --method beam --beam 4 \
    --out exp/decode_test
  # Word times: the model's emission delay, from the held-out dev voices' speech onsets.
  "$asrkit" calibrate --exp-dir exp --manifest data/dev-clean.jsonl --average 2 \
    --method beam --beam 4 || echo "word times stay uncalibrated (see the error above)"
}
run_stage 5 decode decode
report() {
  echo "five held-out utterances, beam search (REF / HYP):"
  local id
  while read -r id; do
    echo "  $id"
    echo "    REF: $(grep "^$id " exp/decode_test/ref.txt | cut -d' ' -f2-)"
    echo "    HYP: $(grep "^$id " exp/decode_test/hyp.txt | cut -d' ' -f2-)"
  done < <(cut -d' ' -f1 exp/decode_test/ref.txt | sort | awk 'NR % 24 == 1' | head -n 5)
  grep -h "WER" exp/decode_test/report.txt | head -n 1
  "$asrkit" plot --exp-dir exp --out exp/curves.png
}
run_stage 6 report report
