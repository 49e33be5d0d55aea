"""rdna1_kmgr.source.tarball_fetch: kernel tarballs from an http(s) URL, kept only when their SHA-256 is the
expected one (given, or from a sha256sums file beside them, its signature checked with a keyring).

The tarballs are tiny kernels (test_kernel_source's) served from a local HTTP(S) server on 127.0.0.1.
"""

import hashlib
import http.server
import ssl
import subprocess
import threading
from functools import partial
from pathlib import Path

import pytest
from packaging.version import Version
from source_fixtures import (
    AMD,
    cache,  # noqa: F401  (the fixture its tests name)
    leftovers,
    make_tarball,
)

from rdna1_kmgr.core.errors import SourceError, UsageError
from rdna1_kmgr.source import kernel_source, tarball_fetch


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        self.server.asked.append(self.path)
        super().do_GET()


def _serve(folder: Path, context: ssl.SSLContext | None):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(_QuietHandler, directory=str(folder)))
    server.asked = []
    if context is not None:
        server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server


@pytest.fixture
def http_folder(tmp_path):
    """A folder served over plain HTTP on 127.0.0.1; yields (folder, base URL, the paths asked for)."""
    folder = tmp_path / "www"
    folder.mkdir()
    server = _serve(folder, None)
    yield folder, f"http://127.0.0.1:{server.server_address[1]}", server.asked
    server.shutdown()
    server.server_close()


@pytest.fixture
def https_folder(tmp_path, monkeypatch):
    """The same over HTTPS with a throwaway certificate for 127.0.0.1, which the client trusts through
    SSL_CERT_FILE (OpenSSL's own variable: the tool's default context reads it); yields (folder, base URL)."""
    folder = tmp_path / "www"
    folder.mkdir()
    key, cert = tmp_path / "tls.key", tmp_path / "tls.crt"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = _serve(folder, context)
    yield folder, f"https://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def publish_sums(folder: Path, tarball: Path, name: str = "sha256sums.asc") -> str:
    """A sha256sums file like kernel.org's (clear-signed armour around `hash  name` lines)."""
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    (folder / name).write_text(
        "-----BEGIN PGP SIGNED MESSAGE-----\nHash: SHA256\n\n"
        f"{'0' * 64}  linux-6.0.1.tar.xz\n{digest}  {tarball.name}\n"
        "-----BEGIN PGP SIGNATURE-----\nabc\n-----END PGP SIGNATURE-----\n"
    )
    return digest


def test_a_url_is_downloaded_verified_by_its_sha256sums_and_unpacked(tmp_path, cache, https_folder, capsys):
    folder, base = https_folder
    tarball = make_tarball(folder, "6.1.999")
    publish_sums(folder, tarball)
    tree = kernel_source.resolve_source_option(f"{base}/{tarball.name}")
    assert kernel_source.kernel_version(tree) == Version("6.1.999")
    assert (tree / AMD / "amdgpu/gmc_v10_0.c").is_file()
    assert (cache / "tarballs" / tarball.name).read_bytes() == tarball.read_bytes()
    err = capsys.readouterr().err
    assert f"downloading {tarball.name}: started" in err and f"downloading {tarball.name}: done" in err


def test_a_url_with_a_given_sha256_needs_no_sums_file(tmp_path, cache, http_folder):
    folder, base, _ = http_folder
    tarball = make_tarball(folder, "6.12.999")
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    path = tarball_fetch.fetch_tarball(f"{base}/{tarball.name}", digest.upper())
    assert path == cache / "tarballs" / tarball.name
    (folder / tarball.name).unlink()  # a second fetch finds it in the cache
    assert tarball_fetch.fetch_tarball(f"{base}/{tarball.name}", digest) == path


def test_a_sha256_mismatch_names_both_hashes_and_keeps_nothing(tmp_path, cache, http_folder):
    folder, base, _ = http_folder
    tarball = make_tarball(folder)
    actual = hashlib.sha256(tarball.read_bytes()).hexdigest()
    wrong = "ab" * 32
    with pytest.raises(SourceError) as err:
        kernel_source.resolve_source_option(f"{base}/{tarball.name}", sha256=wrong)
    assert actual in err.value.line() and wrong in err.value.line()
    assert leftovers(cache / "tarballs") == [] and leftovers(cache / "src") == []


def test_a_changed_tarball_does_not_match_the_published_sum(tmp_path, cache, https_folder):
    folder, base = https_folder
    tarball = make_tarball(folder)
    publish_sums(folder, tarball, "sha256sums")
    tarball.write_bytes(tarball.read_bytes() + b"\0" * 512)
    with pytest.raises(SourceError, match="has SHA-256 .*, expected"):
        tarball_fetch.fetch_tarball(f"{base}/{tarball.name}")
    assert leftovers(cache / "tarballs") == []


def test_a_url_without_any_known_sha256_is_refused(tmp_path, cache, https_folder):
    folder, base = https_folder
    tarball = make_tarball(folder)
    with pytest.raises(SourceError, match="no SHA-256 known"):
        tarball_fetch.fetch_tarball(f"{base}/{tarball.name}")
    assert leftovers(cache / "tarballs") == []


