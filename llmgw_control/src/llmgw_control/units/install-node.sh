#!/bin/sh
# Installs llmgw-node from the control daemon that served this script, writes its config and
# starts it. Run as root by the command `llmgw-control ctl nodes add NAME` printed; that command
# checked this script's sha256, and this script carries the sha256 of every wheel it installs
# (the node release's requirements.txt, pinned to uv.lock by `llmgw-control release prepare`).
#
# What it does: a new virtual environment per release, /opt/llmgw-node/releases/<id>, filled
# with `pip install --require-hashes --no-index` from control (nothing is resolved or built);
# that environment must pass `llmgw-node --version` and `llmgw-node probe`, and accept the
# config, before /opt/llmgw-node/current is switched to it in one rename and the daemon is
# restarted. A failure before the switch leaves the node exactly as it was. The release that was
# current stays (/opt/llmgw-node/previous) for a rollback; older ones are removed.
#
# Control serves the release's wheels to enrolled nodes only: pip fetches them with the node id
# and token as HTTP Basic credentials, from a private netrc file (never a command line).
#
# Input (environment):
#   LLMGW_NODE_ID, LLMGW_JOIN_TOKEN  for a new node (both required)
#   LLMGW_UPGRADE=1    switch an installed node to this script's release; its config is kept,
#                      and its node id and token there fetch the wheels
#   LLMGW_ROLLBACK=1   switch back to the release that was current before the last switch
#                      (no network; /opt/llmgw-node/install-node.sh is this script, kept)
#   LLMGW_PYTHON       the Python for new environments (default python3; 3.11 or newer)
#   LLMGW_INSTALL_ROOT install under another root (default /), for tests and images
#   LLMGW_INIT         systemd | direct: how the daemon is (re)started. Default: systemd when
#                      /run/systemd/system exists and no install root is given, else direct
#                      (started in the background, pid in <data>/llmgw-node.pid).
#   LLMGW_SYSTEMCTL, LLMGW_USERADD, LLMGW_USERMOD, LLMGW_GETENT, LLMGW_ID, LLMGW_CHOWN
#                      the commands the systemd path runs (default: the system's own). With an
#                      install root these still act on the real machine: a test of the systemd
#                      path points them at stand-ins that record what they were asked.
set -eu
# Root with a lax umask would leave the daemon's code writable by others; the unit's user
# must never be able to change what it runs.
umask 022

# @SETTINGS@

ROOT="${LLMGW_INSTALL_ROOT:-}"
ROOT="${ROOT%/}"
UPGRADE="${LLMGW_UPGRADE:-}"
ROLLBACK="${LLMGW_ROLLBACK:-}"
PYTHON="${LLMGW_PYTHON:-python3}"
SYSTEMCTL="${LLMGW_SYSTEMCTL:-systemctl}"
USERADD="${LLMGW_USERADD:-useradd}"
USERMOD="${LLMGW_USERMOD:-usermod}"
GETENT="${LLMGW_GETENT:-getent}"
ID="${LLMGW_ID:-id}"
CHOWN="${LLMGW_CHOWN:-chown}"
PREFIX="$ROOT/opt/llmgw-node"
RELEASES="$PREFIX/releases"
CURRENT="$PREFIX/current"
PREVIOUS="$PREFIX/previous"
ETC="$ROOT/etc/llmgw"
DATA="$ROOT/var/lib/llmgw-node"
CONFIG="$ETC/node.toml"
UNIT_FILE="$ROOT/etc/systemd/system/llmgw-node.service"

say() { printf 'llmgw-node install: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

INIT="${LLMGW_INIT:-}"
if [ -z "$INIT" ]; then
    if [ -z "$ROOT" ] && [ -d /run/systemd/system ]; then INIT=systemd; else INIT=direct; fi
fi
case "$INIT" in systemd|direct) ;; *) die "LLMGW_INIT=$INIT: use systemd or direct" ;; esac

if [ -n "$UPGRADE" ] || [ -n "$ROLLBACK" ]; then
    [ -f "$CONFIG" ] || die "no $CONFIG here: install with the command llmgw-control ctl nodes add printed"
