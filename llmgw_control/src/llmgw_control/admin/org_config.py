"""The ``[audit]`` and ``[oidc]`` sections: the audit log's retention, and single sign-on for the dashboard."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

import attrs

from llmgw_shared.config import ConfigError
from llmgw_shared.config_doc import doc

# A year: what audit requirements commonly ask an operator to keep (ISO 27001 and SOC 2 auditors
# look back over the audit period, usually twelve months). 0 keeps everything.
DEFAULT_RETENTION_DAYS = 365
# Refusals (a bad key, a missing CSRF token, a write to a standby) are recorded up to this many a
# minute per daemon: enough to see an attack, too few for one to fill the store.
DEFAULT_REFUSALS_PER_MINUTE = 60


@attrs.frozen
class AuditConfig:
    retention_days: int = attrs.field(
        default=DEFAULT_RETENTION_DAYS,
        metadata=doc("Days the audit log keeps a row; older rows are deleted hourly. 0: keep every row."),
    )
    refusals_per_minute: int = attrs.field(
        default=DEFAULT_REFUSALS_PER_MINUTE,
        metadata=doc(
            "Refused admin requests (bad key, CSRF, standby) recorded per minute at most; the rest are counted."
        ),
    )


@attrs.frozen
class OidcConfig:
    issuer: str = attrs.field(
        default="",
        metadata=doc("The OpenID Connect issuer URL (https); empty: no single sign-on, the admin-key login only."),
    )
    client_id: str = attrs.field(default="", metadata=doc("This dashboard's client id at the issuer."))
    client_secret_file: str = attrs.field(
        default="",
        metadata=doc("A file holding the client secret (confidential client); empty: a public client (PKCE alone)."),
    )
    redirect_url: str = attrs.field(
        default="", metadata=doc("The callback URL registered at the issuer: https://<client address>/admin/login.")
    )
    scopes: list[str] = attrs.field(
        factory=lambda: ["openid", "email", "profile"],
        metadata=doc("Scopes asked for (openid always; add groups or roles if the issuer wants them asked)."),
    )
    claim: str = attrs.field(
        default="groups",
        metadata=doc("The ID token claim (a string or a list of strings) that grants access: groups or roles."),
    )
    admin_values: list[str] = attrs.field(
        factory=list, metadata=doc("Values of the claim that grant admin access (every action of the dashboard).")
    )
    read_only_values: list[str] = attrs.field(
        factory=list,
        metadata=doc("Values of the claim that grant read-only access (pages and reads; every write refused)."),
    )
    user_claim: str = attrs.field(
        default="email", metadata=doc("The claim that names the user in the audit log (falls back to sub).")
    )

    @property
    def enabled(self) -> bool:
        return bool(self.issuer)


def validate_audit(config: AuditConfig) -> AuditConfig:
    if not 0 <= config.retention_days <= 36_500:
        raise ConfigError(f"audit.retention_days must be 0 (keep all) to 36500, got {config.retention_days}")
    if not 1 <= config.refusals_per_minute <= 100_000:
        raise ConfigError(f"audit.refusals_per_minute must be 1 to 100000, got {config.refusals_per_minute}")
    return config


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def secure_url(url: str, what: str) -> str:
    """An https URL (http only to a loopback address: a test's provider), without query or fragment."""
    parts = urlsplit(url)
    if not parts.hostname or parts.scheme not in ("https", "http") or parts.fragment or parts.query:
        raise ConfigError(f"{what}: {url!r} is not an https URL without query or fragment")
    if parts.scheme == "http" and not _loopback(parts.hostname):
        raise ConfigError(f"{what}: {url!r} must be https (http is accepted only on a loopback address)")
    return url


def validate_oidc(config: OidcConfig) -> OidcConfig:
    if not config.enabled:
        return config
    secure_url(config.issuer, "oidc.issuer")
    secure_url(config.redirect_url, "oidc.redirect_url")
    if not urlsplit(config.redirect_url).path.endswith("/admin/login"):
        raise ConfigError("oidc.redirect_url must end in /admin/login (the dashboard login page receives the answer)")
    if not config.client_id:
        raise ConfigError("oidc.client_id is required with oidc.issuer")
    if not config.claim:
        raise ConfigError("oidc.claim must name a claim of the ID token (groups, roles...)")
    if not config.admin_values and not config.read_only_values:
        raise ConfigError("oidc: set admin_values and/or read_only_values, or no one can log in through it")
    if "openid" not in config.scopes:
        config = attrs.evolve(config, scopes=["openid", *config.scopes])
    return config
