"""Kernel tarballs from an http(s) URL: downloaded into the cache, kept only when their SHA-256 is the expected
one (given, or published beside the tarball in a sha256sums file, its signature checked against a keyring).
"""

import hashlib
import re
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from rdna1_kmgr import __version__
from rdna1_kmgr.core import cache_entry
from rdna1_kmgr.core.errors import SourceError, UsageError
from rdna1_kmgr.core.files import sha256_file
from rdna1_kmgr.core.paths import cache_dir
from rdna1_kmgr.core.progress import ByteProgress, say
from rdna1_kmgr.source import verification

_CHUNK = 1 << 20
_TARBALL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+~-]*\.(tar\.xz|tar\.gz|tar\.bz2|tgz|tar)$")
_SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")
_SUMS_LINE = re.compile(r"^([0-9a-fA-F]{64})\s+\*?(\S+)\s*$", re.M)
_SUMS_FILES = ("sha256sums.asc", "sha256sums", "SHA256SUMS")  # kernel.org publishes the first


def fetch_tarball(url: str, sha256: str | None = None, keyring: Path | None = None) -> Path:
    """A kernel tarball downloaded into cache_dir()/tarballs, kept only when its SHA-256 is the expected one:
    `sha256` when given, else the one a sha256sums file beside the URL publishes (over https only, its
    sha256sums.asc's signature checked with gpgv against `keyring` when one is given).

    An http URL needs `sha256`: the sums file would come from the same unauthenticated server as the tarball,
    and the tree is compiled and signed with the machine's module key. Refused before anything is downloaded.
    """
    parts = check_url(url)
    name = _tarball_name(parts)
    if parts.scheme == "http" and not sha256:
        raise UsageError(
            f"refusing {url}: over http the tarball and its sha256sums could be anyone's",
            "use an https:// URL or give the tarball's --sha256",
        )
    expected = check_sha256(sha256) if sha256 else _published_sha256(url, name, keyring)
    tarballs = cache_dir() / "tarballs"
    final = tarballs / name
    tarballs.mkdir(parents=True, exist_ok=True)
    with cache_entry.exclusive(tarballs, name):
        if final.is_file() and sha256_file(final) == expected:
            return final
        with cache_entry.staging(tarballs, name) as tmp:
            actual = _download(url, tmp / name)
            if actual != expected:
                raise SourceError(
                    f"{name} from {url} has SHA-256 {actual}, expected {expected}",
                    "nothing was kept; check the URL and the hash",
                )
            return cache_entry.publish(tmp / name, final)


def check_url(url: str) -> urllib.parse.SplitResult:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise UsageError(f"unsupported source URL {url!r}", "give an https:// (or http://) URL of a kernel tarball")
    return parts


def _tarball_name(parts: urllib.parse.SplitResult) -> str:
    name = parts.path.rsplit("/", 1)[-1]
    if not _TARBALL_NAME.fullmatch(name):
        raise UsageError(
            f"{name or parts.path!r} in the URL is not a tarball name",
            "give the URL of a .tar.xz, .tar.gz, .tar.bz2 or .tar file",
        )
    return name


def check_sha256(value: str) -> str:
    if not _SHA256.fullmatch(value):
        raise UsageError(f"invalid SHA-256 {value!r}", "give 64 hex digits")
    return value.lower()


def _published_sha256(url: str, name: str, keyring: Path | None = None) -> str:
    """The tarball's hash from a sha256sums file in the same folder (kernel.org: sha256sums.asc, clearsigned).
    With `keyring`, only a sha256sums.asc whose signature gpgv verifies against it is read, and only the signed
    text of it; without, the file is read as the https server gave it, and the log says so."""
    folder = url.rsplit("/", 1)[0]
    for sums in _SUMS_FILES if keyring is None else _SUMS_FILES[:1]:
        try:
            with urllib.request.urlopen(_request(f"{folder}/{sums}"), timeout=60) as response:
                raw = response.read(4 << 20)
        except urllib.error.HTTPError as err:
            if err.code == 404:
                continue
            raise SourceError(
                f"cannot download {folder}/{sums}: HTTP {err.code} {err.reason}", "check the URL"
            ) from None
        except (urllib.error.URLError, OSError) as err:
            raise SourceError(
                f"cannot download {folder}/{sums}: {_reason(err)}", "check the URL and the network"
            ) from None
        if keyring is not None:
            text = verification.signed_text(raw, keyring, f"{folder}/{sums}")
        else:
            text = raw.decode(errors="replace")
            say(f"the signature of {folder}/{sums} was not checked (no --keyring): trusting the https server")
        for digest, listed in _SUMS_LINE.findall(text):
            if listed.rsplit("/", 1)[-1] == name:
                return digest.lower()
    if keyring is not None:
        raise SourceError(
            f"no signed {_SUMS_FILES[0]} beside {url} lists {name} (--keyring {keyring} needs one)",
            "give the tarball's --sha256 instead",
        )
    raise SourceError(
        f"no SHA-256 known for {url}: none given and no sha256sums beside it lists {name}",
        "give the tarball's SHA-256 (kernel.org lists them in sha256sums.asc)",
    )


def _download(url: str, dest: Path) -> str:
    """Download `url` to `dest` with progress; its SHA-256."""
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(_request(url), timeout=60) as response, open(dest, "wb") as out:
            length = response.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
            progress = ByteProgress(f"downloading {dest.name}", total)
            received = 0
            while chunk := response.read(_CHUNK):
                out.write(chunk)
                digest.update(chunk)
                received += len(chunk)
                progress.advance(len(chunk))
            if total is not None and received != total:
                progress.finish("failed")
                raise SourceError(f"download of {url} stopped after {received} of {total} bytes", "run again")
            progress.finish()
    except urllib.error.HTTPError as err:
        raise SourceError(f"cannot download {url}: HTTP {err.code} {err.reason}", "check the URL") from None
    except (urllib.error.URLError, OSError) as err:
        raise SourceError(f"cannot download {url}: {_reason(err)}", "check the URL and the network") from None
    return digest.hexdigest()


def _request(url: str) -> urllib.request.Request:
    return urllib.request.Request(url, headers={"User-Agent": f"rdna1-kmgr/{__version__}"})


def _reason(err: Exception) -> str:
    return str(getattr(err, "reason", None) or err)
