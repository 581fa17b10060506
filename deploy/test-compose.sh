#!/usr/bin/env bash
# make test-compose: docker-compose.yml for real, under podman-compose, on a machine that reaches
# no image registry. As root, it installs what is missing (Debian's podman, runc, catatonit,
# netavark, aardvark-dns, iptables, debootstrap; podman-compose from pip in its own venv), builds a Debian
# bookworm base image with debootstrap (kept in podman's store: later runs reuse it) and a
# wheelhouse with `pip wheel` on the host (deploy/wheels/, kept while pyproject's dependencies
# do not change), builds the images with that base as BASE_IMAGE (NATS and Postgres as stand-ins,
# deploy/compose.test.yml), starts the stack, checks each container is what the compose file
# promises, drives a decision, a tuning session with an approval and a fleet task through the
# gateway with an engineer's token (tests/compose), then stops every container and checks that
# each stopped on SIGTERM and none is left.
#
# Environment: HPC_DS1_COMPOSE_FRESH=1 starts from empty volumes (a new log, database and home:
# the device is measured and trained again); HPC_DS1_COMPOSE_STATE (default build/compose) holds
# the tools, the generated Postgres password and the podman configuration.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
STATE=${HPC_DS1_COMPOSE_STATE:-$ROOT/build/compose}
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
PROJECT=hpcds1compose
BASE_IMAGE=localhost/hpc-ds1-base:bookworm
COMPOSE_FILES=(-f docker-compose.yml -f deploy/compose.test.yml)
# The setup that gives the agent's device a model: small, but real runs and a real training.
SETUP_ARGS=(--quick --workload gemm --sizes 64,96 --repeats 1)
T0=$SECONDS

say() { printf '[test-compose %4ds] %s\n' $((SECONDS - T0)) "$*"; }
die() {
    say "FAILED: $*" >&2
    exit 1
}

[ "$(id -u)" = 0 ] || die "run as root: it installs podman and runs rootful containers (DESIGN.md §5)"
[ -x "$PYTHON" ] || die "no $PYTHON: run \`make install\` first"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' ||
    die "$PYTHON is not Python 3.11: the wheelhouse must match the base image's Python (bookworm: 3.11)"
mkdir -p "$STATE"
chmod 0700 "$STATE"

# --- tools ---------------------------------------------------------------------------------
# netavark sets up the build and compose networks by running the iptables command, which its
# package does not depend on ("netavark: No such file or directory" on a machine without it).
PACKAGES=(podman runc catatonit netavark aardvark-dns iptables debootstrap)
missing=()
for package in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' ||
        missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "apt-get install ${missing[*]}"
    apt_get=(apt-get -q -o DPkg::Lock::Timeout=600)
    "${apt_get[@]}" update >/dev/null
    DEBIAN_FRONTEND=noninteractive "${apt_get[@]}" install -y --no-install-recommends \
        "${missing[@]}" >/dev/null
fi
# crun refuses this machine's hybrid cgroups; the default ulimits exceed the hard limits.
export CONTAINERS_CONF=$STATE/containers.conf
cat >"$CONTAINERS_CONF" <<'EOF'
[containers]
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]
[engine]
runtime = "runc"
EOF
PODMAN_COMPOSE=$STATE/tools/bin/podman-compose
if [ ! -x "$PODMAN_COMPOSE" ]; then
    say "pip install podman-compose (into $STATE/tools)"
    "$PYTHON" -m venv "$STATE/tools"
    "$STATE/tools/bin/pip" install -q podman-compose==1.6.0 >"$STATE/pip.log" 2>&1 ||
        die "pip install podman-compose failed: see $STATE/pip.log"
fi
pc() { "$PODMAN_COMPOSE" -p "$PROJECT" "${COMPOSE_FILES[@]}" "$@"; }
container() { printf '%s_%s_1' "$PROJECT" "$1"; }