else
    NODE_ID="${LLMGW_NODE_ID:-}"
    [ -n "$NODE_ID" ] || die "set LLMGW_NODE_ID"
    TOKEN="${LLMGW_JOIN_TOKEN:-}"
    [ -n "$TOKEN" ] || die "set LLMGW_JOIN_TOKEN"
fi
if [ -z "$ROOT" ] && [ "$(id -u)" != 0 ]; then
    die "run as root (it installs to /opt/llmgw-node, /etc/llmgw and a systemd unit)"
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# A file from control with the node's credentials (the netrc file below), never on a command line.
fetch() {
    if command -v curl >/dev/null 2>&1; then
        curl -fsSL --netrc-file "$work/.netrc" "$1" -o "$2"
    elif command -v wget >/dev/null 2>&1; then
        HOME="$work" wget -q -O "$2" "$1"
    else
        die "needs curl or wget"
    fi
}

# An environment passes when it prints its release's version and probes this machine. The probe
# uses a scratch data directory: the running daemon's (engines being installed) is not touched.
check_env() {
    env_dir="$1" version="$2"
    got=$("$env_dir/bin/llmgw-node" --version 2>&1) || die "$env_dir: llmgw-node --version failed: $got"
    [ "$got" = "llmgw-node $version" ] || die "$env_dir: llmgw-node --version says '$got', not llmgw-node $version"
    if [ -f "$CONFIG" ]; then set -- --config "$CONFIG"; else set --; fi
    "$env_dir/bin/llmgw-node" probe --json "$@" --data-dir "$work/probe" >"$work/probe.json" 2>"$work/probe.err" \
        || die "$env_dir: llmgw-node probe failed: $(tail -n 3 "$work/probe.err")"
}

# Point $CURRENT at releases/$1 in one rename (rename(2) replaces a symlink atomically), and
# remember what it pointed at as $PREVIOUS.
switch_to() {
    old=$(readlink "$CURRENT" 2>/dev/null || true)
    ln -sfn "releases/$1" "$PREFIX/.current.new"
    "$RELEASES/$1/bin/python" -c 'import os, sys; os.replace(sys.argv[1], sys.argv[2])' \
        "$PREFIX/.current.new" "$CURRENT"
    if [ -n "$old" ] && [ "$old" != "releases/$1" ]; then
        ln -sfn "$old" "$PREFIX/.previous.new"
        "$RELEASES/$1/bin/python" -c 'import os, sys; os.replace(sys.argv[1], sys.argv[2])' \
            "$PREFIX/.previous.new" "$PREVIOUS"
    fi
}

