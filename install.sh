#!/bin/sh
# Install rdna1-kmgr on Debian or Ubuntu: the system packages it drives (DKMS, kbuild's tools, kmod,
# QEMU), a Python environment in /opt/rdna1-kmgr, the command /usr/local/bin/rdna1-kmgr, its man page and shell
# completion, and the kernel hooks that make the patched driver follow kernel upgrades (`rdna1-kmgr hooks remove`
# takes them away).
# Run it as root (a root shell: nothing here calls sudo, which a fresh Debian may not have), or with sudo:
#   ./install.sh                the tool
#   ./install.sh --test         the tool, plus what its test suite needs
set -eu

here=$(cd "$(dirname "$0")" && pwd)
prefix=${RDNA1_KMGR_PREFIX:-/opt/rdna1-kmgr}  # where the Python environment goes
# where the command goes: on root's PATH, sudo's secure_path and a normal user's PATH (Debian leaves the sbin
# folders off the last, and `rdna1-kmgr install --dry-run` needs no root)
bindir=${RDNA1_KMGR_BIN:-/usr/local/bin}
with_tests=no
case "${1:-}" in
    "") ;;
    --test) with_tests=yes ;;
    *) echo "install.sh: unknown option '$1': use no option, or --test" >&2; exit 2 ;;
esac
if [ "$(id -u)" != 0 ]; then
    echo "install.sh: must run as root: run it from a root shell, or as sudo ./install.sh" >&2
    exit 1
fi
. /etc/os-release
case " ${ID:-} ${ID_LIKE:-} " in
    *" debian "*|*" ubuntu "*) ;;
    *) echo "install.sh: only Debian and Ubuntu are supported here (found ${ID:-unknown})" >&2; exit 1 ;;
esac

export DEBIAN_FRONTEND=noninteractive
packages="python3 python3-venv python3-pip ca-certificates
    dkms kmod patch xz-utils openssl mokutil make gcc bc bison flex libelf-dev libssl-dev dwarves
    initramfs-tools cpio file qemu-system-x86 busybox-static pciutils ccache man-db bash-completion"
# The tests also build apt repositories (apt-utils), SRPMs (rpm, rpm2cpio) and a throwaway dracut root
# (debootstrap, also the whole-system image of tests/wholesystem.py; dracut itself is never installed on the host: it would replace initramfs-tools),
# boot that image through UEFI with Secure Boot (ovmf's firmware with Microsoft's keys; dosfstools for its EFI
# system partition), run the tool as a normal user with sudo (nothing here needs sudo:
# tests/test_without_sudo.py hides it), and snapshot the power-cut test's disks as reflink copies on XFS
# (xfsprogs: tests/power_cut.py).
[ "$with_tests" = yes ] && packages="$packages apt-utils rpm rpm2cpio debootstrap ovmf dosfstools sudo xfsprogs"
echo "install.sh: installing system packages"
# A fresh machine often runs its first unattended upgrade just then: wait for dpkg's lock instead of failing.
apt-get update -q
# shellcheck disable=SC2086 # one word a package
apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=600 $packages

echo "install.sh: installing rdna1-kmgr into $prefix"
[ -x "$prefix/bin/python" ] || /usr/bin/python3 -m venv "$prefix"
# From a copy: setuptools writes build/ and *.egg-info into what it builds, which, under sudo, would leave
# root-owned folders in the user's checkout.
copy=$(mktemp -d)
trap 'rm -rf "$copy"' EXIT
tar -C "$here" --exclude=./.git --exclude=./build -cf - . | tar -C "$copy" -xf -
spec=$copy
[ "$with_tests" = yes ] && spec="$copy[test]"
"$prefix/bin/pip" install -q --disable-pip-version-check --upgrade "$spec"
# The command runs isolated, `python -I`: root never reads PYTHONPATH, PYTHONHOME or a user's site-packages, and
# the hooks and units, which call this same file, neither (issue 49; docs/security.md).
sed -i '1s|^\(#!.*/python[0-9.]*\)$|\1 -I|' "$prefix/bin/rdna1-kmgr"
mkdir -p "$bindir"
ln -sf "$prefix/bin/rdna1-kmgr" "$bindir/rdna1-kmgr"
# Earlier releases put the command in /usr/local/sbin: that link goes, so one command answers to the name.
old=/usr/local/sbin/rdna1-kmgr
if [ "$bindir" != /usr/local/sbin ] && [ -L "$old" ] && [ "$(readlink "$old")" = "$prefix/bin/rdna1-kmgr" ]; then
    rm -f "$old"
fi
# The man page (generated from the commands' own definitions: docs/reference.md says how) and click's own shell
# completion, each where its program looks for a local administrator's files: bash-completion and zsh under
# /usr/local/share, fish in /etc/fish/completions (fish reads /usr/local/share only when XDG_DATA_DIRS names it).
# Uninstall: remove these four files (docs/reference.md, "Files and paths").
echo "install.sh: installing the man page and shell completion"
install -D -m 0644 "$here/docs/rdna1-kmgr.8" /usr/local/share/man/man8/rdna1-kmgr.8
for shell_file in bash:/usr/local/share/bash-completion/completions/rdna1-kmgr \
    zsh:/usr/local/share/zsh/site-functions/_rdna1-kmgr fish:/etc/fish/completions/rdna1-kmgr.fish; do
    file=${shell_file#*:}
    mkdir -p "$(dirname "$file")"
    _RDNA1_KMGR_COMPLETE=${shell_file%%:*}_source "$prefix/bin/rdna1-kmgr" >"$file.new"
    chmod 0644 "$file.new" && mv -f "$file.new" "$file"
done
# Where every command logs the programs it ran (core/command_log.py writes only where this folder exists).
install -d -m 0700 /var/log/rdna1-kmgr && chmod 0700 /var/log/rdna1-kmgr  # root's logs (issue 40)
# Kernel upgrades: /etc/kernel/{postinst,header_postinst,postrm}.d, apt's DPkg::Post-Invoke and a boot unit,
# all calling this installation's `rdna1-kmgr follow`. They do nothing until the owner installs a module.
echo "install.sh: placing the kernel hooks"
"$prefix/bin/rdna1-kmgr" hooks install
echo "install.sh: done: $("$bindir/rdna1-kmgr" --version) ($bindir/rdna1-kmgr)"
# The README's one path: `build` says first whether this kernel needs a change, then doctor reads the stack
echo "next: \`rdna1-kmgr build\` (it says first whether your kernel needs a change), then \`rdna1-kmgr doctor\` as yourself"
