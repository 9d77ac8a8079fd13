# Shared by the recipes: timestamped logs and stages that leave a .done marker.
# Source it after setting $stage and $stop_stage, from inside the work directory.

log() { echo "[$(date '+%H:%M:%S')] $*"; }

run_stage() {  # run_stage N name command...
  local n=$1 name=$2; shift 2
  (( n < stage || n > stop_stage )) && return 0
  if [[ -f .done/$n ]]; then log "stage $n ($name): done before, skipped"; return 0; fi
  log "stage $n ($name)"; local t0=$SECONDS
  "$@"
  mkdir -p .done && touch ".done/$n"; log "stage $n ($name) took $((SECONDS - t0)) s"
}

# Features of a synthetic corpus' three parts (data/<part>.jsonl, tokenizer/ -> shards/,
# cmvn.json), as the mini and open recipes make them: half the training utterances start a
# run of the speaker's next ones joined up to 12 s with pauses of up to 1 s, so the model
# learns to go on past a sentence end and across a pause (long recordings); dev and test
# are only scored. Usage: corpus_features CONFIG [--set key=value]...
corpus_features() {
  local config=$1 part; shift
  for part in train-clean-100 dev-clean test-clean; do
    local join=(--allow-unknown)
    [[ $part == train-* ]] && join=(--join-seconds 12 --join-share 0.5 --join-pause 1)
    "$asrkit" features extract --manifest "data/$part.jsonl" --tokenizer tokenizer \
      --out "shards/${part%%-*}" --shards 8 --config "$config" "${join[@]}" "$@"
  done
  "$asrkit" features cmvn --shards shards/train --out cmvn.json --config "$config" "$@"
}
