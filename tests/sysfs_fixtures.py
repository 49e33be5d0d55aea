"""Small fake system roots for tests: the sysfs, procfs, /dev, /etc and /lib/modules bits that detect reads.

The layout copies the kernel's: devices live under sys/devices/pci0000:00/, sys/bus/pci/devices/ links to
them, `driver` and `iommu_group` are symlinks, and an IOMMU group's devices/ folder links its members. Links
are relative so the tree is self-contained wherever tmp_path is.
"""

import os
from pathlib import Path

EFI_GLOBAL_GUID = "8be4df61-93ca-11d2-aa0d-00e098032b8c"


class FakeSysroot:
    def __init__(self, root: Path):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def _write(self, rel: str, content: str | bytes) -> Path:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        return path

    def _link(self, rel: str, target_rel: str) -> None:
        """A relative symlink at rel pointing at target_rel (both relative to the root)."""
        link = self.root / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(self.root / target_rel, link.parent))

    def kernel(self, release: str) -> "FakeSysroot":
        self._write("proc/sys/kernel/osrelease", release + "\n")
        self._write("proc/version", f"Linux version {release} (builder@fixture) (gcc 12.2.0) #1 SMP\n")
        return self

    def os_release(self, distro_id: str, version_id: str, pretty_name: str) -> "FakeSysroot":
        name = pretty_name.split(" ")[0]
        self._write(
            "etc/os-release",
            f'PRETTY_NAME="{pretty_name}"\nNAME="{name}"\nVERSION_ID="{version_id}"\nID={distro_id}\n',
        )
        return self

    def headers(self, release: str) -> "FakeSysroot":
        """Debian's shape: build is an absolute link to /usr/src/linux-headers-KREL (inside this root)."""
        (self.root / f"usr/src/linux-headers-{release}").mkdir(parents=True)
        build = self.root / f"lib/modules/{release}/build"
        build.parent.mkdir(parents=True, exist_ok=True)
        build.symlink_to(f"/usr/src/linux-headers-{release}")
        return self

    def kvm(self) -> "FakeSysroot":
        self._write("dev/kvm", "")
        return self

    def efi(self, secure_boot: bool | None) -> "FakeSysroot":
        """UEFI boot; secure_boot None means firmware without a SecureBoot variable."""
        (self.root / "sys/firmware/efi/efivars").mkdir(parents=True, exist_ok=True)
        if secure_boot is not None:
            attributes = b"\x06\x00\x00\x00"  # BOOTSERVICE_ACCESS | RUNTIME_ACCESS
            value = b"\x01" if secure_boot else b"\x00"
            self._write(f"sys/firmware/efi/efivars/SecureBoot-{EFI_GLOBAL_GUID}", attributes + value)
        return self

    def iommu(self, unit: str = "ivhd0") -> "FakeSysroot":
        (self.root / "sys/class/iommu" / unit).mkdir(parents=True, exist_ok=True)
        return self

    def pci_device(
        self,
        bdf: str,
        vendor: int,
        device: int,
        pci_class: int,
        driver: str | None = None,
        boot_vga: bool | None = None,
        iommu_group: int | None = None,
        reset_method: str | None = None,
    ) -> "FakeSysroot":
        dev = f"sys/devices/pci0000:00/{bdf}"
        self._write(f"{dev}/vendor", f"0x{vendor:04x}\n")
        self._write(f"{dev}/device", f"0x{device:04x}\n")
        self._write(f"{dev}/class", f"0x{pci_class:06x}\n")
        if boot_vga is not None:
            self._write(f"{dev}/boot_vga", "1\n" if boot_vga else "0\n")
        if reset_method is not None:
            self._write(f"{dev}/reset_method", reset_method + "\n")
        self._link(f"sys/bus/pci/devices/{bdf}", dev)
        if driver is not None:
            self._link(f"{dev}/driver", f"sys/bus/pci/drivers/{driver}")
            self._link(f"sys/bus/pci/drivers/{driver}/{bdf}", dev)
        if iommu_group is not None:
            self._link(f"{dev}/iommu_group", f"sys/kernel/iommu_groups/{iommu_group}")
            self._link(f"sys/kernel/iommu_groups/{iommu_group}/devices/{bdf}", dev)
        return self

    def drm(self, bdf: str, *nodes: str) -> "FakeSysroot":
        """DRM minors a bound GPU driver made for the device (card0, renderD128)."""
        for node in nodes:
            (self.root / f"sys/devices/pci0000:00/{bdf}/drm/{node}").mkdir(parents=True, exist_ok=True)
        return self

    def process(self, pid: int, comm: str, *open_paths: str) -> "FakeSysroot":
        """A process with files open: /proc/<pid>/fd/<n> links whose targets are the absolute paths."""
        self._write(f"proc/{pid}/comm", comm + "\n")
        for n, target in enumerate(open_paths, start=3):
            link = self.root / f"proc/{pid}/fd/{n}"
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(target)
        return self

    def driver(self, name: str) -> "FakeSysroot":
        """A registered PCI driver with no device (vfio-pci loaded, nothing bound yet)."""
        (self.root / f"sys/bus/pci/drivers/{name}").mkdir(parents=True, exist_ok=True)
        return self

    def module(self, name: str) -> "FakeSysroot":
        (self.root / f"sys/module/{name}").mkdir(parents=True, exist_ok=True)
        return self

    def kmsg(self, *messages: str, first_seq: int = 1000) -> "FakeSysroot":
        """/dev/kmsg as a file of records `prio,seq,usec,flags;message` with a continuation line each."""
        records = "".join(f"6,{first_seq + i},{i * 1000},-;{m}\n SUBSYSTEM=pci\n" for i, m in enumerate(messages))
        self._write("dev/kmsg", records)
        return self

    # --- what doctor reads besides detect's facts ---

    def file(self, rel: str, content: str, mode: int | None = None) -> "FakeSysroot":
        path = self._write(rel, content)
        if mode is not None:
            path.chmod(mode)
        return self

    def kfd_node(
        self,
        index: int,
        gfx_target_version: int = 0,
        simd_count: int = 0,
        render_minor: int | None = None,
        heap_types: tuple[int, ...] = (),
        capability: int | None = None,
        **more: int,
    ) -> "FakeSysroot":
        """A KFD topology node as /sys/class/kfd/kfd/topology/nodes/N shows it (0: a CPU node). `capability` is
        printed as kfd_topology.c's node_show does (`capability %u`, decimal); None leaves the line out. `more`:
        further `name value` lines (simd_per_cu, max_waves_per_simd, and the cwsr_size and ctl_stack_size of
        kernels with upstream 8fc2796dea6f)."""
        node = f"sys/class/kfd/kfd/topology/nodes/{index}"
        props = {
            "cpu_cores_count": 0 if simd_count else 8,
            "simd_count": simd_count,
            "gfx_target_version": gfx_target_version,
            "vendor_id": 4098 if simd_count else 0,
            "device_id": 29471 if simd_count else 0,
            "drm_render_minor": -1 if render_minor is None else render_minor,
        }
        if capability is not None:
            props["capability"] = capability
        props.update(more)
        self._write(f"{node}/properties", "".join(f"{k} {v}\n" for k, v in props.items()))
        for bank, heap in enumerate(heap_types):
            self._write(f"{node}/mem_banks/{bank}/properties", f"heap_type {heap}\nsize_in_bytes 6425673728\n")
        return self

    def users(self, *users: tuple[str, int, list[str]], groups: dict[str, int] | None = None) -> "FakeSysroot":
        """/etc/passwd and /etc/group: users as (name, uid, [supplementary group names]), homes /home/NAME."""
        groups = dict(groups or {})
        passwd = "root:x:0:0:root:/root:/bin/bash\n"
        members: dict[str, list[str]] = {g: [] for g in groups}
        for name, uid, extra in users:
            passwd += f"{name}:x:{uid}:{uid}:{name}:/home/{name}:/bin/bash\n"
            groups.setdefault(name, uid)
            members.setdefault(name, [])
            for g in extra:
                members.setdefault(g, []).append(name)
            (self.root / f"home/{name}").mkdir(parents=True, exist_ok=True)
        self._write("etc/passwd", passwd)
        self._write(
            "etc/group",
            "root:x:0:\n" + "".join(f"{g}:x:{gid}:{','.join(members.get(g, []))}\n" for g, gid in groups.items()),
        )
        return self


