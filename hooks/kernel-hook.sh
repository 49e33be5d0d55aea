#!/bin/sh
# rdna1-kmgr's kernel hook, placed by install.sh (`rdna1-kmgr hooks install`) in /etc/kernel/postinst.d,
# /etc/kernel/header_postinst.d and /etc/kernel/postrm.d. The kernel packages run it inside dpkg with the
# kernel release as $1, so it never builds here and never calls apt or dpkg: for an installed kernel it only
# notes "pending KREL" (apt's DPkg::Post-Invoke hook or rdna1-kmgr-follow.service at the next boot does the
# work once dpkg is done); for a removed kernel it drops that kernel's build, journal and records.
# It does nothing until the owner has installed a patched module for some kernel, and never fails dpkg.
version=${1:-}
cli=@CLI@
[ -n "$version" ] && [ -x "$cli" ] || exit 0
case "$0" in
    */postrm.d/*) "$cli" follow removed "$version" --hook || true ;;
    *) "$cli" follow defer "$version" --hook || true ;;
esac
exit 0
