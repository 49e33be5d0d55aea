"""rdna1_kmgr.vm.guest_kernel.image_packages: which packages hold a bootable kernel, per distribution."""

from rdna1_kmgr.vm import guest_kernel


def test_ubuntu_guest_kernel_comes_from_its_split_packages():
    assert guest_kernel.image_packages("6.8.0-48-generic", "ubuntu") == [
        "linux-image-unsigned-6.8.0-48-generic",
        "linux-modules-6.8.0-48-generic",
        "linux-modules-extra-6.8.0-48-generic",
    ]


def test_debian_guest_kernel_is_one_package():
    assert guest_kernel.image_packages("6.1.0-56-amd64", "debian") == ["linux-image-6.1.0-56-amd64"]