# The trees the detect tests read. Ids as in pci.ids: 731F is Navi10 (RX 5600 XT, and also RX 5700 / 5700 XT,
# told apart only by revision), AB38 its HDMI/DP audio, 7340 Navi14 (RX 5500 XT), 2484 an NVIDIA GA104.


def rx5600xt(root: Path) -> FakeSysroot:
    """A UEFI desktop with Secure Boot on, IOMMU on, headers installed, and an RX 5600 XT with its audio."""
    tree = FakeSysroot(root).kernel("6.1.0-56-amd64").headers("6.1.0-56-amd64")
    tree.os_release("debian", "12", "Debian GNU/Linux 12 (bookworm)").kvm().efi(secure_boot=True).iommu()
    tree.pci_device("0000:00:00.0", 0x1022, 0x1480, 0x060000, iommu_group=0)
    tree.pci_device("0000:01:00.0", 0x144D, 0xA808, 0x010802, driver="nvme", iommu_group=11, reset_method="flr bus")
    tree.pci_device(
        "0000:0a:00.0", 0x1002, 0x731F, 0x030000, driver="amdgpu", boot_vga=True, iommu_group=14, reset_method="bus"
    )
    tree.pci_device("0000:0a:00.1", 0x1002, 0xAB38, 0x040300, driver="snd_hda_intel", iommu_group=14)
    return tree


