#!/usr/bin/env bash
# Installs and starts a container engine on this machine, then builds the small local image
# the Docker integration test runs its entry in. Idempotent: every step is skipped when done.
#
# No image registry is reachable here, so the image is built from a root filesystem made
# with debootstrap from this machine's own Debian mirror (the one apt already uses).
# Debian's python is "externally managed", like the framework image: that is what makes the
# `pip install -e . --no-deps --break-system-packages` of the Docker context meaningful.
#
#   bash .ci/docker-engine.sh            install, start, build; prints the image name last
#   bash .ci/docker-engine.sh --check    exit 0 only when the engine answers and the image exists
#
# Environment: SLIME_CI_LOCAL_IMAGE (image name), SLIME_CI_DOCKER_ROOT (engine state),
# SLIME_CI_STORAGE_DRIVER (default: overlay2 where the kernel has overlay, else vfs, which
# works on any filesystem but copies the whole image for every container).
set -euo pipefail

IMAGE="${SLIME_CI_LOCAL_IMAGE:-slime-ci-local:bookworm}"
ROOT="${SLIME_CI_DOCKER_ROOT:-/var/lib/slime-ci-docker}"
DRIVER="${SLIME_CI_STORAGE_DRIVER:-auto}"
ROOTFS_TAR="$ROOT/rootfs-bookworm.tar"
PACKAGES="python3,python3-pip,python3-setuptools,python3-pytest,python-is-python3,ca-certificates"

say() { echo "docker-engine: $*"; }
engine_up() { timeout 20 docker info >/dev/null 2>&1; }
image_present() { timeout 20 docker image inspect "$IMAGE" >/dev/null 2>&1; }

if [[ "${1:-}" == "--check" ]]; then
    engine_up && image_present
    exit $?
fi

if [[ $EUID -ne 0 ]]; then
    say "must run as root (it installs Debian packages and starts dockerd)" >&2
    exit 2
fi

install_packages() {
    local missing=()
    command -v dockerd >/dev/null || missing+=(docker.io)
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    if ((${#missing[@]} == 0)); then
        return
    fi
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # The package scripts would try to start the service through an init system this
    # machine does not run; the engine is started below instead.
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

launch_dockerd() {
    local driver=$1
    mkdir -p "$ROOT/data-$driver" "$ROOT/exec"
    say "starting dockerd (storage driver $driver, no bridge, no iptables)"
    # Entries run with --network host, so no bridge and no NAT rules are needed; the
    # machine's own firewall is left untouched.
    setsid nohup dockerd \
        --storage-driver "$driver" \
        --data-root "$ROOT/data-$driver" \
        --exec-root "$ROOT/exec" \
        --pidfile "$ROOT/dockerd.pid" \
        --iptables=false --ip-masq=false --ip-forward=false --bridge=none \
        >"$ROOT/dockerd.log" 2>&1 </dev/null &
}

wait_engine() {
    local pid
    for _ in $(seq 1 90); do
        engine_up && return 0
        pid=$(cat "$ROOT/dockerd.pid" 2>/dev/null || true)
        # dockerd writes its pid file early; once that process is gone it will not answer.
        if [[ -n "$pid" ]] && ! kill -0 "$pid" 2>/dev/null; then
            return 1
        fi
        sleep 1
    done
    return 1
}

stop_our_dockerd() {
    local pid
    pid=$(cat "$ROOT/dockerd.pid" 2>/dev/null || true)
    if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
        kill "$pid"
        for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    fi
    rm -f "$ROOT/dockerd.pid"
}

start_engine() {
    if engine_up; then
        say "engine already running"
        return
    fi
    mkdir -p "$ROOT"
    if [[ -f "$ROOT/dockerd.pid" ]] && kill -0 "$(cat "$ROOT/dockerd.pid")" 2>/dev/null; then
        say "dockerd $(cat "$ROOT/dockerd.pid") is starting; waiting"
        wait_engine && { say "engine up"; return; }
        stop_our_dockerd
    fi
    local driver=$DRIVER
    if [[ "$driver" == auto ]]; then
        driver=vfs
        grep -qw overlay /proc/filesystems && driver=overlay2
    fi
    launch_dockerd "$driver"
    if ! wait_engine && [[ "$DRIVER" == auto && "$driver" != vfs ]]; then
        say "dockerd did not come up with $driver; falling back to vfs"
        tail -n 5 "$ROOT/dockerd.log" >&2 || true
        stop_our_dockerd
        launch_dockerd vfs
        wait_engine || true
    fi
    if engine_up; then
        say "engine up"
        return
    fi
    say "dockerd did not answer within 90 s; its log:" >&2
    tail -n 30 "$ROOT/dockerd.log" >&2 || true
    exit 1
}

debian_mirror() {
    # The first deb URI this machine's apt is configured with (deb822 or one-line format).
    local uri
    uri=$(grep -hsE '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' \
        | grep -v security | head -n 1 || true)
    if [[ -z "$uri" ]]; then
        uri=$(grep -hsE '^deb ' /etc/apt/sources.list | awk '{print $2}' | head -n 1 || true)
    fi
    if [[ -z "$uri" ]]; then
        say "no Debian mirror found in /etc/apt; cannot build the local image" >&2
        exit 1
    fi
    echo "$uri"
}

make_rootfs_tar() {
    local build="$ROOT/rootfs.$$"
    rm -rf "$build"
    mkdir -p "$build"
    local mirror
    mirror=$(debian_mirror)
    say "making the image's root filesystem: debootstrap bookworm from $mirror (a few minutes)"
    if ! debootstrap --variant=minbase --include="$PACKAGES" bookworm "$build" "$mirror" \
        >"$ROOT/debootstrap.log" 2>&1; then
        say "debootstrap failed; its log:" >&2
        tail -n 30 "$ROOT/debootstrap.log" >&2
        rm -rf "$build"
        exit 1
    fi
    rm -rf "$build"/var/cache/apt/archives/*.deb "$build"/var/lib/apt/lists/*
    # Kept, so a restarted engine (or another storage driver) imports it in seconds.
    tar -C "$build" -cf "$ROOTFS_TAR.tmp" .
    mv "$ROOTFS_TAR.tmp" "$ROOTFS_TAR"
    rm -rf "$build"
}

build_image() {
    if image_present; then
        say "image $IMAGE present"
        return
    fi
    [[ -s "$ROOTFS_TAR" ]] || make_rootfs_tar
    # Build isolation would fetch setuptools from an index; the image has it already.
    docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV PIP_NO_BUILD_ISOLATION=0' \
        --change 'ENV PIP_DISABLE_PIP_VERSION_CHECK=1' \
        --change 'CMD ["bash"]' \
        "$ROOTFS_TAR" "$IMAGE" >/dev/null
    say "image $IMAGE built"
}

install_packages
start_engine
build_image
echo "$IMAGE"
