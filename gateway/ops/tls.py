"""The API listener's TLS: a certificate and key pair read from files, checked, made into a
server-side :class:`ssl.SSLContext`, and the fingerprint clients pin.

Facts relied on:

* ``SSLContext.load_cert_chain`` reads files only (no in-memory form) and takes the first
  certificate of the certificate file as the leaf, the rest as its chain; the key file may be
  the same file. An encrypted key would make OpenSSL ask for a passphrase on the terminal:
  the ``password`` callback here answers for it, so it is refused instead.
* Claude Code's gateway sign-in pins the SHA-256 of the leaf's DER bytes and shows it as 64
  lower-case hex digits without colons (Node's ``fingerprint256``, lower-cased, colons
  dropped); ``openssl x509 -noout -fingerprint -sha256`` writes the same digest upper-case
  with colons. Both are logged at start so an operator can compare either.
* OpenSSL tells a key that is not the certificate's by the reason ``KEY_VALUES_MISMATCH``.

No message here holds a key's bytes or a passphrase: the refusals name the key (a config
key), the file's path and what is wrong with it.
"""

from __future__ import annotations

import hashlib
import re
import ssl
from dataclasses import dataclass

MAX_PEM_BYTES = 1024 * 1024  # a certificate chain or a key is a few KiB
_CERT_BLOCK = re.compile(
    rb"-----BEGIN CERTIFICATE-----\r?\n[A-Za-z0-9+/=\r\n]+?-----END CERTIFICATE-----"
)
_KEY_BEGIN = re.compile(rb"-----BEGIN (?:RSA |EC |ENCRYPTED )?PRIVATE KEY-----")
ALPN = ("http/1.1",)


class TLSError(Exception):
    """A pair that cannot be served: ``key`` is the config key at fault (``tls_cert_file``
    or ``tls_key_file``), the message says why in one line."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True, slots=True)
class Served:
    """A loaded pair: the context to serve with and its leaf's fingerprint."""

    context: ssl.SSLContext
    fingerprint: str  # SHA-256 of the leaf, 64 lower-case hex digits (as Claude Code shows it)

    @property
    def fingerprint_colons(self) -> str:
        """The same digest as ``openssl x509 -fingerprint -sha256`` writes it."""
        return colons(self.fingerprint)


def colons(fingerprint: str) -> str:
    up = fingerprint.upper()
    return ":".join(up[i : i + 2] for i in range(0, len(up), 2))


def load(cert_file: str, key_file: str) -> Served:
    """Read and check the pair; -> a new server context serving it. Raises :class:`TLSError`."""
    leaf = _leaf(_read("tls_cert_file", cert_file), cert_file)
    key = _read("tls_key_file", key_file)
    if _KEY_BEGIN.search(key) is None:
        raise TLSError("tls_key_file", f"{key_file}: holds no PEM private key")
    if b"ENCRYPTED" in key:
        raise TLSError(
            "tls_key_file", f"{key_file}: the key is encrypted; the gateway needs it unencrypted"
        )
    context = new_context()
    asked = []

    def no_passphrase() -> bytes:
        asked.append(True)
        return b""

    try:
        context.load_cert_chain(cert_file, key_file, password=no_passphrase)
    except ssl.SSLError as exc:
        raise _refusal(exc, cert_file, key_file, encrypted=bool(asked)) from None
    except OSError as exc:  # the files changed since they were read
        raise TLSError("tls_cert_file", f"{cert_file}: cannot read: {exc.strerror}") from None
    return Served(context, hashlib.sha256(leaf).hexdigest())


def new_context() -> ssl.SSLContext:
    """A server context: TLS 1.2 and later, the ssl module's server defaults (ciphers,
    no compression, no renegotiation), HTTP/1.1 offered by ALPN."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_RENEGOTIATION
    context.set_alpn_protocols(list(ALPN))
    return context


def _read(key: str, path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_PEM_BYTES + 1)
    except OSError as exc:
        raise TLSError(key, f"{path}: cannot read: {exc.strerror or type(exc).__name__}") from None
    if len(data) > MAX_PEM_BYTES:
        raise TLSError(key, f"{path}: larger than {MAX_PEM_BYTES} bytes")
    return data


def _leaf(pem: bytes, path: str) -> bytes:
    """The DER bytes of the file's first certificate (the leaf ``load_cert_chain`` serves)."""
    block = _CERT_BLOCK.search(pem)
    if block is None:
        raise TLSError("tls_cert_file", f"{path}: holds no PEM certificate")
    try:
        der = ssl.PEM_cert_to_DER_cert(block[0].decode("ascii"))
        # parsed by OpenSSL here, so that a broken one is told apart from a wrong key
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=der)
    except (ValueError, ssl.SSLError):
        raise TLSError("tls_cert_file", f"{path}: holds no readable PEM certificate") from None
    return der


def _refusal(exc: ssl.SSLError, cert_file: str, key_file: str, *, encrypted: bool) -> TLSError:
    reason = exc.reason or "unknown"
    if reason == "KEY_VALUES_MISMATCH":
        return TLSError(
            "tls_key_file", f"{key_file}: is not the key of the certificate in tls_cert_file"
        )
    if encrypted:
        return TLSError(
            "tls_key_file", f"{key_file}: the key is encrypted; the gateway needs it unencrypted"
        )
    # which file OpenSSL refused is not always told apart: its reason names the step
    return TLSError("tls_cert_file", f"{cert_file}, {key_file}: not a usable pair ({reason})")
