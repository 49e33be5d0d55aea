"""Stage 6, install: the verified module put in place for a kernel, journaled, and taken back exactly.

Takes a built module with a passing verdict. Leaves the installed module, depmod's index, modprobe.d and the
regenerated initramfs, each change recorded (with a backup first) in /var/lib/rdna1-kmgr/journal/<kernel>/;
rollback replays that journal backwards.
"""
