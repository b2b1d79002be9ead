"""``server.tls_cert_file`` / ``tls_key_file``: the pair is read and checked when the config
is loaded (gateway/ops/tls.py); each refusal is one line naming the key, never the key's bytes;
a good pair gives the leaf's fingerprint as Claude Code shows it and as openssl writes it.
What a reload does with the pair: gateway/ops/config_reload.py."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.ops import config, tls
from gateway.ops.config_reload import Changes, changes
from tests import certs
from tests.config_cases import GOOD


@dataclass(frozen=True)
class Files:
    folder: Path
    leaf: certs.Leaf
    other: certs.Leaf  # another pair of the same CA
    encrypted_key: Path
    garbled_cert: Path
    chain: Path  # the leaf then the CA, one file


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Files:
    folder = tmp_path_factory.mktemp("tls")
    certs.make_ca(folder)
    leaf = certs.make_leaf(folder)
    other = certs.make_leaf(folder, "other")
    encrypted = folder / "encrypted.key"
    certs.openssl(
        folder, "pkey", "-in", str(leaf.key), "-aes256", "-passout", "pass:xyzzy",
        "-out", str(encrypted),
    )  # fmt: skip
    garbled = folder / "garbled.pem"
    garbled.write_text("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    chain = folder / "chain.pem"
    chain.write_bytes(leaf.cert.read_bytes() + (folder / "ca.pem").read_bytes())
    return Files(folder, leaf, other, encrypted, garbled, chain)


def _text(cert: object = None, key: object = None) -> str:
    lines = []
    if cert is not None:
        lines.append(f'tls_cert_file = "{cert}"')
    if key is not None:
        lines.append(f'tls_key_file = "{key}"')
    return GOOD.replace('prefix = "/llm"', 'prefix = "/llm"\n' + "\n".join(lines))


def _load(text: str) -> config.Config:
    return config.parse(tomllib.loads(text), "t.toml", {})


# (case id, (cert, key) as names of Files' paths or literal paths, the key named, a fragment)
REFUSALS = [
    ("a certificate without a key", ("leaf.cert", None), "tls_key_file", "set tls_cert_file and"),
    ("a key without a certificate", (None, "leaf.key"), "tls_cert_file", "set tls_cert_file and"),
    ("no certificate file", ("/nonexistent/cert.pem", "leaf.key"), "tls_cert_file", "cannot read"),
    ("no key file", ("leaf.cert", "/nonexistent/key.pem"), "tls_key_file", "cannot read"),
    ("a folder as certificate", ("folder", "leaf.key"), "tls_cert_file", "cannot read"),
    ("a key as certificate", ("leaf.key", "leaf.key"), "tls_cert_file", "no PEM certificate"),
    ("a certificate as key", ("leaf.cert", "leaf.cert"), "tls_key_file", "no PEM private key"),
    ("another certificate's key", ("leaf.cert", "other.key"), "tls_key_file", "is not the key"),
    ("an encrypted key", ("leaf.cert", "encrypted_key"), "tls_key_file", "encrypted"),
    ("a garbled certificate", ("garbled_cert", "leaf.key"), "tls_cert_file", "certificate"),
]


def _path(files: Files, name: str | None) -> str | None:
    if name is None or name.startswith("/"):
        return name
    value: object = files
    for part in name.split("."):
        value = getattr(value, part)
    return str(value)


@pytest.mark.parametrize(
    "pair,key,fragment", [c[1:] for c in REFUSALS], ids=[c[0] for c in REFUSALS]
)
def test_a_bad_pair_is_one_line_naming_the_key(
    files: Files, pair: tuple[str | None, str | None], key: str, fragment: str
) -> None:
    cert, key_file = (_path(files, p) for p in pair)
    with pytest.raises(config.ConfigError) as info:
        _load(_text(cert, key_file))
    message = str(info.value)
    assert message.startswith(f"t.toml: server.{key}: "), message
    assert fragment in message
    assert "\n" not in message
    # no byte of a key reaches the message (the base64 lines of each key file)
    for secret in (files.leaf.key, files.other.key, files.encrypted_key):
        for line in secret.read_text().splitlines()[1:-1]:
            assert line not in message


@pytest.mark.parametrize("cert", ["leaf.cert", "chain"])
def test_a_good_pair_gives_the_leaf_fingerprint(files: Files, cert: str) -> None:
    cfg = _load(_text(_path(files, cert), files.leaf.key))
    assert cfg.server.tls
    openssl_form = certs.fingerprint(files.leaf.cert)  # the leaf's, also with a chain after it
    # Claude Code's form: lower-case hex, no colons
    assert cfg.server.tls_fingerprint == openssl_form.replace(":", "").lower()
    assert tls.colons(cfg.server.tls_fingerprint) == openssl_form
    served = tls.load(*cfg.server.tls_files)
    assert served.fingerprint_colons == openssl_form
    assert served.context.minimum_version is tls.ssl.TLSVersion.TLSv1_2


def test_without_the_keys_there_is_no_tls() -> None:
    cfg = _load(GOOD)
    assert (cfg.server.tls, cfg.server.tls_fingerprint) == (False, "")


def test_reload_reads_the_pair_and_toggling_tls_needs_a_restart(files: Files) -> None:
    plain = _load(GOOD)
    on = _load(_text(files.leaf.cert, files.leaf.key))
    moved = _load(_text(files.other.cert, files.other.key))
    assert changes(on, on, moved) == Changes()  # the new pair is read by the reload itself
    assert changes(plain, plain, on) == Changes(needs_restart=("server",))
    assert changes(on, on, plain) == Changes(needs_restart=("server",))
