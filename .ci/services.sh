#!/usr/bin/env bash
# What the history tests need beside Python: a PostgreSQL server (Debian's package) on
# loopback in a temporary data directory, and Chromium for the browser tests (the coverage
# page, the HUD).
# Sourced by .ci/run: exports SLIME_CI_TEST_POSTGRES_URL when the server is up and stops
# it when the run ends. Where apt or the server is unavailable it says so and the tests
# that need them skip with the reason; nothing here fails the run.

_svc_say() { echo ".ci/services: $*"; }

_svc_apt() {  # install Debian packages that are missing; false when apt cannot
    local missing=()
    for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
    [ "${#missing[@]}" -eq 0 ] && return 0
    command -v apt-get >/dev/null 2>&1 || return 1
    timeout 600 apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null 2>&1 && return 0
    timeout 300 apt-get update >/dev/null 2>&1 || true
    timeout 900 apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null 2>&1
}

_svc_postgres() {
    _svc_apt postgresql || { _svc_say "PostgreSQL not installable here; its tests will skip"; return 0; }
    local bin; bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
    [ -x "$bin/pg_ctl" ] || { _svc_say "no pg_ctl found; the PostgreSQL tests will skip"; return 0; }
    local user=postgres; id "$user" >/dev/null 2>&1 || user=nobody
    SLIME_CI_PG_DIR=$(mktemp -d /tmp/slime-ci-pg.XXXXXX)
    chown "$user" "$SLIME_CI_PG_DIR"
    local port; port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    local as=(setpriv --reuid="$user" --regid="$(id -g "$user")" --clear-groups)
    [ "$(id -u)" -eq 0 ] || as=()
    if "${as[@]}" "$bin/initdb" -D "$SLIME_CI_PG_DIR/data" -U postgres --auth=trust --no-sync -E UTF8 \
            >"$SLIME_CI_PG_DIR/initdb.log" 2>&1 \
       && "${as[@]}" "$bin/pg_ctl" -D "$SLIME_CI_PG_DIR/data" -l "$SLIME_CI_PG_DIR/server.log" -w -t 60 \
            -o "-c listen_addresses=127.0.0.1 -c port=$port -k $SLIME_CI_PG_DIR -c fsync=off" start >/dev/null; then
        export SLIME_CI_TEST_POSTGRES_URL="postgresql://postgres@127.0.0.1:$port/postgres"
        SLIME_CI_PG_STOP=("${as[@]}" "$bin/pg_ctl" -D "$SLIME_CI_PG_DIR/data" -m fast -w stop)
        _svc_say "PostgreSQL up on 127.0.0.1:$port"
    else
        _svc_say "PostgreSQL did not start ($(tail -1 "$SLIME_CI_PG_DIR/server.log" 2>/dev/null || tail -1 "$SLIME_CI_PG_DIR/initdb.log")); its tests will skip"
    fi
}

slime_ci_services_stop() {
    if [ -n "${SLIME_CI_PG_STOP:-}" ]; then "${SLIME_CI_PG_STOP[@]}" >/dev/null 2>&1 || true; fi
    [ -n "${SLIME_CI_PG_DIR:-}" ] && rm -rf "$SLIME_CI_PG_DIR"
    return 0
}

_svc_postgres
command -v chromium >/dev/null 2>&1 || _svc_apt chromium \
    || _svc_say "Chromium not installable here; the browser tests (coverage page, HUD) will skip"
