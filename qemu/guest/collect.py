"""Guest side of `rdna1-kmgr vm-test`: runs as root inside the VM, loads the module, records what happened.

It only collects facts; the host judges them (rdna1_kmgr/verdict.py), so every rule of the verdict is
tested on the host against canned results and this script stays small. Standard library only: it runs
under the host's own Python, seen read-only through the VM's 9p root, with `-I`.

    python3 -I collect.py RUNDIR

RUNDIR is shared read-write with the host. In: plan.json (the module path, its dependencies, the
parameters of each load; in a passthrough run, the GPU's vendor:device and the workload). Out: result.json,
rewritten after every step so that a crash or a hard timeout
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


def run(argv: list, timeout: float, env=None) -> dict:
    try:
        proc = subprocess.run(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout, env=env
        )
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


def read_properties(path: str) -> dict:
    """A KFD `properties` file: one `name value` pair per line, values are integers."""
    found = {}
    for line in (read_text(path) or "").splitlines():
        key, _, value = line.partition(" ")
        try:
            found[key] = int(value)
        except ValueError:
            found[key] = value
    return found


def kfd_nodes(base: str = "/sys/class/kfd/kfd/topology/nodes") -> list:
    """Every KFD topology node with its properties and its memory banks' properties."""
    nodes = []
    for name in sorted(os.listdir(base) if os.path.isdir(base) else [], key=lambda n: int(n) if n.isdigit() else -1):
        banks_dir = os.path.join(base, name, "mem_banks")
        banks = sorted(os.listdir(banks_dir)) if os.path.isdir(banks_dir) else []
        nodes.append(
            {
                "node": name,
                "properties": read_properties(os.path.join(base, name, "properties")),
                "mem_banks": [
                    {"bank": b, "properties": read_properties(os.path.join(banks_dir, b, "properties"))} for b in banks
                ],
            }
        )
    return nodes


def bar0_bytes(path: str):
    """The size of BAR 0 (the VRAM aperture of an AMD GPU) from sysfs `resource` ("start end flags" a line)."""
    first = (read_text(path) or "").splitlines()[:1]
    try:
        start, end = (int(v, 16) for v in first[0].split()[:2])
    except (IndexError, ValueError):
        return None
    return end - start + 1 if end > start else None


def pci_devices_with(vendor_device: str) -> list:
    """The guest's PCI devices with that vendor:device, and the driver each is bound to."""
    vendor, device = vendor_device.split(":")
    found = []
    base = "/sys/bus/pci/devices"
    for bdf in sorted(os.listdir(base)):
        ids = (read_text(f"{base}/{bdf}/vendor"), read_text(f"{base}/{bdf}/device"))
        if ids == (f"0x{vendor}", f"0x{device}"):
            link = f"{base}/{bdf}/driver"
            found.append(
                {
                    "bdf": bdf,
                    "driver": os.path.basename(os.readlink(link)) if os.path.islink(link) else None,
                    "bar0_bytes": bar0_bytes(f"{base}/{bdf}/resource"),
                }
            )
    return found


def gpu_facts(gpu: dict) -> dict:
    """While the module is loaded: which driver has the GPU, and what KFD made of it."""
    deadline = time.monotonic() + 10  # probe is synchronous in insmod; KFD's sysfs may trail it a little
    while True:
        devices = pci_devices_with(gpu["vendor_device"])
        nodes = kfd_nodes()
        if time.monotonic() > deadline or (devices and all(d["driver"] for d in devices) and len(nodes) > 1):
            return {"devices": devices, "kfd_nodes": nodes}
        time.sleep(0.5)


def run_workload(workload: dict, timeout: float, env=None) -> dict:
    """The workload script under the first Python that can run it (exit 3 with {"error"} means it cannot).
    `env`: the environment it runs in (the experiment's profile), this process's by default."""
    tried = []
    for python in workload["pythons"]:
        argv = [python, workload["script"], "--device", workload.get("device", "cuda"), *workload.get("args", [])]
        started = time.monotonic()
        outcome = run(argv, timeout, env)
        outcome["seconds"] = round(time.monotonic() - started, 2)
        report = None
        lines = [line for line in outcome["output"].splitlines() if line.startswith("{")]
        try:
            report = json.loads(lines[-1]) if lines else None
        except ValueError:
            pass
        outcome["report"] = report
        tried.append(outcome)
        if outcome["rc"] != 3:
            break
    return {"name": workload["name"], "runs": tried}


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
        if loaded["rc"] == 0 and plan.get("gpu") and load["label"] == plan["gpu"].get("on_load"):
            # Passthrough: the facts of the GPU while this load drives it, before it is unloaded.
            log.stage("gpu facts")
            result["gpu"] = gpu_facts(plan["gpu"])
            save()
            if plan["gpu"].get("workload"):
                log.stage(f"workload {plan['gpu']['workload']['name']}")
                result["gpu"]["workload"] = run_workload(plan["gpu"]["workload"], timeout)
            result["gpu"]["log"] = log.new_lines()
            save()
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
