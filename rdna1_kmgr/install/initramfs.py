"""The distribution's initramfs tool: regenerate one kernel's image, list it, and read a module out of it.

initramfs-tools (Debian, Ubuntu) is implemented. dracut (Fedora, openSUSE) and mkinitcpio (Arch) have their
place here with the commands they would run; they are refused before anything changes until someone
implements and tests them.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rdna1_kmgr.core import runner
from rdna1_kmgr.core.errors import HostError
from rdna1_kmgr.core.files import sha256_file
from rdna1_kmgr.install.target_root import TargetRoot

_MODULE_SUFFIX = r"\.ko(?:\.xz|\.zst|\.gz)?"


@dataclass(frozen=True)
class CarriedModule:
    entries: list[str]  # every copy of the module in the image (paths inside it)
    resolved: str | None  # the one the image's own module index gives, as modprobe in early boot would load it
    sha256: str | None


class InitramfsTool:
    name = "?"
    supported = False

    def __init__(self, root: TargetRoot):
        self.root = root

    def image(self, kernel: str) -> Path:
        raise NotImplementedError

    def outputs(self, kernel: str) -> list[Path]:
        """Every file regenerating may create or replace (the journal backs them up first)."""
        return [self.image(kernel)]

    def regenerate_command(self, kernel: str) -> list[str]:
        raise NotImplementedError

    def regenerate(self, kernel: str) -> None:
        self.require_supported()
        command = self.regenerate_command(kernel)
        runner.run(command, timeout=900, doing=" ".join(command), hint="see the log in /var/log/rdna1-kmgr")

    def list_files(self, image: Path) -> list[str]:
        raise NotImplementedError

    def extract(self, image: Path, dest: Path) -> None:
        raise NotImplementedError

    def require_supported(self) -> None:
        if not self.supported:
            raise HostError(f"the initramfs tool {self.name} is not supported yet",
                            "rdna1-kmgr install knows initramfs-tools (Debian, Ubuntu) only")

    def carried_module(self, kernel: str, module: str) -> CarriedModule | None:
        """Which `module` the kernel's image would load (None when it carries none).

        mkinitramfs runs depmod inside the image, so its own index decides: the image is unpacked and the real
        `modinfo -b <unpacked> -k KREL -n <module>` asked, the same resolution modprobe makes at early boot.
        """
        image = self.image(kernel)
        if not image.is_file():
            return None
        pattern = re.compile(rf"(?:^|/)lib/modules/{re.escape(kernel)}/.*/{re.escape(module)}{_MODULE_SUFFIX}$")
        entries = [e for e in self.list_files(image) if pattern.search(e)]
        if not entries:
            return None
        with tempfile.TemporaryDirectory(prefix="rdna1-kmgr-initramfs-") as tmp:
            self.extract(image, Path(tmp))
            # unmkinitramfs puts an early (microcode) archive in early/ and the main one in main/.
            roots = [r for r in (Path(tmp) / "main", Path(tmp)) if (r / "lib/modules" / kernel).is_dir()
                     or (r / "usr/lib/modules" / kernel).is_dir()]
            if not roots:
                raise HostError(f"{image} lists {entries[0]} but holds no lib/modules/{kernel} once unpacked",
                                "check the image with lsinitramfs")
            result = runner.run(TargetRoot(roots[0]).modinfo_command(kernel, module), check=False)
            if result.returncode != 0 or not result.stdout.strip():
                return CarriedModule(entries, None, None)
            path = Path(result.stdout.strip().splitlines()[0])
            return CarriedModule(entries, str(path.relative_to(roots[0])), sha256_file(path))


class InitramfsTools(InitramfsTool):
    """Debian's and Ubuntu's initramfs-tools."""

    name = "initramfs-tools"
    supported = True

    def image(self, kernel: str) -> Path:
        return self.root.boot_dir / f"initrd.img-{kernel}"

    def outputs(self, kernel: str) -> list[Path]:
        image = self.image(kernel)
        # update-initramfs writes <image>.new and renames it: a killed run may leave it behind.
        return [image, image.with_name(image.name + ".new")]

    def regenerate_command(self, kernel: str) -> list[str]:
        # -c, not -u: -u honours update_initramfs=no and shuffles .bak copies; our journal is the backup.
        return ["update-initramfs", "-c", "-k", kernel, "-b", str(self.root.boot_dir)]

    def list_files(self, image: Path) -> list[str]:
        result = runner.run(["lsinitramfs", str(image)], timeout=300, doing=f"lsinitramfs {image}")
        return [line.strip() for line in result.stdout.splitlines() if line.strip()]

    def extract(self, image: Path, dest: Path) -> None:
        runner.run(["unmkinitramfs", str(image), str(dest)], timeout=300, doing=f"unmkinitramfs {image}")


class Dracut(InitramfsTool):
    """Fedora's and openSUSE's dracut: `dracut --force <image> <kernel>`, listed with `lsinitrd`. Not yet."""

    name = "dracut"

    def image(self, kernel: str) -> Path:
        return self.root.boot_dir / f"initramfs-{kernel}.img"

    def regenerate_command(self, kernel: str) -> list[str]:
        return ["dracut", "--force", str(self.image(kernel)), kernel]


class Mkinitcpio(InitramfsTool):
    """Arch's mkinitcpio: `mkinitcpio -k <kernel> -g <image>` (its presets name the image). Not yet."""

    name = "mkinitcpio"

    def image(self, kernel: str) -> Path:
        return self.root.boot_dir / "initramfs-linux.img"

    def regenerate_command(self, kernel: str) -> list[str]:
        return ["mkinitcpio", "-k", kernel, "-g", str(self.image(kernel))]


# In the order they are looked for: a Debian system with dracut installed instead uses dracut.
_TOOLS = (("update-initramfs", InitramfsTools), ("dracut", Dracut), ("mkinitcpio", Mkinitcpio))


def detect(root: TargetRoot) -> InitramfsTool:
    for program, tool in _TOOLS:
        if shutil.which(program):
            return tool(root)
    raise HostError("no initramfs tool found (update-initramfs, dracut or mkinitcpio)",
                    "install the distribution's (apt install initramfs-tools)")
