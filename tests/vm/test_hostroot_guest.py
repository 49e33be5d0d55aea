"""The host-root guest of the emulated vm-test (rdna1_kmgr/vm/hostroot_guest.py): what it shows the command where,
as guest_view.py documents the guest's view, and the QEMU command line it boots with. Its real boots are the
emulated verdict tests in test_engine.py."""

from pathlib import Path

import pytest

from rdna1_kmgr.core.errors import HostError
from rdna1_kmgr.vm import engine, guest, guest_kernel, guest_registry, guest_view, hostroot_guest

RELEASE = "6.1.0-56-amd64"


def view_of(tmp_path: Path) -> guest_view.GuestView:
    """What guest_view.prepare gives with the system's Python: the run folder."""
    rundir = tmp_path / "run"
    rundir.mkdir()
    mappings = [guest_view.Mapping(guest_view.GUEST_RUN, rundir, writable=True)]
    return guest_view.GuestView(rundir, "/usr/bin/python3", mappings)


def table(mounts: list[hostroot_guest.Mount]) -> list[tuple[str, str, str, str]]:
    return [(m.fstype, m.source, str(m.path), m.options.split(",")[0]) for m in mounts]


def test_a_cached_kernel_shows_the_host_root_read_only_its_modules_and_the_run_folder_writable(tmp_path):
    kernel = guest_kernel.GuestKernel(RELEASE, tmp_path / "cache" / RELEASE, "cache")
    view = view_of(tmp_path)
    shares, mounts = hostroot_guest.layout(kernel, view, secrets=([], []))  # the masks: test_root_s_secrets_...
    assert [(s.tag, s.host, s.writable) for s in shares] == [
        ("hostroot", Path("/"), False),
        ("modules", kernel.root / "lib" / "modules" / RELEASE, False),
        ("map0", view.run, True),
    ]
    assert table(mounts) == [
        ("9p", "hostroot", "/", "ro"),  # first: the rest is mounted below it
        ("proc", "proc", "/proc", "nosuid"),
        ("sysfs", "sysfs", "/sys", "nosuid"),
        ("devtmpfs", "devtmpfs", "/dev", "nosuid"),  # /dev/kmsg, which the guest side reads
        ("tmpfs", "tmpfs", "/run", "nosuid"),
        ("tmpfs", "tmpfs", "/tmp", "nosuid"),
        ("tmpfs", "tmpfs", "/var/tmp", "nosuid"),
        # as virtme-ng does it: the host's own /lib/modules hidden, the kernel's modules at /lib/modules/KREL
        ("tmpfs", "tmpfs", "/lib/modules", "mode=0755"),
        ("9p", "modules", f"/lib/modules/{RELEASE}", "ro"),
        ("9p", "map0", str(guest_view.GUEST_RUN), "rw"),
    ]
    assert all("trans=virtio" in m.options and "version=9p2000.L" in m.options for m in mounts if m.fstype == "9p")


def test_root_s_secrets_are_masked_right_after_the_host_root_before_anything_else(tmp_path):
    """Issue 40: the guest saw the MOK private key, /etc/shadow and root's home through the host's root."""
    kernel = guest_kernel.GuestKernel(RELEASE, Path("/"), "host")
    secrets = ([Path("/root"), Path("/etc/pki/akmods/private")], [Path("/etc/shadow"), Path("/var/lib/dkms/mok.key")])
    view = view_of(tmp_path)
    _, mounts = hostroot_guest.layout(kernel, view, secrets=secrets)
    assert [m.line() for m in mounts[:5]] == [
        f"9p hostroot / {hostroot_guest.READ_ONLY}\n",
        "tmpfs tmpfs /root nosuid,nodev,mode=0700\n",  # empty; writable, as a home is
        "tmpfs tmpfs /etc/pki/akmods/private ro,mode=0700\n",  # empty and read-only
        "none /hidden /etc/shadow bind\n",  # the initramfs's empty file, bound over the host's
        "none /hidden /var/lib/dkms/mok.key bind\n",
    ]
    with pytest.raises(HostError, match="cannot hide /root/a b"):
        hostroot_guest.layout(kernel, view, secrets=([Path("/root/a b")], []))


def test_what_is_hidden_on_this_host_is_roots_home_the_shadow_files_and_the_signing_keys():
    folders, files = hostroot_guest.hidden()
    assert Path("/root") in folders
    assert {Path("/etc/shadow"), Path("/etc/gshadow")} <= set(files)  # on every Debian
    # host/platforms.toml's key_pairs, as documented there: each private key that exists on this host
    for key in ("/var/lib/dkms/mok.key", "/var/lib/shim-signed/mok/MOK.priv"):
        assert (Path(key) in files) == Path(key).is_file()
    assert (Path("/etc/pki/akmods/private") in folders) == Path("/etc/pki/akmods/private").is_dir()
    assert not [f for f in files if "mok.pub" in str(f) or f.suffix == ".der"]  # certificates stay visible


