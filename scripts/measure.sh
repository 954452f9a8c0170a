# Helpers shared by the measuring scripts (scripts/bench, scripts/redis-instructions), sourced
# after `set -euo pipefail` with SCRIPT set to the script's name for messages. Not a command.

# install_missing command:package... installs, with apt, the Debian package of each command that
# is not on the PATH.
install_missing() {
  local need=() pair
  for pair in "$@"; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || need+=("${pair#*:}")
  done
  [ ${#need[@]} -gt 0 ] || return 0
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
}

# work is a directory of the run's files, removed at exit, when the processes listed in pids are
# killed.
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# wait_for seconds command... retries command every 0.1 s for that long, and stops the script if
# it never succeeds.
wait_for() {
  local tries=$(($1 * 10))
  shift
  for _ in $(seq "$tries"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "$SCRIPT: not ready: $*" >&2
  exit 1
}

# build_tablease builds $work/tablease and gives this run an access-token secret, issuer and
# audience (exported, for serve and bench alike) and a lease-token key, $work/lease-key.pem.
build_tablease() {
  go build "$@" -o "$work/tablease" ./cmd/tablease
  export TABLEASE_JWT_HS256_SECRET="bench-secret-$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')"
  export TABLEASE_JWT_ISSUER=bench TABLEASE_JWT_AUDIENCE=tablease
  "$work/tablease" keygen --out "$work/lease-key.pem" 2>/dev/null
}
