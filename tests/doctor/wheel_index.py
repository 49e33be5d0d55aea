"""Wheels and pip indexes made at test time, in the documented formats, so that a pip line doctor prints can be
run for real: nothing of TheRock's or PyTorch's is copied.

- A wheel (PEP 427, the binary distribution format): a zip of the files, `<name>-<version>.dist-info/METADATA`
  (core metadata 2.1: Name, Version, Requires-Dist with `extra == "..."` markers, Provides-Extra), `WHEEL`
  (Root-Is-Purelib, Tag py3-none-any) and `RECORD` (path, sha256 urlsafe base64 without padding, size).
- An index (PEP 503, the simple repository API): `<index>/<normalised project>/index.html` with a link per file;
  pip reads a `file://` index's folders that way.
- TheRock's multi-arch layout (its RELEASES.md, RFC0008): the host wheels `torch` and `torchvision` declare the
  extra `device-<gfx>`, which pulls `amd-torch-device-<gfx>` and `rocm-sdk-device-<gfx>` at the host wheels'
  exact versions; the files each wheel holds are those therock_fixtures.py writes, split by package.
"""

from __future__ import annotations

import base64
import hashlib
import re
import shutil
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from therock_fixtures import therock_venv


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class Wheel:
    name: str
    version: str
    files: dict[str, bytes] = field(default_factory=dict)
    requires: list[str] = field(default_factory=list)
    extras: dict[str, list[str]] = field(default_factory=dict)

    @property
    def filename(self) -> str:
        return f"{re.sub(r'[-_.]+', '_', self.name)}-{self.version}-py3-none-any.whl"

    def write(self, folder: Path) -> Path:
        info = f"{re.sub(r'[-_.]+', '_', self.name)}-{self.version}.dist-info"
        metadata = ["Metadata-Version: 2.1", f"Name: {self.name}", f"Version: {self.version}"]
        metadata += [f"Requires-Dist: {r}" for r in self.requires]
        for extra, wanted in self.extras.items():
            metadata.append(f"Provides-Extra: {extra}")
            metadata += [f'Requires-Dist: {r}; extra == "{extra}"' for r in wanted]
        contents = {
            **self.files,
            f"{info}/METADATA": ("\n".join(metadata) + "\n\n").encode(),
            f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: rdna1-kmgr-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        }
        record = []
        for path, data in contents.items():
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{path},sha256={digest},{len(data)}")
        record.append(f"{info}/RECORD,,")
        contents[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
        folder.mkdir(parents=True, exist_ok=True)
        out = folder / self.filename
        with zipfile.ZipFile(out, "w") as archive:
            for path, data in contents.items():
                archive.writestr(path, data)
        return out


def publish(mirror: Path, url: str, wheels: list[Wheel]) -> None:
    """Put `wheels` on the index `url` of the test's mirror (mirror/<host><path>), as a PEP 503 simple index."""
    parts = urlsplit(url)
    index = mirror / (parts.netloc + parts.path)
    for wheel in wheels:
        project = index / normalise(wheel.name)
        wheel.write(project)
        links = "".join(f'<a href="{f.name}">{f.name}</a>\n' for f in sorted(project.glob("*.whl")))
        (project / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")


def local(line: str, mirror: Path) -> str:
    """A printed line with each https index replaced by its folder in the test's mirror (file://)."""
    return re.sub(r"https://([^ `]+)", lambda m: (mirror / m.group(1)).as_uri() + "/", line)


def therock_release(scratch: Path, rocm: str, torch: str, arch: str = "gfx1010") -> list[Wheel]:
    """TheRock's multi-arch wheels of one build: host wheels and `arch`'s device wheels, their files laid out by
    therock_fixtures.therock_venv and split by the package that installs them."""
    stage = scratch / f"stage-{rocm}"
    shutil.rmtree(stage, ignore_errors=True)
    site = therock_venv(stage, rocm=rocm, torch=torch, device=arch, host_arches=())
    files = {
        str(p.relative_to(site)): p.read_bytes() for p in site.rglob("*") if p.is_file() and ".dist-info" not in str(p)
    }

    def taken(test) -> dict[str, bytes]:
        return {path: data for path, data in files.items() if test(path)}

    device = {
        "amd-torch-device": taken(lambda p: p.startswith("torch/.kpack/")),
        "rocm-sdk-device": taken(lambda p: p.startswith("_rocm_sdk_libraries/") and arch in p),
    }
    vision = "0.26.0+rocm" + rocm
    return [
        Wheel(
            "torch",
            torch,
            taken(lambda p: p.startswith("torch/") and not p.startswith("torch/.kpack/")),
            [f"rocm-sdk-core=={rocm}", f"rocm-sdk-libraries=={rocm}"],
            {f"device-{arch}": [f"amd-torch-device-{arch}=={torch}", f"rocm-sdk-device-{arch}=={rocm}"]},
        ),
        Wheel("torchvision", vision, {"torchvision/__init__.py": b""}, [f"torch=={torch}"], {f"device-{arch}": []}),
        Wheel("rocm-sdk-core", rocm, taken(lambda p: p.startswith("_rocm_sdk_core/"))),
        Wheel(
            "rocm-sdk-libraries",
            rocm,
            taken(lambda p: p.startswith("_rocm_sdk_libraries/") and arch not in p),
        ),
        Wheel(f"amd-torch-device-{arch}", torch, device["amd-torch-device"], [f"torch=={torch}"]),
        Wheel(f"rocm-sdk-device-{arch}", rocm, device["rocm-sdk-device"], [f"rocm-sdk-libraries=={rocm}"]),
    ]


def host_only(wheels: list[Wheel]) -> list[Wheel]:
    """A build's host wheels: what an owner has who installed `torch` without the device extra."""
    return [w for w in wheels if "-device-" not in w.name]