if [ -n "$ROLLBACK" ]; then
    back=$(readlink "$PREVIOUS" 2>/dev/null || true)
    case "$back" in
        releases/*) ;;
        *) die "no previous release to roll back to ($PREVIOUS)" ;;
    esac
    RELEASE_ID=${back#releases/}
    [ -x "$RELEASES/$RELEASE_ID/bin/llmgw-node" ] || die "the previous release $RELEASE_ID is gone"
    # Its version is whatever it holds; that it runs and probes is what is checked.
    NODE_VERSION=$("$RELEASES/$RELEASE_ID/bin/llmgw-node" --version 2>/dev/null | sed 's/^llmgw-node //') \
        || die "the previous release $RELEASE_ID does not run"
    check_env "$RELEASES/$RELEASE_ID" "$NODE_VERSION"
    "$RELEASES/$RELEASE_ID/bin/llmgw-node" init --check "$CONFIG" >/dev/null
    say "rolling back to release $RELEASE_ID (llmgw-node $NODE_VERSION)"
else
    command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found: install Python 3.11 or newer, or set LLMGW_PYTHON"
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
        || die "$PYTHON is $("$PYTHON" -V 2>&1); llmgw-node needs Python 3.11 or newer (set LLMGW_PYTHON)"
    if [ -n "$UPGRADE" ]; then
        # The node's own id and token, from its config (read with $PYTHON, which has tomllib:
        # a node of the layout before releases has no $CURRENT to read it with).
        creds=$("$PYTHON" -c 'import socket, sys, tomllib
c = tomllib.load(open(sys.argv[1], "rb"))
print(c.get("node_id") or socket.gethostname())
print(c.get("token", ""))' "$CONFIG") || die "cannot read the node id and token from $CONFIG"
        NODE_ID=$(printf '%s\n' "$creds" | sed -n 1p)
        TOKEN=$(printf '%s\n' "$creds" | sed -n 2p)
    fi
    # The node id and token go to control as HTTP Basic credentials from a netrc file (pip reads
    # the one $NETRC names), never on a command line, which ps shows everyone. The file is
    # private and removed with $work.
    host=${CONTROL_HTTP#*://}
    host=${host%%/*}
    case "$host" in
        \[*) host=${host%%]*}; host=${host#[} ;;
        *) host=${host%:*} ;;
    esac
    (umask 077 && printf 'machine %s login %s password %s\n' "$host" "$NODE_ID" "$TOKEN" > "$work/.netrc")
    here=$("$PYTHON" -c 'import platform, sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}-{platform.machine()}")')
    case " $TARGETS " in
        *" $here "*) ;;
        *) die "release $RELEASE_ID has wheels for $TARGETS; this machine is $here: on control, run llmgw-control release prepare with --python and --arch for it" ;;
    esac
    ENV="$RELEASES/$RELEASE_ID"
    mkdir -p "$RELEASES"
    case "$(readlink "$CURRENT" 2>/dev/null || true) $(readlink "$PREVIOUS" 2>/dev/null || true) " in
        *"releases/$RELEASE_ID "*) installed=yes ;;
        *) installed= ;;
    esac
    if [ -n "$installed" ] && [ -x "$ENV/bin/llmgw-node" ]; then
        # The current or the previous release: a complete install that passed before (switching
        # back to it after a rollback must not depend on control, nor delete it first).
        say "release $RELEASE_ID is already installed; checking it"
    else
        # The page pip installs from, first: credentials control refuses are said here, in
        # words, not as pip's "no matching distribution" (pip keeps a 401 to its debug log).
        fetch "$CONTROL_HTTP/install/releases/$RELEASE_ID/" "$work/release.html" \
            || die "control did not serve release $RELEASE_ID to node $NODE_ID (a 401: the token is not the one control has for this node id); the node is unchanged"
        # Whatever is at $ENV is neither current nor previous: a failed earlier attempt. Built
        # afresh, never trusted half-made.
        rm -rf "$ENV"
        say "installing release $RELEASE_ID (llmgw-node $NODE_VERSION) into $ENV"
        "$PYTHON" -m venv "$ENV" || die "cannot create a virtual environment (on Debian/Ubuntu: apt-get install python3-venv)"
        cat > "$work/requirements.txt" <<'LLMGW_REQUIREMENTS_EOF'
@REQUIREMENTS@
LLMGW_REQUIREMENTS_EOF
        # --isolated: no pip.conf, no PIP_* variables (an extra index could not sneak in);
        # --no-index: control's release page is the only source; --require-hashes: every file
        # must match a digest above, dependencies included, or nothing is installed. NETRC is
        # not pip's own setting: --isolated keeps it, and the credentials reach control;
        # --no-input: credentials control refuses end the install, never a password prompt.
        NETRC="$work/.netrc" "$ENV/bin/python" -m pip --isolated install --quiet --disable-pip-version-check --no-cache-dir --no-input \
            --require-hashes --no-index --only-binary :all: \
            --find-links "$CONTROL_HTTP/install/releases/$RELEASE_ID/" -r "$work/requirements.txt" \
            || die "installing release $RELEASE_ID failed; the node is unchanged (the old release keeps running)"
        "$ENV/bin/python" -m pip --isolated check --disable-pip-version-check >/dev/null \
            || die "release $RELEASE_ID is inconsistent (pip check); the node is unchanged"
    fi
    check_env "$ENV" "$NODE_VERSION"
    mkdir -p "$ETC" "$DATA"
    if [ -z "$UPGRADE" ]; then
        # The unit runs with /var/lib/llmgw-node; a daemon started directly under an install
        # root keeps its data there too.
        data_dir=/var/lib/llmgw-node
        if [ -n "$ROOT" ] && [ "$INIT" = direct ]; then data_dir="$DATA"; fi
        # The token goes through the environment, never the command line (which ps shows everyone).
        "$ENV/bin/llmgw-node" init --force --output "$CONFIG.new" --control "$CONTROL_WS" \
            --node-id "$NODE_ID" --data-dir "$data_dir" >/dev/null
        if [ -e "$CONFIG" ] && cmp -s "$CONFIG" "$CONFIG.new"; then
            rm -f "$CONFIG.new"  # the same command run again: nothing to change
        else
            if [ -e "$CONFIG" ]; then
                cp -p "$CONFIG" "$CONFIG.bak"
                say "kept the previous config as $CONFIG.bak"
            fi
            mv -f "$CONFIG.new" "$CONFIG"
        fi
    fi
    # The new version must accept the config before the running daemon is replaced.
    "$ENV/bin/llmgw-node" init --check "$CONFIG" >/dev/null
fi

switch_to "$RELEASE_ID"
# Keep the current and the previous release; an interrupted install's leftovers go too.
keep_previous=$(readlink "$PREVIOUS" 2>/dev/null || true)
for old in "$RELEASES"/*; do
    [ -e "$old" ] || continue
    case "releases/${old##*/}" in
        "releases/$RELEASE_ID"|"$keep_previous") ;;
        *) rm -rf "$old" ;;
    esac
