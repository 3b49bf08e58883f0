#!/bin/sh
# Installs llmgw-node from the control daemon that served this script, writes its config and
# starts it. Run as root by the command `llmgw-control ctl nodes add NAME` printed; that command
# checked this script's sha256, and this script checks the sha256 of every wheel it installs.
#
# Input (environment): LLMGW_NODE_ID, LLMGW_JOIN_TOKEN (required for a new node); LLMGW_UPGRADE=1
# to upgrade an installed node in place (its config is kept; its id and token fetch the wheels);
# LLMGW_PYTHON (default python3, 3.11 or newer); LLMGW_INSTALL_ROOT (default /: install under another root,
# for tests; the daemon is then started directly instead of through systemd). pip's own
# variables apply to the dependencies, e.g. PIP_NO_INDEX=1 when control's wheels directory
# holds them all.
set -eu

# @SETTINGS@

ROOT="${LLMGW_INSTALL_ROOT:-}"
ROOT="${ROOT%/}"
UPGRADE="${LLMGW_UPGRADE:-}"
PYTHON="${LLMGW_PYTHON:-python3}"
PREFIX="$ROOT/opt/llmgw-node"
ETC="$ROOT/etc/llmgw"
DATA="$ROOT/var/lib/llmgw-node"
CONFIG="$ETC/node.toml"

say() { printf 'llmgw-node install: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

if [ -n "$UPGRADE" ]; then
    [ -f "$CONFIG" ] || die "LLMGW_UPGRADE=1: no $CONFIG here; install with the command llmgw-control ctl nodes add printed"
    [ -x "$PREFIX/bin/python" ] || die "LLMGW_UPGRADE=1: no $PREFIX here to upgrade"
    # The node's own id and token, from its config: control serves the wheels to enrolled nodes only.
    creds=$("$PREFIX/bin/python" -c 'import socket, sys, tomllib
c = tomllib.load(open(sys.argv[1], "rb"))
print(c.get("node_id") or socket.gethostname())
print(c.get("token", ""))' "$CONFIG") || die "cannot read the node id and token from $CONFIG"
    NODE_ID=$(printf '%s\n' "$creds" | sed -n 1p)
    TOKEN=$(printf '%s\n' "$creds" | sed -n 2p)
else
    NODE_ID="${LLMGW_NODE_ID:-}"
    [ -n "$NODE_ID" ] || die "set LLMGW_NODE_ID"
    TOKEN="${LLMGW_JOIN_TOKEN:-}"
    [ -n "$TOKEN" ] || die "set LLMGW_JOIN_TOKEN"
fi
if [ -z "$ROOT" ] && [ "$(id -u)" != 0 ]; then
    die "run as root (it installs to /opt/llmgw-node, /etc/llmgw and a systemd unit)"
fi

fetch() {
    if command -v curl >/dev/null 2>&1; then
        curl -fsSL --netrc-file "$work/.netrc" "$1" -o "$2"
    elif command -v wget >/dev/null 2>&1; then
        HOME="$work" wget -q -O "$2" "$1"
    else
        die "needs curl or wget"
    fi
}

command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found: install Python 3.11 or newer, or set LLMGW_PYTHON"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || die "$PYTHON is $("$PYTHON" -V 2>&1); llmgw-node needs Python 3.11 or newer (set LLMGW_PYTHON)"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Control serves the wheels only to enrolled nodes: the node id and token go as HTTP Basic
# credentials from a netrc file (curl, wget and pip all read one), never on a command line,
# which ps shows everyone. The file is private and removed with $work.
host=${CONTROL_HTTP#*://}
host=${host%%/*}
case "$host" in
    \[*) host=${host%%]*}; host=${host#[} ;;
    *) host=${host%:*} ;;
esac
(umask 077 && printf 'machine %s login %s password %s\n' "$host" "$NODE_ID" "$TOKEN" > "$work/.netrc")

say "downloading $NODE_WHEEL and $SHARED_WHEEL from $CONTROL_HTTP"
fetch "$CONTROL_HTTP/install/wheels/$SHARED_WHEEL" "$work/$SHARED_WHEEL"
fetch "$CONTROL_HTTP/install/wheels/$NODE_WHEEL" "$work/$NODE_WHEEL"
printf '%s  %s\n%s  %s\n' "$SHARED_SHA256" "$work/$SHARED_WHEEL" "$NODE_SHA256" "$work/$NODE_WHEEL" \
    | sha256sum -c --quiet - || die "a wheel does not match the sha256 control announced: not installing"

if [ ! -x "$PREFIX/bin/python" ]; then
    say "creating the virtual environment $PREFIX"
    "$PYTHON" -m venv "$PREFIX" \
        || die "cannot create a virtual environment (on Debian/Ubuntu: apt-get install python3-venv)"
fi
say "installing (dependencies from $CONTROL_HTTP/install/wheels/ and the package index)"
NETRC="$work/.netrc" "$PREFIX/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade \
    --find-links "$CONTROL_HTTP/install/wheels/" "$work/$SHARED_WHEEL" "$work/$NODE_WHEEL"

mkdir -p "$ETC" "$DATA"
if [ -z "$UPGRADE" ]; then
    if [ -e "$CONFIG" ]; then
        cp -p "$CONFIG" "$CONFIG.bak"
        say "kept the previous config as $CONFIG.bak"
    fi
    # The token goes through the environment, never the command line (which ps shows everyone).
    "$PREFIX/bin/llmgw-node" init --force --output "$CONFIG" --control "$CONTROL_WS" \
        --node-id "$NODE_ID" --data-dir "$DATA"
fi
# The new version must accept the config before the running daemon is replaced.
"$PREFIX/bin/llmgw-node" init --check "$CONFIG" >/dev/null

if [ -z "$ROOT" ] && [ -d /run/systemd/system ]; then
    if ! id llmgw >/dev/null 2>&1; then
        useradd --system --home-dir /var/lib/llmgw-node --no-create-home --shell /usr/sbin/nologin llmgw
    fi
    # GPUs are opened through these groups; a group this machine lacks is skipped.
    for group in video render; do
        if getent group "$group" >/dev/null 2>&1; then usermod -aG "$group" llmgw; fi
    done
    chown -R llmgw:llmgw "$DATA"
    chown root:llmgw "$CONFIG"
    chmod 0640 "$CONFIG"
    cat > /etc/systemd/system/llmgw-node.service <<'LLMGW_UNIT_EOF'
@UNIT@
LLMGW_UNIT_EOF
    systemctl daemon-reload
    systemctl enable llmgw-node.service >/dev/null
    # --no-block: the unit is "started" once control welcomes the node, which may take a while.
    systemctl restart --no-block llmgw-node.service
    say "installed; the unit is starting: systemctl status llmgw-node, journalctl -u llmgw-node"
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
    nohup "$PREFIX/bin/llmgw-node" run --config "$CONFIG" >>"$DATA/llmgw-node.log" 2>&1 </dev/null &
    echo $! > "$pidfile"
    say "installed; no systemd here, so the daemon was started directly (pid $!, log $DATA/llmgw-node.log)"
fi
