"""`vm-test matrix auto`: the experiment on the owner's board, passed through to fresh VMs.

The same refusals as every passthrough run (IOMMU group, display use, reset readiness, vfio-pci) come
first; the board and its audio function stay on vfio-pci for the whole experiment and go back to their
drivers at the end, however it ends. The quirk axis is the bits the build carries (its manifest), the
profile axis userspace/profiles.toml; "as installed" is the invoking user's ROCm settings as the system's
and their own files set them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rdna1_kmgr.core import owner as owners
from rdna1_kmgr.core import user_input
from rdna1_kmgr.core.errors import UsageError
from rdna1_kmgr.modbuild.built_module import BuiltModule
from rdna1_kmgr.render import quirk_catalog
from rdna1_kmgr.userspace import environment_files
from rdna1_kmgr.vm import engine, experiment, experiment_guest, guest_kernel, passthrough

# The variables the "as installed" profile carries into the guest.
ROCM_PREFIXES = ("HSA_", "HIP_", "ROC_", "ROCR_", "MIOPEN_", "PYTORCH_", "AMD_")


@dataclass(frozen=True)
class BoardExperiment:
    """The experiment run on the board: where its record was written, every cell's result, and the pick (None:
    no cell passed)."""

    record: Path  # experiments/<time>.json
    results: tuple[experiment.CellResult, ...]
    best: experiment.CellResult | None


def installed_environment(home: Path | None) -> dict[str, str]:
    """The ROCm variables a login of the user would have: the last assignment of each in the system's and
    the user's files (an `unset` drops it)."""
    values: dict[str, str | None] = {}
    for assignment in environment_files.assignments(Path("/"), home, lambda name: name.startswith(ROCM_PREFIXES)):
        values[assignment.name] = assignment.value
    return {k: v for k, v in values.items() if v is not None}


def built_cells(built: BuiltModule) -> list[experiment.Cell]:
    """The matrix over the quirks the build carries (all the catalog's when its manifest does not say)."""
    catalog = quirk_catalog.load_quirks()
    carried = set(built.manifest.quirk_ids if built.manifest else ()) or set(catalog)
    return experiment.cells({k: q for k, q in catalog.items() if k in carried})


def run(
    spec: str,
    built: BuiltModule,
    release: str | None,
    accel: str,
    cell_timeout: float,
    fetch: bool,
    force: bool,
    accept_reset_risk: bool,
) -> BoardExperiment:
    """The whole experiment on the board, its record written under experiments/."""
    bdf = passthrough.resolve_gpu(spec)
    passthrough.require_root()
    pre = passthrough.preflight(bdf, plumbing_only=False, force=force, accept_reset_risk=accept_reset_risk)
    release = release or built.kernel
    if release is None:  # --module outside the DKMS tree, without --kernel: nothing says which kernel it is for
        raise UsageError(f"no kernel is known for the module {built.path}", "give the kernel to boot with --kernel")
    release = user_input.kernel_release(release)
    guest_kernel.locate(release, fetch=fetch)  # a missing kernel is refused (or fetched) before anything is bound
    workload = {"args": ["--sweep", "experiment"]}  # the host experiment's workload too
    cells = built_cells(built)
    base_env = installed_environment(owners.invoking_home())  # sudo's user, checked
    engine.say(f"experiment: {len(cells)} cells on {bdf}, {cell_timeout:.0f} s each at most")
    with passthrough.bound(pre) as session:
        run_batch = experiment_guest.batch_runner(
            release,
            built.path,
            workload,
            cell_timeout,
            accel=accel,
            fetch=fetch,
            base_env=base_env,
            devices=pre.devices,
        )
        results = experiment.run(cells, run_batch)
    best = experiment.recommend(results)
    context = {
        "board": bdf,
        "kernel": release,
        "module": str(built.path),
        "accepted_reset_risk": pre.accepted_reset_risk,
        "as_installed": base_env,
        "workload": workload["args"],
        "devices_returned": [r.to_json() for r in session.returned],
    }
    path = experiment.write_record(results, best, context)
    return BoardExperiment(path, tuple(results), best)
