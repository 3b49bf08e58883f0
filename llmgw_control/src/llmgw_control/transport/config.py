"""The transport's settings: what every listener allows one connection, and TLS on the client listener.

``config.py`` composes them into the daemon's config (``[listeners]``, ``[client_tls]``);
docs/security.md gives the reasons behind each default.
"""

from __future__ import annotations

import attrs

from llmgw_shared.config_doc import doc


@attrs.frozen
class ListenersConfig:
    """Limits every HTTP listener (client API, admin, metrics, agents) applies to each connection."""

    # Beyond this many open connections a listener answers 503 and closes, rather than letting
    # connections pile up until the process runs out of file descriptors (each client connection
    # is one, plus one toward an engine while its request is in flight; the systemd unit allows
    # 65536). gunicorn's worker_connections default is 1000, nginx's 512 per worker process.
    max_connections: int = attrs.field(
        default=1024, metadata=doc("Open connections per listener; more are answered 503 and closed.")
    )
    # A request's head (request line and headers) must arrive whole within this long of its
    # first byte, else 408: a client that sends a header line every few seconds holds nothing
    # for long. A TLS handshake gets as long from the accept. (Before its first byte a request
    # is awaited for the keep-alive timeout, 75 s.) Apache's mod_reqtimeout default is
    # header=20-40; nginx's client_header_timeout is 60 s.
    head_timeout: float = attrs.field(
        default=20.0,
        metadata=doc(
            "Seconds a request's head may take from its first byte (a TLS handshake from the accept), else 408."
        ),
    )
    # A body must arrive within body_timeout plus one second per body_min_rate bytes received,
    # else 408: a body that stalls is cut after body_timeout, and one that trickles a byte every
    # few seconds soon after. Apache's mod_reqtimeout default is body=20,MinRate=500. (nginx's
    # client_body_timeout, 60 s between two reads, never cuts a trickle.)
    body_timeout: float = attrs.field(
        default=20.0,
        metadata=doc("Seconds a request body may take beyond one second per body_min_rate bytes, else 408."),
    )
    body_min_rate: int = attrs.field(
        default=500, metadata=doc("Bytes per second a request body must average once body_timeout is spent.")
    )
    # One socket write may wait this long for a client that stopped reading; then the connection
    # is closed. nginx's send_timeout is 60 s. A server shutdown cuts writes at the grace period.
    write_timeout: float = attrs.field(
        default=60.0,
        metadata=doc("Seconds one write may wait for a client that stopped reading, before the connection is closed."),
    )


@attrs.frozen
class ClientTlsConfig:
    """TLS on the client listener (``listen``), or the proxies that terminate it in front of it."""

    # PEM files; both or neither. Reloaded on SIGHUP, so a renewed certificate needs no restart.
    cert_file: str = attrs.field(
        default="",
        metadata=doc(
            "TLS certificate chain (PEM) for the client listener: clients use https:// (empty: plain HTTP). "
            "Reloaded on SIGHUP."
        ),
    )
    key_file: str = attrs.field(default="", metadata=doc("The private key (PEM) of cert_file."))
    # Only these peers' X-Forwarded-Proto is believed (anyone can send the header): a TLS proxy in
    # front of the client listener says "https" there, and the dashboard's cookie is then Secure.
    trusted_proxies: list[str] = attrs.field(
        factory=list,
        metadata=doc(
            "Addresses or networks of TLS proxies in front of the client listener whose X-Forwarded-Proto "
            'is believed, e.g. ["10.0.0.5", "10.1.0.0/16"].'
        ),
    )