# --- base image ----------------------------------------------------------------------------
if ! podman image exists "$BASE_IMAGE"; then
    mirror=${HPC_DS1_DEBIAN_MIRROR:-$(
        { grep -rhoE '^(URIs:|deb)[[:space:]]+(\[[^]]*\][[:space:]]+)?https?://[^[:space:]]+' \
            /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null || true; } |
            awk '{print $NF}' | grep -E '/debian/?$' | head -n 1 || true
    )}
    [ -n "$mirror" ] || die "no Debian mirror in /etc/apt/sources*: set HPC_DS1_DEBIAN_MIRROR"
    say "debootstrap bookworm from $mirror (python3, python3-venv)"
    rootfs=$STATE/rootfs
    rm -rf "$rootfs"
    debootstrap --variant=minbase --include=python3,python3-venv bookworm "$rootfs" "$mirror" \
        >"$STATE/debootstrap.log" 2>&1 || die "debootstrap failed: see $STATE/debootstrap.log"
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | podman import - "$BASE_IMAGE" >/dev/null
    rm -rf "$rootfs"
fi

# --- wheelhouse ----------------------------------------------------------------------------
requirements=$STATE/requirements.txt
"$PYTHON" -c "import tomllib; t = tomllib.load(open('pyproject.toml', 'rb')); print('\n'.join(t['tool']['hpc-ds1']['dependencies'] + t['project']['optional-dependencies']['mpich']))" >"$requirements"
printf 'setuptools>=69\nwheel\n' >>"$requirements"
stamp=deploy/wheels/.stamp
if ! cmp -s "$requirements" "$stamp" 2>/dev/null; then
    say "pip wheel the dependencies into deploy/wheels/"
    rm -f deploy/wheels/*.whl "$stamp"
    "$PYTHON" -m pip wheel -q --disable-pip-version-check -w deploy/wheels -r "$requirements" \
        >"$STATE/wheel.log" 2>&1 || die "pip wheel failed: see $STATE/wheel.log"
    cp "$requirements" "$stamp"
fi

# --- the compose file's variables ----------------------------------------------------------
envfile=$STATE/compose.env
if [ ! -s "$envfile" ]; then
    # Generated once and kept: Postgres reads it only when its volume is first created.
    (umask 077 && "$PYTHON" -c 'import secrets; print(secrets.token_urlsafe(24))' >"$envfile")
    # Volumes left by another checkout's run hold a database made with another password.
    HPC_DS1_COMPOSE_FRESH=1
fi
HPC_DS1_POSTGRES_PASSWORD=$(cat "$envfile")
HPC_DS1_GATEWAY_PORT=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export HPC_DS1_POSTGRES_PASSWORD HPC_DS1_GATEWAY_PORT
URL=http://127.0.0.1:$HPC_DS1_GATEWAY_PORT

# --- images --------------------------------------------------------------------------------
say "build: hpc-ds1 (multi-stage, BASE_IMAGE=$BASE_IMAGE, wheels only), NATS and Postgres stand-ins"
pc build --build-arg "BASE_IMAGE=$BASE_IMAGE" --build-arg WHEELS_ONLY=1 >"$STATE/build.log" 2>&1 ||
    die "the images did not build: see $STATE/build.log"
say "built"

# --- up ------------------------------------------------------------------------------------
leftovers() { podman ps -a -q --filter "label=io.podman.compose.project=$PROJECT"; }
finish() {
    status=$?
    trap - EXIT
    if [ $status -ne 0 ] && [ -n "$(leftovers)" ]; then
        for id in $(leftovers); do
            echo "--- $(podman inspect -f '{{.Name}}' "$id") (last lines)"
            podman logs --tail 15 "$id" 2>&1 | cut -c1-400
        done
    fi
    pc down >/dev/null 2>&1 || true
    [ -z "$(leftovers)" ] || say "containers left over: $(leftovers | tr '\n' ' ')"
    exit $status
}
trap finish EXIT

pc down ${HPC_DS1_COMPOSE_FRESH:+-v} >/dev/null 2>&1 # a run killed before its own `down`

# Podman 4.3 runs no healthchecks by itself (no systemd here) and podman-compose skips the
# `service_healthy` conditions on it, so this waits as Docker would, running the compose file's
# own healthcheck commands.
wait_healthy() {
    local service=$1 within=$2 deadline=$((SECONDS + $2))
    until podman healthcheck run "$(container "$service")" >/dev/null 2>&1; do
        [ $SECONDS -lt $deadline ] || die "$service not healthy within ${within} s"
        sleep 2
    done
    say "$service healthy"
}
say "up: nats, postgres"
pc up -d --no-build nats postgres >"$STATE/up.log" 2>&1 || die "up failed: see $STATE/up.log"
wait_healthy nats 120
wait_healthy postgres 120
say "up: every service"
pc up -d --no-build >>"$STATE/up.log" 2>&1 || die "up failed: see $STATE/up.log"
wait_healthy gateway 300

# --- what the compose file promises, checked in the running containers -----------------------
gateway=$(container gateway)
agent=$(container agent)
uid=$(podman exec "$gateway" id -u)
[ "$uid" != 0 ] || die "the services run as root"
podman exec "$gateway" sh -c 'test -O "$HPC_DS1_HOME" && test -w "$HPC_DS1_HOME"' ||
    die "the home volume is not owned and writable by the service user"
if podman exec "$gateway" sh -c 'command -v gcc || command -v cc' >/dev/null; then
    die "a compiler is left in the final image"
fi
init=$(podman exec "$agent" cat /proc/1/comm)
case $init in catatonit | podman-init | tini | docker-init) ;; *) die "PID 1 of the agent is $init, not an init" ;; esac
shm_kib=$(podman exec "$agent" df -k --output=size /dev/shm | tail -n 1 | tr -d ' ')
[ "$shm_kib" -ge 1000000 ] || die "/dev/shm of the agent is ${shm_kib} KiB (shm_size 1g expected)"
images=$(for s in projector coordinator placement decision trainer agent gateway; do
    podman inspect -f '{{.Image}}' "$(container "$s")"
done | sort -u | wc -l)
[ "$images" = 1 ] || die "the services run $images different images (one expected)"
say "checked: uid $uid, home owned and writable, no compiler, init $init, /dev/shm ${shm_kib} KiB, one image"

# --- tokens: the first admin token is the CLI's, on the home volume ---------------------------
ADMIN_TOKEN=$(podman exec "$gateway" cat /home/hpcds1/.hpc_ds1/credentials/cli.token)
ENGINEER_TOKEN=$(podman exec "$gateway" hpc-ds1 token create --name compose-test --role engineer --json 2>/dev/null |
    "$PYTHON" -c 'import json, sys; print(json.loads(sys.stdin.read())["token"])') ||
    die "hpc-ds1 token create in the gateway container failed"
say "tokens: admin (credentials/cli.token), engineer (hpc-ds1 token create)"

# --- a model for the agent's device, once per volume -------------------------------------------
has_model=$(curl -sf -H "Authorization: Bearer $ADMIN_TOKEN" "$URL/v1/model" |
    "$PYTHON" -c 'import json, sys; print(int(json.load(sys.stdin).get("model") is not None))')
if [ "$has_model" != 1 ]; then
    say "hpc-ds1 setup ${SETUP_ARGS[*]} (in the agent container: real runs, then training)"
    podman exec "$agent" hpc-ds1 setup "${SETUP_ARGS[@]}" 2>/dev/null | grep -E '^(setup|measured|trained)' ||
        die "setup in the agent container failed"
fi

# --- through the gateway ---------------------------------------------------------------------
say "tests/compose: a decision, a session with an approval, a fleet task"
HPC_DS1_COMPOSE_URL=$URL HPC_DS1_COMPOSE_TOKEN=$ENGINEER_TOKEN \
    "$ROOT/.venv/bin/pytest" -q -p no:cacheprovider tests/compose ||
    die "the flows through the gateway failed"

# --- stop: every container ends on SIGTERM within its grace period ----------------------------
say "stop"
pc stop >/dev/null 2>&1
codes=()
for id in $(leftovers); do
    read -r name code < <(podman inspect -f '{{.Name}} {{.State.ExitCode}}' "$id")
    codes+=("${name#"${PROJECT}"_}=$code")
    case $name in
    *_nats_1 | *_postgres_1) ok_codes=" 0 143 " ;; # the stand-ins: a plain SIGTERM exit is fine
    *) ok_codes=" 0 " ;;                            # ours end their work and exit 0
    esac
    [[ $ok_codes == *" $code "* ]] || die "$name exited with $code on stop (137: killed after the grace period)"
done
say "stopped: ${codes[*]}"
pc down >/dev/null 2>&1
[ -z "$(leftovers)" ] || die "containers left after down: $(leftovers | tr '\n' ' ')"
say "passed: down, no container left (volumes kept; HPC_DS1_COMPOSE_FRESH=1 starts afresh)"
