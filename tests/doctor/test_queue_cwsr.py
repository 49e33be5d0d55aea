"""doctor's CWSR queue check decided by what triggers the failure: a BO-backed save area. Topology files are
written as KFD's node_show prints them (kfd_topology.c: `capability %u`, decimal), config lines as a kernel's
.config has them; the bit values come from include/uapi/linux/kfd_sysfs.h, libhsakmt's rules from rocm-systems'
queues.c (handle_concrete_asic), fmm.c (hsakmt_fmm_init_process_apertures) and openclose.c (HSA_USE_SVM)."""

import gzip

from doctor_checks import NO_SVM_CAPABILITY, RX5600XT_PRINTED, by_check, queue_root, run

from rdna1_kmgr.doctor import queue_cwsr

# The same node with HSA_CAP_SVMAPI_SUPPORTED (0x08000000) too: 0x08006480.
SVM_CAPABILITY = 134243456
NODE = (1, 100100, 72, 128, (1,))  # the RX 5600 XT's node: gfx1010, 72 SIMDs (36 CUs), renderD128, FB_PUBLIC
KERNEL = "6.12.95+deb12-amd64"
# Debian's 6.12 config (no device-private pages: CONFIG_HSA_AMD_SVM's dependency fails, so kconfig leaves it out)
# and a 7.x one with SVM.
NO_SVM_CONFIG = "CONFIG_HSA_AMD=y\n# CONFIG_DEVICE_PRIVATE is not set\nCONFIG_ZONE_DEVICE=y\n"
SVM_CONFIG = "CONFIG_HSA_AMD=y\nCONFIG_DEVICE_PRIVATE=y\nCONFIG_HSA_AMD_SVM=y\n"


def queue(tree) -> dict:
    found = by_check(run(tree), "queue")
    assert len(found) == 1, found
    return found[0]


def without_topology(tmp_path):
    tree = queue_root(tmp_path)
    for name in ("0", "1"):
        (tree.root / f"sys/class/kfd/kfd/topology/nodes/{name}/properties").unlink()
    return tree


def test_the_svm_capability_bit_means_not_affected_and_says_how_to_confirm(tmp_path):
    tree = queue_root(tmp_path).kfd_node(*NODE, **RX5600XT_PRINTED, capability=SVM_CAPABILITY)
    found = queue(tree)
    assert found["level"] == "ok"
    assert "not affected unless HSA_USE_SVM=0" in found["seen"] and "node 1 0x08006480" in found["seen"]
    assert "0x08000000" in found["why"] and "/sys/class/kfd/kfd/topology/nodes/N/properties" in found["why"]
    assert "--profile no-svm" in found["why"]
    assert found["facts"]["svm"]["gpu_capabilities"] == {"1": SVM_CAPABILITY}
    assert found["facts"]["svm"]["svm_api"] is True


def test_the_bit_clear_is_the_problem_with_the_fix(tmp_path):
    found = queue(queue_root(tmp_path))  # capability 0x6480: no SVM API
    assert found["level"] == "problem"
    assert "the CWSR area is a BO" in found["seen"] and "lacks HSA_CAP_SVMAPI_SUPPORTED" in found["seen"]
    assert "7.13.0a20260601" in found["seen"] and "EINVAL" in found["why"]
    assert found["todo"].startswith("1. install rdna1-kmgr's build, which has cwsr-size")
    assert found["facts"]["svm"]["svm_api"] is False


def test_one_gpu_node_without_the_bit_turns_svm_off_for_all_and_cpu_nodes_do_not_count(tmp_path):
    # libhsakmt ANDs the bit over the GPU nodes only; the CPU node 0 (no simd) has capability 0 here.
    tree = queue_root(tmp_path).kfd_node(0, capability=0).kfd_node(*NODE, **RX5600XT_PRINTED, capability=SVM_CAPABILITY)
    assert queue(tree)["level"] == "ok"
    tree.kfd_node(2, 100100, 72, 129, (1,), capability=NO_SVM_CAPABILITY, **RX5600XT_PRINTED)
    assert queue(tree)["level"] == "problem"


def test_hsa_use_svm_0_in_bashrc_with_svm_on_is_the_problem_naming_the_line(tmp_path):
    tree = queue_root(tmp_path).kfd_node(*NODE, **RX5600XT_PRINTED, capability=SVM_CAPABILITY)
    tree.file("home/owner/.bashrc", "alias ll='ls -l'\nexport HSA_USE_SVM=0\n")
    found = queue(tree)
    assert found["level"] == "problem"
    assert "HSA_USE_SVM=0 in /home/owner/.bashrc:2" in found["seen"] and "a BO" in found["seen"]
    assert found["todo"].startswith("1. remove HSA_USE_SVM=0 (/home/owner/.bashrc:2)")
    assert "cwsr-size" in found["todo"]
    assert found["facts"]["hsa_use_svm"][0]["file"] == "/home/owner/.bashrc"


def test_only_exactly_0_turns_svm_off_and_a_later_line_wins(tmp_path):
    # openclose.c: !strcmp(HSA_USE_SVM, "0"); "false" leaves SVM on.
    tree = queue_root(tmp_path).kfd_node(*NODE, **RX5600XT_PRINTED, capability=SVM_CAPABILITY)
    tree.file("home/owner/.bashrc", "export HSA_USE_SVM=false\n")
    assert queue(tree)["level"] == "ok"
    # /etc/profile.d is read before the user's files: the last line read is the one in force
    tree.file("etc/profile.d/rocm.sh", "export HSA_USE_SVM=0\n").file("home/owner/.bashrc", "export HSA_USE_SVM=1\n")
    assert queue(tree)["level"] == "ok"
    tree.file("etc/profile.d/rocm.sh", "export HSA_USE_SVM=1\n").file("home/owner/.bashrc", "export HSA_USE_SVM=0\n")
    assert queue(tree)["level"] == "problem"


