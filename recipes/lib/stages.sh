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