def rx5700xt(root: Path) -> FakeSysroot:
    """An Ubuntu box on an older kernel: BIOS boot, no IOMMU, no headers, no KVM, the board bound to no driver."""
    tree = FakeSysroot(root).kernel("5.10.0-28-amd64").os_release("ubuntu", "22.04", "Ubuntu 22.04.4 LTS")
    tree.pci_device("0000:03:00.0", 0x1002, 0x731F, 0x030000, boot_vga=True)
    tree.pci_device("0000:03:00.1", 0x1002, 0xAB38, 0x040300)
    return tree


def nvidia(root: Path) -> FakeSysroot:
    """No AMD GPU at all: one NVIDIA board with its audio function."""
    tree = FakeSysroot(root).kernel("6.1.0-56-amd64").os_release("debian", "12", "Debian GNU/Linux 12 (bookworm)")
    tree.efi(secure_boot=False).iommu("dmar0").kvm()
    tree.pci_device("0000:01:00.0", 0x10DE, 0x2484, 0x030000, driver="nouveau", boot_vga=True, iommu_group=1)
    tree.pci_device("0000:01:00.1", 0x10DE, 0x228B, 0x040300, driver="snd_hda_intel", iommu_group=1)
    return tree


def two_gpus(root: Path) -> FakeSysroot:
    """An RX 5500 XT (RDNA1, not the default target) drives the desktop; an RX 5600 XT sits in a second slot."""
    tree = FakeSysroot(root).kernel("6.12.95+deb12-amd64").headers("6.12.95+deb12-amd64")
    tree.os_release("debian", "12", "Debian GNU/Linux 12 (bookworm)").efi(secure_boot=None).iommu().kvm()
    tree.pci_device("0000:03:00.0", 0x1002, 0x7340, 0x030000, driver="amdgpu", boot_vga=True, iommu_group=5)
    tree.pci_device("0000:03:00.1", 0x1002, 0xAB38, 0x040300, driver="snd_hda_intel", iommu_group=5)
    tree.pci_device(
        "0000:0b:00.0",
        0x1002,
        0x731F,
        0x030000,
        driver="vfio-pci",
        boot_vga=False,
        iommu_group=9,
        reset_method="device_specific bus",
    )
    tree.pci_device("0000:0b:00.1", 0x1002, 0xAB38, 0x040300, driver="vfio-pci", iommu_group=9)
    return tree


def no_gpu(root: Path) -> FakeSysroot:
    """A headless machine: a host bridge and a network card, nothing of class 0x03."""
    tree = FakeSysroot(root).kernel("6.1.0-56-amd64").os_release("debian", "12", "Debian GNU/Linux 12 (bookworm)")
    tree.pci_device("0000:00:00.0", 0x8086, 0x0D57, 0x060000)
    tree.pci_device("0000:00:03.0", 0x8086, 0x100E, 0x020000, driver="e1000")
    return tree