done
# For a rollback without control: this script, next to the releases it switches between.
if [ -z "$ROLLBACK" ] && [ -f "$0" ]; then cp "$0" "$PREFIX/install-node.sh.new" && mv -f "$PREFIX/install-node.sh.new" "$PREFIX/install-node.sh"; fi

if [ "$INIT" = systemd ]; then
    if ! $ID llmgw >/dev/null 2>&1; then
        $USERADD --system --home-dir /var/lib/llmgw-node --no-create-home --shell /usr/sbin/nologin llmgw
    fi
    # GPUs are opened through these groups; a group this machine lacks is skipped.
    for group in video render; do
        if $GETENT group "$group" >/dev/null 2>&1; then $USERMOD -aG "$group" llmgw; fi
    done
    $CHOWN -R llmgw:llmgw "$DATA"
    chmod 0750 "$DATA"
    $CHOWN root:llmgw "$CONFIG"
    chmod 0640 "$CONFIG"
    mkdir -p "${UNIT_FILE%/*}"
    cat > "$UNIT_FILE.new" <<'LLMGW_UNIT_EOF'
@UNIT@
LLMGW_UNIT_EOF
    chmod 0644 "$UNIT_FILE.new"
    mv -f "$UNIT_FILE.new" "$UNIT_FILE"
    $SYSTEMCTL daemon-reload
    $SYSTEMCTL enable llmgw-node.service >/dev/null
    # --no-block: the unit is "started" once control welcomes the node, which may take a while.
    $SYSTEMCTL restart --no-block llmgw-node.service
    say "release $RELEASE_ID is current; the unit is starting: systemctl status llmgw-node, journalctl -u llmgw-node"
else
    pidfile="$DATA/llmgw-node.pid"
    if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
        # The old daemon leaves its engines running for the new one to adopt; wait for it to go,
        # or control would refuse the new one as a second connection for this node id.
        old=$(cat "$pidfile")
        kill "$old" || true
        waited=0
        while kill -0 "$old" 2>/dev/null && [ "$waited" -lt 30 ]; do sleep 1; waited=$((waited + 1)); done
    fi
    nohup "$CURRENT/bin/llmgw-node" run --config "$CONFIG" >>"$DATA/llmgw-node.log" 2>&1 </dev/null &
    echo $! > "$pidfile"
    say "release $RELEASE_ID is current; no systemd here, so the daemon was started directly (pid $!, log $DATA/llmgw-node.log)"
fi