def test_a_missing_url_is_a_clear_error(cache, http_folder):
    _, base, _ = http_folder
    with pytest.raises(SourceError, match="HTTP 404"):
        tarball_fetch.fetch_tarball(f"{base}/linux-6.1.1.tar.xz", "0" * 64)


@pytest.mark.parametrize(
    "url", ["ftp://example.org/linux-6.1.tar.xz", "file:///tmp/linux-6.1.tar.xz", "https:///linux-6.1.tar.xz"]
)
def test_only_http_and_https_urls_are_accepted(cache, url):
    with pytest.raises(UsageError, match="unsupported source URL"):
        kernel_source.resolve_source_option(url)


@pytest.mark.parametrize("url", ["https://example.org/", "https://example.org/linux-6.1.zip"])
def test_a_url_must_name_a_tarball(cache, url):
    with pytest.raises(UsageError, match="not a tarball name"):
        tarball_fetch.fetch_tarball(url, "0" * 64)


def test_a_malformed_sha256_is_refused(cache):
    with pytest.raises(UsageError, match="invalid SHA-256"):
        tarball_fetch.fetch_tarball("https://example.org/linux-6.1.1.tar.xz", "1234")


def test_an_http_source_without_a_sha256_is_refused_and_nothing_is_downloaded(tmp_path, cache, http_folder):
    """Issue 40, M2: over http the sums file comes from the same unauthenticated server as the tarball."""
    folder, base, asked = http_folder
    tarball = make_tarball(folder)
    publish_sums(folder, tarball)
    with pytest.raises(UsageError) as err:
        kernel_source.resolve_source_option(f"{base}/{tarball.name}")
    assert "use an https:// URL or give the tarball's --sha256" in err.value.line()
    assert asked == [] and leftovers(cache / "tarballs") == []


def _gpg(home: Path, *args: str, stdin: bytes | None = None) -> bytes:
    return subprocess.run(
        ["gpg", "--homedir", str(home), "--batch", "--pinentry-mode", "loopback", "--passphrase", "", *args],
        input=stdin, capture_output=True, check=True,
    ).stdout  # fmt: skip


@pytest.fixture(scope="module")
def signers(tmp_path_factory):
    """Two throwaway signing keys: the one the keyring holds, and a stranger; (keyring file, clearsign)."""
    keys = {}
    for who in ("trusted", "stranger"):
        home = tmp_path_factory.mktemp(f"gpg-{who}")
        home.chmod(0o700)
        _gpg(home, "--quick-gen-key", f"{who} <{who}@example.org>", "ed25519", "sign", "never")
        keys[who] = home
    keyring = tmp_path_factory.mktemp("keyring") / "kernel-org.gpg"
    keyring.write_bytes(_gpg(keys["trusted"], "--export"))
    return keyring, lambda who, text: _gpg(keys[who], "--clearsign", stdin=text.encode())


def _signed_sums(folder: Path, tarball: Path, sign, who: str) -> None:
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    (folder / "sha256sums.asc").write_bytes(sign(who, f"{'0' * 64}  linux-6.0.1.tar.xz\n{digest}  {tarball.name}\n"))


def test_sums_signed_by_a_key_of_the_keyring_verify(tmp_path, cache, https_folder, signers):
    folder, base = https_folder
    keyring, sign = signers
    tarball = make_tarball(folder)
    _signed_sums(folder, tarball, sign, "trusted")
    path = tarball_fetch.fetch_tarball(f"{base}/{tarball.name}", keyring=keyring)
    assert path.read_bytes() == tarball.read_bytes()


def test_sums_signed_by_a_key_not_in_the_keyring_are_refused(tmp_path, cache, https_folder, signers):
    folder, base = https_folder
    keyring, sign = signers
    tarball = make_tarball(folder)
    _signed_sums(folder, tarball, sign, "stranger")
    with pytest.raises(SourceError) as err:
        tarball_fetch.fetch_tarball(f"{base}/{tarball.name}", keyring=keyring)
    assert "does not verify against" in err.value.line() and "\n" not in err.value.line()
    assert leftovers(cache / "tarballs") == []


def test_sums_whose_signed_text_was_changed_are_refused(tmp_path, cache, https_folder, signers):
    """The hash a server swapped into a signed file is not taken from the unsigned text around it."""
    folder, base = https_folder
    keyring, sign = signers
    tarball = make_tarball(folder)
    _signed_sums(folder, tarball, sign, "trusted")
    sums = folder / "sha256sums.asc"
    sums.write_text(sums.read_text().replace("0" * 64, "1" * 64))
    with pytest.raises(SourceError, match="does not verify"):
        tarball_fetch.fetch_tarball(f"{base}/{tarball.name}", keyring=keyring)


def test_without_a_keyring_the_unchecked_signature_is_said(tmp_path, cache, https_folder, capsys):
    folder, base = https_folder
    tarball = make_tarball(folder)
    publish_sums(folder, tarball)
    tarball_fetch.fetch_tarball(f"{base}/{tarball.name}")
    assert "sha256sums.asc was not checked (no --keyring)" in capsys.readouterr().err
