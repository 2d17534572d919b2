#!/usr/bin/env bash
# `make test-compose`: build the images, bring compose.yaml up, run the
# integration suite against it (STREAMLAB_TARGET=compose), and always take it
# all down again. Called by .ci/run after `make test`.
#
# On a machine with a Docker engine it uses `docker compose` and the public
# base images. Otherwise (our CI machines: Debian, root, no registry to pull
# from) it runs the same file with Debian's docker-compose through podman's
# Docker-compatible API, on local base images (scripts/compose_images.sh); see
# ../shared/notes/containers.md for why each step is there.
#
# Every host port but the console's is a free one picked here, and the project
# name is unique, so it runs beside another run of itself; the console keeps
# lab.env's port (below), so stop a `make up` lab first.
# Extra arguments go to pytest (e.g. -k heartbeats).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
started=$SECONDS

RUN_DIR=$(mktemp -d "${TMPDIR:-/tmp}/streamlab-compose.XXXXXX")
PROJECT="streamlab-test-$$"
export STREAMLAB_COMPOSE_PROJECT="$PROJECT" STREAMLAB_IMAGE_TAG="$PROJECT"
# With STREAMLAB_COMPOSE_REPLICAS=1: 2 gateways, 2 engines and Redis
# (compose.replicas.yaml, docs/topology.md). The suite is replica-aware: a fault
# on "the engine hop" goes on every engine hop, engine counters are summed over
# every engine (the lab fixture learns the replicas from STREAMLAB_COMPOSE_OVERRIDE).
# CI runs this one (.ci/run); off by default here, so `make test-compose`
# alone still tries compose.yaml by itself (docs/compose.md, "2×2").
COMPOSE_FILES=(-f compose.yaml)
if [ "${STREAMLAB_COMPOSE_REPLICAS:-0}" = 1 ]; then
  COMPOSE_FILES+=(-f compose.replicas.yaml)
  export STREAMLAB_COMPOSE_OVERRIDE="compose.replicas.yaml"
fi
# With STREAMLAB_COMPOSE_PROXY=haproxy|caddy|traefik: that proxy in the `nginx`
# service (compose.<proxy>.yaml, docs/proxies.md); the lab fixture learns it
# from the same variable. Those proxies stand in front of one gateway, and
# much of the suite is about nginx's own locations, so `make
# test-compose-proxies` runs a smoke file (STREAMLAB_COMPOSE_TESTS) with each.
PROXY="${STREAMLAB_COMPOSE_PROXY:-nginx}"
case "$PROXY" in
  nginx) ;;
  haproxy|caddy|traefik)
    if [ "${STREAMLAB_COMPOSE_REPLICAS:-0}" = 1 ]; then
      echo "STREAMLAB_COMPOSE_PROXY=$PROXY stands in front of one gateway; the replicas'" \
           "lab (STREAMLAB_COMPOSE_REPLICAS=1) needs nginx" >&2
      rm -rf "$RUN_DIR"; exit 2
    fi
    COMPOSE_FILES+=(-f "compose.$PROXY.yaml") ;;
  *) echo "STREAMLAB_COMPOSE_PROXY=$PROXY: one of nginx haproxy caddy traefik" >&2
     rm -rf "$RUN_DIR"; exit 2 ;;
esac
export STREAMLAB_COMPOSE_PROXY="$PROXY"
# With STREAMLAB_COMPOSE_TRACING=1: the `tracing` profile (Jaeger) and its
# override (compose.tracing.yaml: the gateway's and engine's OTEL_* variables;
# docs/tracing.md); tests/integration/test_tracing_compose.py reads the spans.
if [ "${STREAMLAB_COMPOSE_TRACING:-0}" = 1 ]; then
  COMPOSE_FILES+=(-f compose.tracing.yaml)
  export COMPOSE_PROFILES=tracing
fi
# What pytest runs (default: the whole integration suite).
read -r -a TESTS <<<"${STREAMLAB_COMPOSE_TESTS:-tests/integration}"
PODMAN_PID="" HEALTH_PID="" ENGINE="" COMPOSE=() PROJECT_CREATED=""

