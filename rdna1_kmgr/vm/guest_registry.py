"""The guests by name (guest.py is their interface): a run picks one, and `find` checks its programs are there."""

from __future__ import annotations

from collections.abc import Callable

from rdna1_kmgr.vm import hostroot_guest, plumbing_guest, virtme_guest
from rdna1_kmgr.vm.guest import Guest

GUESTS: dict[str, Callable[[], Guest]] = {
    hostroot_guest.NAME: hostroot_guest.find,  # the host's own OS, no init system: the emulated module test
    virtme_guest.NAME: virtme_guest.find,  # the host's own OS with udev: runs with a device passed, the matrix
    plumbing_guest.NAME: plumbing_guest.find,  # a busybox initramfs that lists PCI devices: plumbing-only
}


def find(name: str) -> Guest:
    """The guest called `name`, its programs found (HostError with what to install when one is missing)."""
    try:
        found = GUESTS[name]
    except KeyError:
        raise ValueError(f"no guest {name!r}; known: {', '.join(GUESTS)}") from None
    return found()
