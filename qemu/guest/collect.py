"""Guest side of `rdna1-kmgr vm-test`: runs as root inside the VM, loads the module, records what happened.

It only collects facts; the host judges them (rdna1_kmgr/verdict.py), so every rule of the verdict is
tested on the host against canned results and this script stays small. Standard library only: it runs
under the host's own Python, seen read-only through the VM's 9p root, with `-I`.

    python3 -I collect.py RUNDIR

RUNDIR is shared read-write with the host. In: plan.json (the module path, its dependencies, the
parameters of each load). Out: result.json, rewritten after every step so that a crash or a hard timeout
still leaves what was seen up to then. Each step logs a stage line to the kernel log, which the host
follows on the console to show progress.
"""

import errno
import json
import os
import subprocess
import sys
import time


class KernelLog:
    """The kernel log records that arrive after this object is made, read from /dev/kmsg."""

    def __init__(self):
        self.fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
        os.lseek(self.fd, 0, os.SEEK_END)

    def new_lines(self) -> list:
        lines = []
        while True:
            try:
                record = os.read(self.fd, 16384).decode(errors="replace")
            except BlockingIOError:
                return lines
            except OSError as err:
                if err.errno == errno.EPIPE:  # records were overwritten before we read them
                    lines.append("rdna1-kmgr: kernel log records lost (ring buffer overrun)")
                    continue
                raise
            header, _, text = record.partition(";")
            fields = header.split(",")
            usec = int(fields[2]) if len(fields) > 2 and fields[2].isdigit() else 0
            # The message is the first line; the lines after it are KEY=value metadata.
            message = text.split("\n", 1)[0].encode().decode("unicode_escape", errors="replace")
            lines.append(f"[{usec // 1000000:5d}.{usec % 1000000:06d}] {message}")

    @staticmethod
    def stage(name: str) -> None:
        with open("/dev/kmsg", "w") as kmsg:
            kmsg.write(f"<5>rdna1-kmgr: stage {name}\n")


def run(argv: list, timeout: float) -> dict:
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
        return {"argv": argv, "rc": proc.returncode, "output": proc.stdout[-4000:]}
    except subprocess.TimeoutExpired:
        return {"argv": argv, "rc": None, "output": f"timed out after {timeout} s"}
    except OSError as err:
        return {"argv": argv, "rc": None, "output": f"cannot run {argv[0]}: {err}"}


def read_text(path: str):
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return None


def module_state(name: str, parameters: list) -> dict:
    """What the running kernel says about the loaded module."""
    base = f"/sys/module/{name}"
    state = {
        "loaded": os.path.isdir(base),
        "initstate": read_text(f"{base}/initstate"),
        "srcversion": read_text(f"{base}/srcversion"),
        "taint": read_text(f"{base}/taint"),
        "parameters": {p: read_text(f"{base}/parameters/{p}") for p in parameters},
        "build_id_note": None,
        "tainted": int(read_text("/proc/sys/kernel/tainted") or 0),
    }
    try:
        with open(f"{base}/notes/.note.gnu.build-id", "rb") as handle:
            state["build_id_note"] = handle.read().hex()
    except OSError:
        pass
    return state


def main(rundir: str) -> int:
    with open(os.path.join(rundir, "plan.json")) as handle:
        plan = json.load(handle)
    name, module, timeout = plan["name"], plan["module"], plan.get("command_timeout", 300)
    log = KernelLog()
    result = {
        "finished": False,
        "kernel": os.uname().release,
        "tainted_before": int(read_text("/proc/sys/kernel/tainted") or 0),
        "preloaded": os.path.isdir(f"/sys/module/{name}"),
        "steps": [],
    }

    def save():
        tmp = os.path.join(rundir, "result.json.tmp")
        with open(tmp, "w") as out:
            json.dump(result, out, indent=1)
        os.replace(tmp, os.path.join(rundir, "result.json"))

    def step(label: str, argv: list, after=None) -> dict:
        log.stage(label)
        entry = {"name": label, **run(argv, timeout)}
        if after is not None:
            entry["after"] = after()
        entry["log"] = log.new_lines()
        result["steps"].append(entry)
        save()
        return entry

    save()
    # The dependencies come from the distro's tree of the guest kernel, like modprobe would load them;
    # one modprobe for all of them (a process start costs a lot under TCG).
    if plan["depends"]:
        step("depends", ["modprobe", "-a", *plan["depends"]])
    for load in plan["loads"]:
        state = lambda: module_state(name, plan["read_parameters"])  # noqa: E731
        # By path: the module under test, never whatever modprobe would find in /lib/modules.
        loaded = step(f"insmod {load['label']}", ["insmod", module, *load["params"]], after=state)
        if loaded["rc"] == 0:
            step(f"rmmod {load['label']}", ["rmmod", name], after=state)
    time.sleep(0.5)  # late, asynchronous messages (a deferred WARN) still count
    result["tail_log"] = log.new_lines()
    result["finished"] = True
    save()
    log.stage("done")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
