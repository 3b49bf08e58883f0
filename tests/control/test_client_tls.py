"""TLS on the client listener, reloaded on SIGHUP; trusted proxies; the dashboard cookie made Secure.

Each test runs the real daemon (``llmgw-control run``) with certificates from a test CA (trustme)
and talks to it over real sockets, the OpenAI API through the official ``openai`` client.
"""

from __future__ import annotations

import signal
import socket
import ssl
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import httpx2
import openai
import pytest
import trustme
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.control_daemon import ControlDaemon, control_daemon
from support.waiting import wait_until_sync

# Starts llmgw daemons as processes (the quick tier, -m "not system", leaves these out).
pytestmark = pytest.mark.system


ENDPOINT = '[[endpoints]]\nid = "e"\nurl = "http://127.0.0.1:9"\nmodels = ["fake"]\n'


@attrs.frozen
class ServerCert:
    ca: trustme.CA
    cert: Path
    key: Path

    def client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context()
        self.ca.configure_trust(context)
        return context


def _issue(ca: trustme.CA, directory: Path, name: str = "server") -> ServerCert:
    issued = ca.issue_cert("127.0.0.1", "localhost")
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    issued.private_key_and_cert_chain_pem.write_to_path(str(cert))
    issued.private_key_pem.write_to_path(str(key))
    return ServerCert(ca, cert, key)


def _tls_config(cert: ServerCert, extra: str = "") -> str:
    return (
        f'[client_tls]\ncert_file = "{cert.cert}"\nkey_file = "{cert.key}"\n\n'
        f"[listeners]\nhead_timeout = 1.0\n\n{extra}{ENDPOINT}"
    )


@pytest.fixture
def server_cert(tmp_path: Path) -> ServerCert:
    return _issue(trustme.CA(), tmp_path)


@pytest.fixture
def tls_daemon(tmp_path: Path, server_cert: ServerCert) -> Iterator[ControlDaemon]:
    with control_daemon(
        tmp_path, _tls_config(server_cert), client_ssl=server_cert.client_context(), tls_listeners=frozenset({"api"})
    ) as daemon:
        yield daemon


def test_the_client_listener_speaks_tls_to_the_openai_client(
    tls_daemon: ControlDaemon, server_cert: ServerCert
) -> None:
    assert tls_daemon.url("api").startswith("https://")
    with httpx2.Client(verify=server_cert.client_context()) as http:
        client = openai.OpenAI(base_url=tls_daemon.url("api") + "/v1", api_key="unused", http_client=http)
        assert [m.id for m in client.models.list()] == ["fake"]
    # Plain HTTP to it is not served as HTTP.
    with socket.create_connection(("127.0.0.1", tls_daemon.ports["api"]), timeout=5) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        assert not sock.recv(65536).startswith(b"HTTP/1.1 200")
    # ALPN offers HTTP/1.1 only.
    context = server_cert.client_context()
    context.set_alpn_protocols(["h2", "http/1.1"])
    raw = socket.create_connection(("127.0.0.1", tls_daemon.ports["api"]), timeout=5)
    with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        assert tls.selected_alpn_protocol() == "http/1.1"


def test_a_handshake_that_never_comes_is_cut_after_the_head_timeout(tls_daemon: ControlDaemon) -> None:
    with socket.create_connection(("127.0.0.1", tls_daemon.ports["api"]), timeout=10) as sock:
        started = time.monotonic()
        assert sock.recv(1) == b""  # closed by the server (head_timeout is 1 s here), not left open
        assert time.monotonic() - started < 8
    assert tls_daemon.alive()


def _served_by(daemon: ControlDaemon, context: ssl.SSLContext) -> bool:
    try:
        with httpx2.Client(verify=context, timeout=5) as client:
            return client.get(daemon.url("api") + "/healthz").status_code == 200
    except httpx2.ConnectError:
        return False


