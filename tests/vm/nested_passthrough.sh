#!/bin/bash
# The outer guest's side of test_passthrough_nested.py. It runs as root inside a virtme-ng guest whose QEMU
# has an emulated IOMMU (intel-iommu, caching mode) and two harmless devices: QEMU's `edu` (1234:11e8, no
# driver) at 00:1d.0 and a virtio-rng (bound to virtio-pci) at 00:1e.0. Scenarios run one after another
# in this one boot (each outer boot costs a minute or more under TCG); every fact the test asserts is
# written to files in OUT, the folder shared with the host.
#
#   nested_passthrough.sh OUT RDNA1_KMGR INNER_TIMEOUT CACHE
#
# CACHE is the cache holding the guest's own kernel: the inner guest boots it too (the guest's
# environment is its own, so the host's RDNA1_KMGR_* variables do not reach it).
set -u
OUT=$1 KMGR=$2 INNER_TIMEOUT=$3
exec >"$OUT/script.log" 2>&1
export RDNA1_KMGR_CACHE=$4 RDNA1_KMGR_LOG="$OUT/log" RDNA1_KMGR_STATE=/run/rdna1-kmgr-state
EDU=0000:00:1d.0 RNG=0000:00:1e.0
JOURNAL=$RDNA1_KMGR_STATE/vfio

say() { echo "[$(cut -d' ' -f1 /proc/uptime)] $*"; }
# driver (or "none") and driver_override of a device, on one line.
state() {
    local drv=none
    [ -L "/sys/bus/pci/devices/$1/driver" ] && drv=$(basename "$(readlink "/sys/bus/pci/devices/$1/driver")")
    echo "$drv $(cat "/sys/bus/pci/devices/$1/driver_override")"
}
# The inner QEMU that has $1 passed through, if one runs.
inner_qemu() { pgrep -f "vfio-pci,host=$1" | head -n1; }
wait_inner_qemu() {
    for _ in $(seq 1 600); do [ -n "$(inner_qemu "$1")" ] && return 0; sleep 0.5; done
    return 1
}
# Samples the device's driver every half second while a run goes on: proof from outside the tool.
sample() { while kill -0 "$2" 2>/dev/null; do state "$1" >>"$3"; sleep 0.5; done; }

# No interrupt remapping under TCG (intremap=off): vfio_iommu_type1 must be told to go on without it.
modprobe vfio_iommu_type1 allow_unsafe_interrupts=1 || say "modprobe vfio_iommu_type1 failed"
ulimit -l unlimited
say "devices: edu $(state $EDU), rng $(state $RNG)"
ls /sys/kernel/iommu_groups >"$OUT/groups"

say "0: refusal on a real sysfs (edu is no RDNA1 GPU: vm-test gpu, not vm-test plumbing)"
state $EDU >"$OUT/refused.before"
"$KMGR" vm-test gpu $EDU >"$OUT/refused.out" 2>"$OUT/refused.err"; echo $? >"$OUT/refused.rc"
state $EDU >"$OUT/refused.after"

say "1: plumbing-only with edu, to the end"
state $EDU >"$OUT/pass.before"
"$KMGR" vm-test plumbing $EDU --json --timeout "$INNER_TIMEOUT" >"$OUT/pass.json" 2>"$OUT/pass.err" &
pid=$!
sample $EDU $pid "$OUT/pass.during"
wait $pid; echo $? >"$OUT/pass.rc"
state $EDU >"$OUT/pass.after"
ls "$JOURNAL" >"$OUT/pass.journal" 2>/dev/null
say "1 done: rc $(cat "$OUT/pass.rc")"

say "2: the tool SIGKILLed while the inner guest runs, then vm-test restore"
"$KMGR" vm-test plumbing $EDU --json --accel tcg --timeout "$INNER_TIMEOUT" >"$OUT/killed.json" 2>"$OUT/killed.err" &
pid=$!
if wait_inner_qemu $EDU; then
    sleep 3  # the inner QEMU has opened the group by now
    kill -KILL $pid
    wait $pid; echo $? >"$OUT/killed.rc"
    state $EDU >"$OUT/killed.state"
    ls "$JOURNAL" >"$OUT/killed.journal"
    inner_qemu $EDU >"$OUT/killed.qemu"
    "$KMGR" vm-test restore --json >"$OUT/restore.json" 2>"$OUT/restore.err"; echo $? >"$OUT/restore.rc"
    state $EDU >"$OUT/restore.after"
    ls "$JOURNAL" >"$OUT/restore.journal" 2>/dev/null
    inner_qemu $EDU >"$OUT/restore.qemu"
    "$KMGR" vm-test restore --json >"$OUT/restore2.json" 2>"$OUT/restore2.err"; echo $? >"$OUT/restore2.rc"
else
    echo "the inner QEMU never started" >"$OUT/killed.err"
fi
say "2 done"

say "3: a device with a driver (virtio-rng on virtio-pci); the step after the bind fails (hard timeout)"
state $RNG >"$OUT/timeout.before"
"$KMGR" vm-test plumbing $RNG --json --accel tcg --timeout 2 >"$OUT/timeout.json" 2>"$OUT/timeout.err" &
pid=$!
sample $RNG $pid "$OUT/timeout.during"
wait $pid; echo $? >"$OUT/timeout.rc"
state $RNG >"$OUT/timeout.after"
ls "$JOURNAL" >"$OUT/timeout.journal" 2>/dev/null
say "3 done"

say "4: SIGTERM while the inner guest runs"
"$KMGR" vm-test plumbing $RNG --json --accel tcg --timeout "$INNER_TIMEOUT" >"$OUT/term.json" 2>"$OUT/term.err" &
pid=$!
if wait_inner_qemu $RNG; then
    state $RNG >"$OUT/term.during"
    kill -TERM $pid
    wait $pid; echo $? >"$OUT/term.rc"
    state $RNG >"$OUT/term.after"
    ls "$JOURNAL" >"$OUT/term.journal" 2>/dev/null
    inner_qemu $RNG >"$OUT/term.qemu"
fi
say "4 done"
echo finished >"$OUT/finished"