def test_no_topology_and_a_config_without_device_private_expects_the_bo(tmp_path):
    tree = without_topology(tmp_path).file(f"boot/config-{KERNEL}", NO_SVM_CONFIG)
    found = queue(tree)
    assert found["level"] == "problem"
    assert f"/boot/config-{KERNEL}: CONFIG_HSA_AMD_SVM=n, CONFIG_DEVICE_PRIVATE=n" in found["seen"]
    assert found["facts"]["svm"]["config"] == f"/boot/config-{KERNEL}"


def test_no_topology_and_proc_config_gz_with_svm_is_not_affected(tmp_path):
    tree = without_topology(tmp_path)
    (tree.root / "proc/config.gz").write_bytes(gzip.compress(SVM_CONFIG.encode()))
    found = queue(tree)
    # read from the config alone (KFD's topology would say what it registered): likely, a warning, never ok
    assert found["level"] == "warn" and found["seen"].startswith("likely KFD checks the CWSR size")
    assert "/proc/config.gz: CONFIG_HSA_AMD_SVM=y, CONFIG_DEVICE_PRIVATE=y" in found["seen"]
    (tree.root / "proc/config.gz").write_bytes(gzip.compress(NO_SVM_CONFIG.encode()))
    assert queue(tree)["level"] == "problem"


def test_the_topology_decides_over_the_config(tmp_path):
    # a config that says SVM, but KFD did not register device memory: the node's bit is what libhsakmt reads
    tree = queue_root(tmp_path).file(f"boot/config-{KERNEL}", SVM_CONFIG)
    assert queue(tree)["level"] == "problem"


def test_nothing_readable_is_a_warning_not_a_problem(tmp_path):
    found = queue(without_topology(tmp_path))
    assert found["level"] == "warn" and "whether the CWSR area is a BO cannot be told" in found["seen"]


def test_the_cwsr_size_bit_is_ok_whatever_the_backing(tmp_path):
    tree = queue_root(tmp_path, mask=0x10)
    found = queue(tree)
    assert found["level"] == "ok" and "has cwsr-size" in found["seen"]


def test_svm_facts_read_from_a_sysroot(tmp_path):
    tree = queue_root(tmp_path).file(f"boot/config-{KERNEL}", NO_SVM_CONFIG)
    facts = queue_cwsr.read_svm_facts(tree.root, KERNEL)
    assert facts.gpu_capabilities == ((1, NO_SVM_CAPABILITY),)
    assert facts.options == (("CONFIG_HSA_AMD_SVM", "n"), ("CONFIG_DEVICE_PRIVATE", "n"))
    assert (facts.topology_says, facts.config_says, facts.offered) == (False, False, False)
    bare = queue_cwsr.read_svm_facts(tmp_path / "empty", KERNEL)
    assert (bare.gpu_capabilities, bare.config, bare.offered) == ((), None, None)


# --- no board: what the kernel would do to one ---------------------------------------------------------------------


def without_board(tmp_path, release: str, config: str, mask: int | None) -> dict:
    """The note doctor gives on a machine with no RDNA1 board (a VM, a desktop before the board goes in)."""
    root = tmp_path / "root"
    (root / "boot").mkdir(parents=True)
    (root / f"boot/config-{release}").write_text(config)
    svm = queue_cwsr.read_svm_facts(root, release)
    (found,) = queue_cwsr.findings(False, release, root, mask, [], svm, [], [], None)
    return found.to_json()


def test_without_a_board_trixies_612_needs_cwsr_size_and_says_whether_the_loaded_build_has_it(tmp_path):
    stock = without_board(tmp_path / "a", "6.12.118+deb13-amd64", NO_SVM_CONFIG, None)
    assert stock["level"] == "info" and "no RDNA1 board here; kernel 6.12.118+deb13-amd64" in stock["seen"]
    assert "offers no SVM API" in stock["seen"] and "an RDNA1 board needs cwsr-size" in stock["seen"]
    assert "the loaded amdgpu is not an rdna1-kmgr build" in stock["seen"]
    patched = without_board(tmp_path / "b", "6.12.118+deb13-amd64", NO_SVM_CONFIG, 0x1E)
    assert "the loaded amdgpu carries cwsr-size, on (rdna1_quirks=0x1e)" in patched["seen"]
    off = without_board(tmp_path / "c", "6.12.118+deb13-amd64", NO_SVM_CONFIG, 0x0E)
    assert "with cwsr-size off (rdna1_quirks=0xe)" in off["seen"]


def test_without_a_board_a_kernel_with_svm_or_without_the_check_is_not_affected(tmp_path):
    svm = without_board(tmp_path / "a", "7.3.4+bpo-amd64", SVM_CONFIG, 0x0E)
    assert svm["level"] == "info" and "offers the SVM API" in svm["seen"] and "CONFIG_HSA_AMD_SVM=y" in svm["seen"]
    assert "not affected unless HSA_USE_SVM=0" in svm["seen"]
    old = without_board(tmp_path / "b", "6.1.0-56-amd64", NO_SVM_CONFIG, None)
    assert "does not check the CWSR buffer size" in old["seen"] and old["seen"].endswith("not affected")