def test_sighup_reloads_the_certificate_and_a_bad_reload_keeps_the_old_one(
    tls_daemon: ControlDaemon, server_cert: ServerCert, tmp_path: Path
) -> None:
    old = server_cert.client_context()
    assert _served_by(tls_daemon, old)
    renewed = _issue(trustme.CA(), tmp_path / "..", "renewed")  # another CA: only the new trust verifies it
    server_cert.cert.write_bytes(renewed.cert.read_bytes())
    server_cert.key.write_bytes(renewed.key.read_bytes())
    tls_daemon.process.send_signal(signal.SIGHUP)
    _within_10_s(lambda: _served_by(tls_daemon, renewed.client_context()), tls_daemon)
    assert not _served_by(tls_daemon, old)
    # A reload that cannot read its files keeps what is in use, and says so.
    server_cert.key.write_text("not a key")
    tls_daemon.process.send_signal(signal.SIGHUP)
    _within_10_s(lambda: "was not reloaded" in tls_daemon.log(), tls_daemon)
    assert tls_daemon.alive() and _served_by(tls_daemon, renewed.client_context())


def test_sighup_without_a_certificate_does_not_stop_the_daemon(tmp_path: Path) -> None:
    # SIGHUP's default action ends a process; the unit's ExecReload sends it.
    with control_daemon(tmp_path, ENDPOINT) as daemon:
        daemon.process.send_signal(signal.SIGHUP)

        def said() -> bool:
            if "nothing to reload" in daemon.log():
                return True
            assert daemon.alive(), daemon.log()[-3000:]
            return False

        _within_10_s(said, daemon)
        assert httpx2.get(daemon.url("api") + "/healthz").status_code == 200


def _within_10_s(predicate: Callable[[], bool], daemon: ControlDaemon) -> None:
    try:
        wait_until_sync(predicate, timeout=10, interval=0.1)
    except TimeoutError:
        raise AssertionError(daemon.log()[-3000:]) from None


def _admin_key(daemon: ControlDaemon) -> str:
    admin = daemon.url("admin")
    group = httpx2.post(f"{admin}/api/v1/groups", json={"name": "ops"}).json()["group"]
    made = httpx2.post(f"{admin}/api/v1/keys", json={"name": "root", "group_id": group["id"], "admin": True})
    secret: str = made.json()["secret"]
    return secret


def _login_cookie(daemon: ControlDaemon, key: str, headers: dict[str, str] | None = None) -> str:
    verify: ssl.SSLContext | bool = daemon.client_ssl if daemon.client_ssl is not None else True
    with httpx2.Client(base_url=daemon.url("api"), verify=verify, follow_redirects=False, timeout=10) as client:

        def logged_in() -> httpx2.Response | None:
            answer = client.post("/admin/login", data={"key": key}, headers=headers or {})
            return answer if answer.status_code == 302 else None

        try:  # the key reaches the client listener's key table within a moment
            response = wait_until_sync(logged_in, timeout=10, interval=0.1)
        except TimeoutError:
            response = client.post("/admin/login", data={"key": key}, headers=headers or {})
    assert response.status_code == 302, response.text[:300]
    return response.headers["set-cookie"]


def test_the_dashboard_cookie_is_secure_over_native_tls(tls_daemon: ControlDaemon) -> None:
    cookie = _login_cookie(tls_daemon, _admin_key(tls_daemon))
    assert "; Secure" in cookie and "HttpOnly" in cookie


@pytest.mark.parametrize(("trusted", "secure"), [("127.0.0.1", True), ("10.9.9.0/24", False)])
def test_x_forwarded_proto_counts_only_from_a_trusted_proxy(tmp_path: Path, trusted: str, secure: bool) -> None:
    config = f'[client_tls]\ntrusted_proxies = ["{trusted}"]\n\n{ENDPOINT}'
    with control_daemon(tmp_path, config) as daemon:
        key = _admin_key(daemon)
        forwarded = _login_cookie(daemon, key, {"x-forwarded-proto": "https"})
        assert ("; Secure" in forwarded) is secure, forwarded
        assert "; Secure" not in _login_cookie(daemon, key)  # no header: the connection's own scheme