# ---- teardown: always, whatever failed ------------------------------------------
teardown() {
  local rc=$?
  trap - EXIT INT TERM
  set +e
  if [ -n "$PROJECT_CREATED" ]; then
    if [ "$rc" -ne 0 ]; then
      say "failed (exit $rc): the services' last log lines"
      "${COMPOSE[@]}" logs --no-color --tail=30 >&2
    fi
    say "taking the compose lab down"
    timeout --foreground 120 "${COMPOSE[@]}" down --volumes --remove-orphans >/dev/null 2>&1
    # The images were tagged for this run only; their layers stay cached.
    for service in engine gateway toxiproxy nginx client redis "$PROXY"; do
      image_rm "streamlab-$service:$PROJECT"
    done
  fi
  # Only what this script started, by pid.
  [ -n "$HEALTH_PID" ] && kill -- "-$HEALTH_PID" 2>/dev/null && wait "$HEALTH_PID" 2>/dev/null
  [ -n "$PODMAN_PID" ] && kill "$PODMAN_PID" 2>/dev/null && wait "$PODMAN_PID" 2>/dev/null
  rm -rf "$RUN_DIR"
  say "compose test finished in $((SECONDS - started)) s (exit $rc)"
  exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT TERM

# ---- the compose program -----------------------------------------------------------
if docker compose version >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
  ENGINE=docker
  export STREAMLAB_COMPOSE_COMMAND="docker compose"
  COMPOSE=(docker compose "${COMPOSE_FILES[@]}" -p "$PROJECT")
  image_rm() { docker image rm "$1" >/dev/null 2>&1; }
else
  ENGINE=podman
  # --- what podman needs, from Debian's packages, skipping what is there
  missing=()
  for tool in podman runc docker-compose debootstrap curl; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
      echo "missing: ${missing[*]}; install them (Debian: apt-get install podman runc" \
           "docker-compose debootstrap) or run with a Docker engine" >&2
      exit 1
    fi
    say "installing ${missing[*]} and their network stack from Debian's packages"
    apt-get update -qq
    # No recommends: docker-compose would pull in docker.io and containerd.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      podman runc docker-compose debootstrap netavark aardvark-dns catatonit \
      iptables uidmap slirp4netns curl >/dev/null
  fi

  # --- podman's configuration for this run only (the system's is left alone).
  # runc: crun cannot set rlimits here; ulimits within this shell's hard
  # limits (no CAP_SYS_RESOURCE); cgroupfs and a file event log (no systemd).
  nofile=$(ulimit -Hn); nproc=$(ulimit -Hu)
  [ "$nofile" = unlimited ] && nofile=16384
  [ "$nproc" = unlimited ] && nproc=8192
  cat >"$RUN_DIR/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$((nofile < 16384 ? nofile : 16384)):$((nofile < 16384 ? nofile : 16384))", "nproc=$((nproc < 8192 ? nproc : 8192)):$((nproc < 8192 ? nproc : 8192))"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
  export CONTAINERS_CONF="$RUN_DIR/containers.conf"

  # --- the base images (built once, then cached in podman's storage)
  while IFS='=' read -r name value; do export "$name=$value"; done \
    < <(bash scripts/compose_images.sh)
  # Redis (compose.replicas.yaml) installs Debian's redis-server on the local
  # Debian base, as nginx's base does.
  export REDIS_BASE_IMAGE="$PYTHON_IMAGE"
  # HAProxy and Caddy (compose.haproxy.yaml, compose.caddy.yaml) likewise.
  export HAPROXY_BASE_IMAGE="$PYTHON_IMAGE" CADDY_BASE_IMAGE="$PYTHON_IMAGE"

  # --- podman's Docker-compatible API, on a socket of this run's own
  SOCKET="$RUN_DIR/podman.sock"
  setsid podman system service --time=0 "unix://$SOCKET" >"$RUN_DIR/podman-service.log" 2>&1 &
  PODMAN_PID=$!
  export DOCKER_HOST="unix://$SOCKET"
  for _ in $(seq 100); do
    curl -fsS --max-time 1 --unix-socket "$SOCKET" http://d/_ping >/dev/null 2>&1 && break
    sleep 0.1
  done
  curl -fsS --max-time 1 --unix-socket "$SOCKET" http://d/_ping >/dev/null

  # --- health checks: podman runs them from systemd timers, and there is no
  # systemd here, so compose would wait forever on `service_healthy`.
  # Its own session (setsid), like the API service: a Ctrl-C to this script's
  # process group must not take them down before teardown has used them.
  # Only containers not yet healthy (`up` waits on nothing else), all at once:
  # one by one, nine containers' Python checks took ~20 s a round on 2 busy
  # cores, and the 2x2 lab's chain of dependencies waited that long per link.
  PROJECT="$PROJECT" setsid bash -c '
    while true; do
      for id in $(podman ps -q --filter "label=com.docker.compose.project=$PROJECT" \
                    --filter status=running --filter health=starting 2>/dev/null) \
                $(podman ps -q --filter "label=com.docker.compose.project=$PROJECT" \
                    --filter status=running --filter health=unhealthy 2>/dev/null); do
        podman healthcheck run "$id" >/dev/null 2>&1 &
      done
      wait
      sleep 1
    done' &
  HEALTH_PID=$!

  export STREAMLAB_COMPOSE_COMMAND="docker-compose"
  COMPOSE=(docker-compose "${COMPOSE_FILES[@]}" -p "$PROJECT")
  # Through the compat API, builds are named like Docker does (docker.io/library/...).
  # --no-prune keeps the untagged parent layers: the next build starts from them.
  image_rm() { podman rmi --no-prune "$1" >/dev/null 2>&1; }
fi

# ---- free host ports; the suite's service settings ------------------------------------
# The replicas' published ports follow topology.py's rule, BASE + (k-1) * step,
# which the tools use to find them: with a step of 1 here, a replicated
# listener's base port is one whose next port is free too, and compose gets
# both (compose.replicas.yaml's STREAMLAB_<NAME>_2_PORT).
.venv/bin/python - >"$RUN_DIR/ports.env" <<'EOF'
import socket
names = ["EDGE", "EDGE_H2", "NGINX", "NGINX_H2", "UPSTREAM", "ENGINE_PROXY", "TOXIPROXY_API",
         "TOXIPROXY_BACKEND_API", "REDIS", "STORE_PROXY", "JAEGER_OTLP", "JAEGER_QUERY"]
replicated = ["GATEWAY", "ENGINE", "ENGINE_METRICS"]
held = []

def bind(port=0):
    s = socket.socket()
    s.bind(("127.0.0.1", port))
    held.append(s)
    return s.getsockname()[1]

print("STREAMLAB_REPLICA_PORT_STEP=1")
for name in names:
    print(f"STREAMLAB_{name}_PORT={bind()}")
for name in replicated:
    for _ in range(50):
        base = bind()
        try:
            bind(base + 1)
        except OSError:
            continue
        break
    else:
        raise SystemExit(f"no free pair of ports for {name}")
    print(f"STREAMLAB_{name}_PORT={base}\nSTREAMLAB_{name}_2_PORT={base + 1}")
EOF
while IFS='=' read -r name value; do export "$name=$value"; done <"$RUN_DIR/ports.env"
# The console keeps lab.env's port: nginx's CORS (proxies/nginx/compose.conf,
# rendered from lab.env) allows the console's page from that origin only, and
# the console tests load it. A `make up` lab holds the same port: say so.
console_port=$(sed -n 's/^STREAMLAB_CONSOLE_PORT=//p' lab.env)
if ! .venv/bin/python -c "import socket,sys; s=socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1])))" \
    "$console_port" 2>/dev/null; then
  echo "port $console_port (lab.env's console) is in use, probably by a lab from" \
       "\`make up\`: stop it (\`make down\`), then run this again" >&2
  exit 1
fi
# The settings the local-lab fixture gives engine and gateway (one definition,
# tests/integration/conftest.py), as env files for compose.yaml's env_file.
.venv/bin/python - "$RUN_DIR" <<'EOF'
import sys
from tests.integration.conftest import TEST_ENGINE_ENV, TEST_GATEWAY_ENV
for service, env in (("engine", TEST_ENGINE_ENV), ("gateway", TEST_GATEWAY_ENV)):
    with open(f"{sys.argv[1]}/{service}.env", "w") as out:
        out.writelines(f"{key}={value}\n" for key, value in env.items())
EOF
export STREAMLAB_ENGINE_ENV_FILE="$RUN_DIR/engine.env" STREAMLAB_GATEWAY_ENV_FILE="$RUN_DIR/gateway.env"
# The lab CA and nginx's certificate for the TLS + HTTP/2 listener, this run's own
# (compose.yaml mounts STREAMLAB_TLS_DIR into nginx; the keys go with RUN_DIR).
.venv/bin/streamlab compose tls --dir "$RUN_DIR/tls" >/dev/null
export STREAMLAB_TLS_DIR="$RUN_DIR/tls"

# ---- build, up, test ---------------------------------------------------------------
t0=$SECONDS
PROJECT_CREATED=1  # from here on, teardown has a project (and images) to remove
say "building the images ($ENGINE)"
timeout --foreground 900 "${COMPOSE[@]}" build >"$RUN_DIR/build.log" 2>&1 || { tail -n 40 "$RUN_DIR/build.log" >&2; exit 1; }
say "images built in $((SECONDS - t0)) s; bringing project $PROJECT up"
t0=$SECONDS
# `up -d` returns once each service's dependencies report healthy. (--foreground:
# timeout would otherwise put compose in a process group Ctrl-C does not reach.)
timeout --foreground 300 "${COMPOSE[@]}" up -d
say "up in $((SECONDS - t0)) s; edge on 127.0.0.1:$STREAMLAB_EDGE_PORT ($PROXY at the edge)"
# Only `up` waits on health; the suite probes the services itself. Stopping
# the loop gives its CPU back to the timing-sensitive tests (2 shared cores).
if [ -n "$HEALTH_PID" ]; then
  kill -- "-$HEALTH_PID"; wait "$HEALTH_PID" 2>/dev/null || true; HEALTH_PID=""
fi

export STREAMLAB_TARGET=compose
.venv/bin/streamlab status
t0=$SECONDS
.venv/bin/pytest "${TESTS[@]}" -p no:cacheprovider --durations=30 "$@"
say "integration suite against compose in $((SECONDS - t0)) s"
