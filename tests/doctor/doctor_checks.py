"""What the doctor tests share: an RX 5600 XT machine as fixture trees (sysfs_fixtures.py) with its owner, doctor run
on it as --json gives it, and the queue check's machine (a 6.12 kernel, its KFD node, a ROCm after rocm-systems
#6125). A helper module, not a test module: the doctor tests import it by name."""

import os
import struct
from pathlib import Path

from sysfs_fixtures import rx5600xt
from therock_fixtures import therock_venv

from rdna1_kmgr.core.output import to_json
from rdna1_kmgr.doctor import code_objects, report

OWNER_UID = 1000
# Offload-bundle entry ids and a bundle made by clang's offload-bundler format (test_code_objects.py reads them)
GFX1030 = "hipv4-amdgcn-amd-amdhsa--gfx1030"
HOST = "host-x86_64-unknown-linux-gnu-"


def bundle(*ids: str, payload: bytes = b"\0" * 64) -> bytes:
    header_size = 32 + sum(24 + len(i) for i in ids)
    out = bytearray(code_objects.BUNDLE_MAGIC + struct.pack("<Q", len(ids)))
    for n, entry in enumerate(ids):
        out += struct.pack("<QQQ", header_size + n * len(payload), len(payload), len(entry)) + entry.encode()
    for _ in ids:
        out += payload
    return bytes(out)


def board_root(tmp_path: Path, owner_groups=("render", "video")):
    """An RX 5600 XT on amdgpu with its KFD node (gfx1010, render minor 128) and device nodes 0660 owned by
    the group `render` (given this process's gid so the mode bits decide, as on a real system)."""
    tree = rx5600xt(tmp_path / "root")
    gid = os.getgid()
    tree.users(("owner", OWNER_UID, list(owner_groups)), ("guest", 1001, []), groups={"render": gid, "video": 44})
    tree.kfd_node(0).kfd_node(1, gfx_target_version=100100, simd_count=36, render_minor=128, heap_types=(1,))
    tree.file("dev/kfd", "", 0o660).file("dev/dri/renderD128", "", 0o660)
    return tree


def by_check(result: dict, check: str) -> list[dict]:
    return [f for f in result["findings"] if f["check"] == check]


def run(tree, user="owner", pythons=()):
    return to_json(report.run(tree.root, list(pythons), user))  # as --json gives it


# The RX 5600 XT's KFD node's capability without HSA_CAP_SVMAPI_SUPPORTED, as on Debian's 6.12 (no
# CONFIG_DEVICE_PRIVATE): watch points (0x80, 4 of them: 0x400), doorbell type 2.0 (0x2000), AQL queue double
# map (0x4000), bits of include/uapi/linux/kfd_sysfs.h: 0x6480.
NO_SVM_CAPABILITY = 25728


# The RX 5600 XT's node as Debian's 6.12.95 prints it: 36 CUs of 2 SIMDs (simd_count 72), 20 waves a SIMD, and
# (upstream 8fc2796dea6f) KFD's own sizes, worked out by hand from kfd_queue.c's kfd_queue_ctx_save_restore_size
# for 32 waves a CU: ctl_stack_size ALIGN(40 + 12 * 1152 + 8, 4096) = 16384, cwsr_size 16384 + 36 * 0x55000 =
# 12550144.
RX5600XT_PRINTED = dict(simd_per_cu=2, max_waves_per_simd=20, cwsr_size=12550144, ctl_stack_size=16384)


def queue_root(tmp_path, kernel="6.12.95+deb12-amd64", rocm="7.13.0a20260601", mask=None):
    tree = board_root(tmp_path).kernel(kernel)
    tree.kfd_node(1, 100100, 72, 128, (1,), capability=NO_SVM_CAPABILITY, **RX5600XT_PRINTED)
    if rocm:
        therock_venv(tmp_path / "root/home/owner/venv", rocm=rocm, torch="2.11.0+rocm" + rocm)
    if mask is not None:
        tree.file("sys/module/amdgpu/parameters/rdna1_quirks", f"{mask}\n")
    return tree