def test_without_trusted_proxies_x_forwarded_proto_is_ignored(tmp_path: Path) -> None:
    with control_daemon(tmp_path, ENDPOINT) as daemon:
        assert "; Secure" not in _login_cookie(daemon, _admin_key(daemon), {"x-forwarded-proto": "https"})


@pytest.fixture(scope="module")
def tls_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlDaemon]:
    tmp = tmp_path_factory.mktemp("tls-fuzz")
    cert = _issue(trustme.CA(), tmp)
    agents = f'tls_cert_file = "{cert.cert}"\ntls_key_file = "{cert.key}"\n'
    with control_daemon(
        tmp,
        _tls_config(cert),
        listeners=("agents",),
        agents_config=agents,
        client_ssl=cert.client_context(),
        tls_listeners=frozenset({"api", "agents"}),
    ) as daemon:
        yield daemon


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(
    listener=st.sampled_from(["api", "agents"]),
    over_tls=st.booleans(),
    data=st.one_of(
        st.binary(max_size=2048),
        st.sampled_from(
            [
                b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40,
                b"GET / HTTP/1.1\r\nhost: x\r\n\r\n",
                b"GET / HTTP/1.1\r\nhost: x\r\nupgrade: h2c\r\nhttp2-settings: A\r\n"
                b"connection: Upgrade, HTTP2-Settings\r\n\r\n",
                b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00",
            ]
        ),
    ),
)
def test_no_bytes_stop_a_tls_listener(tls_fleet: ControlDaemon, listener: str, over_tls: bool, data: bytes) -> None:
    try:
        sock = (
            tls_fleet.connect(listener)
            if over_tls
            else socket.create_connection(("127.0.0.1", tls_fleet.ports[listener]), timeout=5)
        )
        with sock:
            sock.sendall(data)
            sock.settimeout(0.05)
            sock.recv(65536)
    except (OSError, ssl.SSLError):
        pass
    assert tls_fleet.alive(), tls_fleet.log()[-3000:]
    with httpx2.Client(verify=tls_fleet.client_ssl or True, timeout=10) as client:
        assert client.get(tls_fleet.url(listener) + "/healthz").status_code == 200


def test_the_tls_daemon_logged_no_failed_connection(tls_fleet: ControlDaemon) -> None:
    log = tls_fleet.log()
    assert tls_fleet.alive() and "failed and was closed" not in log and '"level": "error"' not in log, log[-4000:]


def test_tls_listeners_refuse_connections_beyond_the_limit_with_503(tmp_path: Path) -> None:
    cert = _issue(trustme.CA(), tmp_path)
    agents = f'tls_cert_file = "{cert.cert}"\ntls_key_file = "{cert.key}"\n'
    config = _tls_config(cert).replace("[listeners]\n", "[listeners]\nmax_connections = 2\n")
    with control_daemon(
        tmp_path,
        config,
        listeners=("agents",),
        agents_config=agents,
        client_ssl=cert.client_context(),
        tls_listeners=frozenset({"api", "agents"}),
    ) as daemon:
        for listener in ("api", "agents"):
            held = [daemon.connect(listener) for _ in range(2)]
            for sock in held:  # both are being served: each has had its answer
                sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
                assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
            with daemon.connect(listener) as extra:
                extra.sendall(b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
                received = b""
                try:
                    while chunk := extra.recv(65536):
                        received += chunk
                except (OSError, ssl.SSLError):
                    pass  # (the close after the answer may come as a TLS error)
            assert received.startswith(b"HTTP/1.1 503 ") and b"too_many_connections" in received, (listener, received)
            for sock in held:
                sock.close()
        assert daemon.alive()