def test_an_installed_kernel_keeps_the_hosts_own_lib_modules(tmp_path):
    kernel = guest_kernel.GuestKernel(RELEASE, Path("/"), "host")
    shares, mounts = hostroot_guest.layout(kernel, view_of(tmp_path))
    assert [s.tag for s in shares] == ["hostroot", "map0"]  # the masks are mounts in the guest, not shares
    assert not [m for m in mounts if str(m.path).startswith("/lib/modules")]


def test_a_guest_path_the_mount_table_cannot_carry_is_refused_with_what_to_do(tmp_path):
    kernel = guest_kernel.GuestKernel(RELEASE, Path("/"), "host")
    view = view_of(tmp_path)
    view.show(tmp_path / "a b")
    with pytest.raises(HostError, match=r"cannot mount at .*a b"):
        hostroot_guest.layout(kernel, view)


def test_the_qemu_line_exports_each_share_as_its_own_9p_device(tmp_path):
    shares = [hostroot_guest.Share("hostroot", Path("/")), hostroot_guest.Share("map1", Path("/tmp/x,y"), True)]
    image, initramfs = tmp_path / "vmlinuz", tmp_path / "initramfs.cpio"
    argv = hostroot_guest.qemu_argv("/usr/bin/qemu-system-x86_64", image, initramfs, "tcg", shares)
    assert argv[argv.index("-machine") + 1] == "q35,accel=tcg" and argv[argv.index("-cpu") + 1] == "max"
    assert argv[argv.index("-initrd") + 1] == str(initramfs) and "-nodefaults" in argv
    fsdevs = [argv[i + 1] for i, arg in enumerate(argv) if arg == "-fsdev"]
    assert fsdevs == [
        "local,id=share0,path=/,security_model=none,multidevs=remap,readonly=on",
        "local,id=share1,path=/tmp/x,,y,security_model=none,multidevs=remap",  # QEMU's escaped comma
    ]
    devices = [argv[i + 1] for i, arg in enumerate(argv) if arg == "-device"]
    assert devices == ["virtio-9p-pci,fsdev=share0,mount_tag=hostroot", "virtio-9p-pci,fsdev=share1,mount_tag=map1"]
    kvm = hostroot_guest.qemu_argv("/usr/bin/qemu-system-x86_64", image, initramfs, "kvm", shares)
    assert kvm[kvm.index("-cpu") + 1] == "host,topoext=on"


def test_the_emulated_run_takes_the_host_root_guest_and_a_run_with_a_device_virtme_ng(tmp_path):
    assert engine.EMULATED_GUEST == hostroot_guest.NAME and engine.PASSTHROUGH_GUEST == "virtme-ng"
    assert sorted(guest_registry.GUESTS) == ["host-root", "qemu", "virtme-ng"]
    kernel = guest_kernel.GuestKernel(RELEASE, Path("/"), "host")
    view = view_of(tmp_path)
    vm = hostroot_guest.HostRootGuest("/usr/bin/qemu-system-x86_64")
    with pytest.raises(ValueError, match="no passthrough"):
        vm.boot(guest.GuestRequest(kernel, view.run, tmp_path / "c", "tcg", 1, ("0000:01:00.0",), "true", view))


def test_the_init_mounts_the_table_in_order_and_powers_off_whatever_happens():
    """The init script is the guest's whole init: it reads the files build_initramfs writes."""
    init = hostroot_guest.init_script().read_text()
    assert init.startswith("#!/bin/busybox sh\n")
    for name in ("/modules/order", "/mounts", "/command"):
        assert f"< {name}" in init
    assert init.rstrip().endswith('stop "powering off"') and "poweroff -f" in init
    assert 'say "the host\'s root is mounted"' in init  # the stage the host watches for
    assert hostroot_guest.STAGES[1][0].search("rdna1-kmgr-guest: the host's root is mounted")


@pytest.mark.vm
def test_a_real_guest_reads_nothing_of_roots_secrets(headers_61, tmp_path):
    """One TCG boot of Debian's 6.1 kernel: the guest's command tries to read what hidden() names (the shadow
    files, the signing keys, root's home) and writes what it saw into the run folder."""
    from conftest import _using_test_cache

    with _using_test_cache():
        kernel = guest_kernel.locate(headers_61, fetch=True)
    view = view_of(tmp_path)
    folders, files = hostroot_guest.hidden()
    out = guest_view.GUEST_RUN / "seen"
    command = " ; ".join(
        [f"echo {f} $(wc -c < {f}) >> {out}" for f in files]
        + [f"echo {d} $(ls -A {d} | wc -l) >> {out}" for d in folders]
    )
    vm = hostroot_guest.find()
    run = vm.boot(guest.GuestRequest(kernel, view.run, tmp_path / "console", "tcg", 240, command=command, view=view))
    console = (tmp_path / "console").read_text(errors="replace")
    assert "rdna1-kmgr-guest: the command ended with exit code 0" in console, console[-3000:]
    seen = dict(line.split() for line in (view.run / "seen").read_text().splitlines())
    assert seen == {str(p): "0" for p in [*files, *folders]}  # every file empty, every folder empty
    assert Path("/etc/shadow").stat().st_size > 0 and any(Path("/root").iterdir())  # on the host they are not
    del run
