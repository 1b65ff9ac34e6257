"""TLS contexts, connection-failure diagnosis and the HTTP bearer-token check.

Shared by the Kafka factories (bus/kafka.py), the Cassandra `connect()` (store/cassandra.py)
and the node's HTTP endpoint. Nothing here ever puts a secret into a message: errors name the
setting, the file and the endpoint.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import socket
import ssl
from collections.abc import Iterator, Mapping

from chronowheel.errors import ConfigError
from chronowheel.settings import Secret

PUBLIC_HTTP_PATHS = ("/metrics", "/healthz")


def ssl_context(*, what: str, cafile: str, certfile: str, keyfile: str,
                key_password: Secret | None, check_hostname: bool) -> ssl.SSLContext:
    """A client TLS context: verifies the server against `cafile` (or the system trust store),
    checks its host name unless told not to, and presents a client certificate when given.

    `what` names the settings' prefix (`kafka`, `cassandra`) in error messages.
    """
    try:
        ctx = ssl.create_default_context(cafile=cafile or None)
    except FileNotFoundError:
        raise ConfigError(f"{what}_ssl_cafile: no such file {cafile}") from None
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"{what}_ssl_cafile: {cafile} holds no usable PEM CA certificate "
                          f"({_reason(exc)})") from None
    ctx.check_hostname = check_hostname
    ctx.verify_mode = ssl.CERT_REQUIRED
    if keyfile and not certfile:
        raise ConfigError(f"{what}_ssl_keyfile is set without {what}_ssl_certfile")
    if certfile:
        try:
            ctx.load_cert_chain(certfile, keyfile or None,
                                password=key_password.reveal() if key_password else None)
        except FileNotFoundError as exc:
            raise ConfigError(f"{what}_ssl_certfile/{what}_ssl_keyfile: no such file "
                              f"{exc.filename or certfile}") from None
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(
                f"{what}: cannot load the client certificate {certfile}"
                + (f" with key {keyfile}" if keyfile else "")
                + f" ({_reason(exc)}; wrong key passphrase, or not a PEM certificate and "
                  "key)") from None
    return ctx


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason)
    return type(exc).__name__ if not str(exc) else str(exc)


def tls_failure(exc: BaseException) -> str | None:
    """What a TLS handshake failure means for the operator, or None if it is not one."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, ssl.SSLCertVerificationError):
            detail = cur.verify_message or _reason(cur)
            if "hostname" in detail.lower() or "ip address mismatch" in detail.lower():
                return (f"the server's certificate does not name this host ({detail}); fix the "
                        "address or the certificate")
            return (f"the server's certificate is not trusted ({detail}); set the CA file "
                    "that signed it")
        if isinstance(cur, ssl.SSLError):
            reason = _reason(cur)
            if "CERTIFICATE_REQUIRED" in reason.upper() or "BAD_CERTIFICATE" in reason.upper():
                return (f"the server requires a client certificate signed by a CA it trusts "
                        f"({reason}): set the client certificate and key files")
            if "WRONG_VERSION_NUMBER" in reason.upper() or "record layer" in reason.lower():
                return (f"TLS handshake failed ({reason}): the port does not speak TLS, or "
                        "speaks another protocol")
            return f"TLS handshake failed ({reason})"
        cur = cur.__cause__ or cur.__context__
    # Some drivers wrap the ssl error into another one and keep only its text.
    text = str(exc)
    if "CERTIFICATE_VERIFY_FAILED" in text:
        detail = text.split("certificate verify failed:", 1)[-1].split("(_ssl.c")[0].strip()
        if "hostname" in detail.lower() or "ip address mismatch" in detail.lower():
            return (f"the server's certificate does not name this host ({detail}); fix the "
                    "address or the certificate")
        return (f"the server's certificate is not trusted ({detail}); set the CA file that "
                "signed it")
    if "CERTIFICATE_REQUIRED" in text.upper() or "BAD_CERTIFICATE" in text.upper():
        return ("the server requires a client certificate signed by a CA it trusts: set the "
                "client certificate and key files")
    if "WRONG_VERSION_NUMBER" in text or "[SSL" in text:
        return f"TLS handshake failed ({text})"
    return None


def speaks_tls(host: str, port: int, timeout_s: float = 5.0) -> bool:
    """Does host:port answer a TLS handshake? (Certificate not checked: this only tells a TLS
    port from a plaintext one, to explain a failure.)"""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock, \
                ctx.wrap_socket(sock, server_hostname=host):
            return True
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def quiet_loggers(*names: str) -> Iterator[None]:
    """Silence the named loggers for a moment (a driver's per-attempt tracebacks while a
    connection is tried; the caller reports the outcome once, clearly)."""
    saved = [(logging.getLogger(n), logging.getLogger(n).level) for n in names]
    for logger, _ in saved:
        logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for logger, level in saved:
            logger.setLevel(level)


def bearer_allowed(path: str, headers: Mapping[str, str], token: Secret | None) -> bool:
    """May a request for `path` with these headers (names lower-cased) be served?

    /metrics and /healthz are public. Any other path needs `Authorization: Bearer <token>`
    matching the configured token (compared in constant time); with no token configured,
    nothing beyond the public paths is served.
    """
    route = path.split("?", 1)[0]
    if any(route == p or route.startswith(p + "/") for p in PUBLIC_HTTP_PATHS):
        return True
    if token is None:
        return False
    scheme, _, given = headers.get("authorization", "").strip().partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return False
    return hmac.compare_digest(given.strip().encode(), token.reveal().encode())
