"""The distribution's initramfs tool: regenerate one kernel's image, list it, and read a module out of it.

initramfs-tools (Debian, Ubuntu) and dracut (Fedora, openSUSE, and Debian's own dracut package) are
implemented. mkinitcpio (Arch) has its place here with the commands it would run; it is refused before
anything changes until someone implements and tests it.

On a target root other than / (tests), a tool installed inside that root is preferred and run inside it
with chroot: its own configuration, modules and helpers, the way that system would run it.
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
from rdna1_kmgr.modbuild import module_checks

_MODULE_SUFFIX = r"\.ko(?:\.xz|\.zst|\.gz)?"
_LSINITRD_LINE = re.compile(
    r"^[-dlcbps][rwxsStT-]{9}\s+\d+\s+\S+\s+\S+\s+(?:\d+,\s*)?\d+\s+\w{3}\s+\d+\s+[\d:]+\s+(.+)$"
)


@dataclass(frozen=True)
class CarriedModule:
    entries: list[str]  # every copy of the module in the image (paths inside it)
    resolved: str | None  # the one the image's own module index gives, as modprobe in early boot would load it
    sha256: str | None  # of that file
    # of its ELF bytes, decompressed: mkinitramfs (initramfs-tools 0.142) decompresses the modules it copies in
    # "for boot speed" when xz or zstd is installed, so an `amdgpu.ko.xz` installed (DKMS compresses a module as
    # the kernel's own are: 6.12's) is an `amdgpu.ko` there, the same module
    module_sha256: str | None = None


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

    def scratch_parent(self) -> Path | None:
        """Where to unpack an image (None: the system's temporary folder)."""
        return None

    def loader_hooks(self, loader: str, rule: str, stock_dir: str, original_dir: str) -> dict[Path, tuple[str, int]]:
        """The files that put the stock-amdgpu loader (the modprobe rule `/rule` and its program `/loader`,
        install/stock_loader.py) in this tool's images and, where an image carries amdgpu, the distribution's
        amdgpu from `stock_dir` (under the kernel's module folder; or from DKMS's archive of it, `original_dir`,
        put in the image at `stock_dir`) beside ours: path -> (content, mode).
        None here: a tool not supported yet is refused before anything changes (require_supported)."""
        return {}

    def require_supported(self) -> None:
        if not self.supported:
            raise HostError(
                f"the initramfs tool {self.name} is not supported yet",
                "rdna1-kmgr install knows initramfs-tools (Debian, Ubuntu) and dracut only",
            )

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
        with tempfile.TemporaryDirectory(prefix="rdna1-kmgr-initramfs-", dir=self.scratch_parent()) as tmp:
            self.extract(image, Path(tmp))
            # unmkinitramfs puts an early (microcode) archive in early/ and the main one in main/.
            roots = [
                r
                for r in (Path(tmp) / "main", Path(tmp))
                if (r / "lib/modules" / kernel).is_dir() or (r / "usr/lib/modules" / kernel).is_dir()
            ]
            if not roots:
                raise HostError(
                    f"{image} lists {entries[0]} but holds no lib/modules/{kernel} once unpacked",
                    "check the image with lsinitramfs",
                )
            result = runner.run(TargetRoot(roots[0]).modinfo_command(kernel, module), check=False)
            if result.returncode != 0 or not result.stdout.strip():
                return CarriedModule(entries, None, None)
            path = Path(result.stdout.strip().splitlines()[0])
            content = module_checks.content_sha256(path)
            return CarriedModule(entries, str(path.relative_to(roots[0])), sha256_file(path), content)


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

    def loader_hooks(self, loader: str, rule: str, stock_dir: str, original_dir: str) -> dict[Path, tuple[str, int]]:
        # mkinitramfs copies /etc/modprobe.d (the rule) itself, and runs the hooks after it copied the modules,
        # so the hook sees whether amdgpu is in.
        hook = f"""\
#!/bin/sh
# Written by `rdna1-kmgr install`; `rdna1-kmgr rollback` removes it. The initramfs gets rdna1-kmgr's amdgpu
# loader (the program of the `install amdgpu` rule in /etc/modprobe.d) and, when it carries amdgpu, the
# distribution's amdgpu file beside the rdna1-kmgr one: a fallback boot loads that one in early boot.
PREREQ=""
prereqs() {{ echo "$PREREQ"; }}
case "$1" in
prereqs) prereqs; exit 0 ;;
esac
. /usr/share/initramfs-tools/hook-functions
copy_exec /{loader}
copy_exec /sbin/insmod
copy_exec /sbin/modinfo
if [ -n "$(find -H "${{DESTDIR}}${{MODULESDIR}}" -name 'amdgpu.ko*' -print -quit)" ]; then
\t# where the kernel package put it, or where DKMS keeps it while ours is installed: in the image, where the
\t# kernel package put it
\tfor file in "${{MODULESDIR}}"/{stock_dir}/amdgpu.ko* /{original_dir}/"${{version}}"/*/amdgpu.ko*; do
\t\t[ -f "$file" ] && copy_file module "$file" "${{MODULESDIR}}/{stock_dir}/"
\tdone
fi
exit 0
"""
        return {self.root.path / "etc/initramfs-tools/hooks/rdna1-kmgr": (hook, 0o755)}


class Dracut(InitramfsTool):
    """dracut: `dracut --force --kver KREL <image>`, listed and unpacked with its lsinitrd.

    Fedora's default, and packaged by Debian. Proven here with Debian's dracut in a debootstrapped root (run
    inside it with chroot); on a Fedora host the same commands run directly (not run here)."""

    name = "dracut"
    supported = True

    def image(self, kernel: str) -> Path:
        return self.root.boot_dir / f"initramfs-{kernel}.img"

    def regenerate_command(self, kernel: str) -> list[str]:
        return self._inside(["dracut", "--force", "--kver", kernel, self._own(self.image(kernel))])

    def regenerate(self, kernel: str) -> None:
        self.require_supported()
        # dracut prints its progress on stderr and its failures there too; a cold image takes a minute.
        runner.run(
            self.regenerate_command(kernel),
            timeout=1800,
            doing=f"dracut for {kernel}",
            hint="see dracut's message; `dracut --force --kver KREL` by hand shows all of it",
        )

    def list_files(self, image: Path) -> list[str]:
        out = runner.run(self._inside(["lsinitrd", self._own(image)]), doing=f"lsinitrd {image}").stdout
        # `ls -l` lines after a header: mode, links, owner, group, size (devices: major, minor), date, path.
        return [match.group(1).split(" -> ", 1)[0] for match in map(_LSINITRD_LINE.match, out.splitlines()) if match]

    def extract(self, image: Path, dest: Path) -> None:
        command = ["lsinitrd", "--unpack", self._own(image)]
        if self.root.is_system:
            runner.run(command, cwd=dest, doing=f"lsinitrd --unpack {image}")
        else:
            runner.run(self._inside(["env", "-C", self._own(dest), *command]), doing=f"lsinitrd --unpack {image}")

    def loader_hooks(self, loader: str, rule: str, stock_dir: str, original_dir: str) -> dict[Path, tuple[str, int]]:
        # dracut carries /etc/modprobe.d in host-only images only: the rule is put in by name. Booted here: no
        # (the boot tests run Debian's initramfs-tools); the image's content is tested (test_dracut.py).
        module = f"""\
#!/bin/bash
# Written by `rdna1-kmgr install`; `rdna1-kmgr rollback` removes it. The image gets rdna1-kmgr's amdgpu loader
# (the program of the `install amdgpu` rule in /etc/modprobe.d) and, when it carries amdgpu, the distribution's
# amdgpu file beside the rdna1-kmgr one: a fallback boot loads that one in early boot.
check() {{ return 0; }}
depends() {{ return 0; }}
install() {{
    inst_multiple /{loader} /{rule} insmod modinfo
    if [[ -n "$(find -H "$initdir/lib/modules/$kernel" -name 'amdgpu.ko*' -print -quit)" ]]; then
        local file
        for file in "$srcmods"/{stock_dir}/amdgpu.ko* /{original_dir}/"$kernel"/*/amdgpu.ko*; do
            [[ -f "$file" ]] && inst_simple "$file" "/lib/modules/$kernel/{stock_dir}/${{file##*/}}"
        done
    fi
}}
"""
        return {
            self.root.path / "usr/lib/dracut/modules.d/90rdna1-kmgr/module-setup.sh": (module, 0o755),
            self.root.path / "etc/dracut.conf.d/rdna1-kmgr.conf": (
                "# Written by `rdna1-kmgr install`; `rdna1-kmgr rollback` removes it.\n"
                'add_dracutmodules+=" rdna1-kmgr "\n',
                0o644,
            ),
        }

    def scratch_parent(self) -> Path | None:
        if self.root.is_system:
            return None
        scratch = self.root.path / "tmp"  # unpacked inside the root, where its lsinitrd can write
        scratch.mkdir(exist_ok=True)
        return scratch

    def _inside(self, argv: list[str]) -> list[str]:
        return (
            argv
            if self.root.is_system or not _installed_in(self.root, argv[0])
            else ["chroot", str(self.root.path), *argv]
        )

    def _own(self, path: Path) -> str:
        """A path as the tool sees it: inside the root when it runs there."""
        if self.root.is_system or not _installed_in(self.root, "dracut"):
            return str(path)
        return "/" + str(Path(path).relative_to(self.root.path))


class Mkinitcpio(InitramfsTool):
    """Arch's mkinitcpio: `mkinitcpio -k <kernel> -g <image>` (its presets name the image). Not yet."""

    name = "mkinitcpio"

    def image(self, kernel: str) -> Path:
        return self.root.boot_dir / "initramfs-linux.img"

    def regenerate_command(self, kernel: str) -> list[str]:
        return ["mkinitcpio", "-k", kernel, "-g", str(self.image(kernel))]


def _installed_in(root: TargetRoot, program: str) -> bool:
    return any((root.path / folder / program).is_file() for folder in ("usr/sbin", "usr/bin", "sbin", "bin"))


# By program name, in the order they are looked for after the platform's default: a Debian system with dracut
# installed instead uses dracut.
TOOLS: dict[str, type[InitramfsTool]] = {
    "update-initramfs": InitramfsTools,
    "dracut": Dracut,
    "mkinitcpio": Mkinitcpio,
}


def detect(root: TargetRoot, default: str | None = None) -> InitramfsTool:
    """The tool the system has; `default` (the platform record's initramfs_tool) first when it has several."""
    if not root.is_system and _installed_in(root, "dracut"):  # a root with dracut of its own runs it (chroot)
        return Dracut(root)
    order = [default] if default in TOOLS else []
    for program in order + [name for name in TOOLS if name != default]:
        if shutil.which(program):
            return TOOLS[program](root)
    raise HostError(
        "no initramfs tool found (update-initramfs, dracut or mkinitcpio)",
        "install the distribution's (apt install initramfs-tools)",
    )
