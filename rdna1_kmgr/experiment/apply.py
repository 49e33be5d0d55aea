"""`rdna1-kmgr experiment apply`: install the last experiment's answer through the journaled paths: a profile
(install/user_profile.py); a kernel cell's quirk mask (`install --quirks`) or stock parameter
(install/kernel_parameters.py). A backend setting is a line of the owner's program, said, not installed."""

from __future__ import annotations

from dataclasses import dataclass

from rdna1_kmgr.core.errors import UsageError
from rdna1_kmgr.core.output import optional
from rdna1_kmgr.doctor.kfd_access import invoking_home
from rdna1_kmgr.experiment import answer
from rdna1_kmgr.install import kernel_parameters, module_install, user_profile
from rdna1_kmgr.install.install_result import InstallResult
from rdna1_kmgr.install.profile_result import ProfileInstalled
from rdna1_kmgr.install.target_root import TargetRoot
from rdna1_kmgr.render.quirk_mask import QuirkMask
from rdna1_kmgr.source import target_kernel
from rdna1_kmgr.userspace import profiles as profile_data
from rdna1_kmgr.vm import cell_outcomes
from rdna1_kmgr.vm.experiment import experiments_dir

KERNEL_LATEST = "kernel-latest.json"  # experiment/kernel_run.py writes it when the kernel cells end


@dataclass(frozen=True)
class Applied:
    """`experiment apply`: the cell applied, the profile installed for it (user_profile.install's result; None
    when the cell needs none) and the backend's line for the owner's program."""

    cell: str
    dry_run: bool
    profile: ProfileInstalled | None
    code: str | None

    def profile_lines(self) -> list[str]:
        """The profile's plan (dry run) or what its install did."""
        return list(self.profile.lines()) if self.profile else []


@dataclass(frozen=True)
class KernelApplied:
    """`experiment apply --kernel`: a quirk mask through install (install), or a stock parameter on every boot's
    command line (parameters); each their flow's result."""

    kernel_cell: str
    parameter: str
    dry_run: bool
    install: InstallResult | None = optional()
    parameters: dict | None = optional()

    def lines(self) -> list[str]:
        """The plan (dry run), or what was done and what the next boot brings."""
        if self.install is not None:
            return list(self.install.plan if self.dry_run else self.install.next_boot)
        done = self.parameters or {}
        return done.get("plan", []) if self.dry_run else done.get("done", [])


def apply(cell_id: str | None = None, dry_run: bool = False) -> Applied:
    record = answer.read_latest()
    if record is None:
        raise UsageError("no experiment has run on this machine", "run `rdna1-kmgr experiment` first")
    if cell_id is None:
        chosen = record.get("recommended")
        if chosen is None and record.get("dead_end"):
            raise UsageError(f"the last experiment tried no setting: {record['dead_end']}", "run doctor first")
        if chosen is None:
            raise UsageError("the last experiment found no passing cell to apply", f"see {record.get('html')}")
    else:
        chosen = next((c for c in record["cells"] if c["cell"] == cell_id), None)
        if chosen is None or chosen["outcome"] != "pass":
            passing = ", ".join(c["cell"] for c in record["cells"] if c["outcome"] == "pass") or "none"
            raise UsageError(f"cell {cell_id!r} did not pass in the last experiment", f"passing cells: {passing}")
    profile = profile_data.get(chosen["profile"])
    backend = cell_outcomes.BACKENDS[chosen["backend"]]
    installed = None
    if not profile.changes_nothing:
        home = invoking_home(TargetRoot.from_env().path)
        installed = user_profile.install(profile.name, dry_run=dry_run, home=home)
    return Applied(chosen["cell"], dry_run, installed, backend.code or None)


def apply_kernel(cell_name: str | None = None, dry_run: bool = False) -> KernelApplied:
    """The kernel axis' answer: a quirk mask through `install --quirks` (the installed build, that mask in
    modprobe.d, the boot guard's trial), a stock parameter on every boot's command line (journaled)."""
    record = answer.read_json(experiments_dir() / KERNEL_LATEST)
    if record is None:
        raise UsageError("no kernel cells have run on this machine", "run `rdna1-kmgr experiment kernel` first")
    cells = {c["name"]: c for c in record["plan"]["kernel_cells"]}
    passing = [r for r in record["rows"] if r["outcome"] == "pass"]
    if cell_name is None:
        chosen = record.get("recommended_kernel_cell")
        if chosen is None:
            raise UsageError("the last kernel cells found no change that passes", f"see {record.get('html')}")
    elif any(r["kernel"] == cell_name for r in passing):
        chosen = cell_name
    else:
        names = ", ".join(dict.fromkeys(r["kernel"] for r in passing)) or "none"
        raise UsageError(f"kernel cell {cell_name!r} did not pass in the last experiment", f"passing cells: {names}")
    word = cells[chosen]["parameter"]
    mask = QuirkMask.from_kernel_parameter(word)
    if mask is not None:
        kernel = target_kernel.kernel_to_install(None, dry_run)
        done = module_install.run(module_install.InstallRequest(kernel=kernel, quirks=mask, dry_run=dry_run))
        return KernelApplied(chosen, word, dry_run, install=done)
    return KernelApplied(chosen, word, dry_run, parameters=kernel_parameters.install(word, dry_run))
