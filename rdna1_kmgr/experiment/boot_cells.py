"""The experiment's kernel cells as boots: GRUB adds one cell's word to one boot's command line, once.

The boot guard's mechanism (install/boot_guard.py), for a cell instead of a quirk mask: GRUB reads its
environment block, and when a cell is armed it marks it booted and saves that *before* the kernel runs, then
adds the cell's parameter. So a cell's boot that hangs, and is power-cycled, is followed by a normal boot by
itself; the unit sees the cell booted and not recorded, and records a hang.

    grubenv rdna1_kmgr_cell            armed (the next boot is the cell's) | booted (GRUB started it)
            rdna1_kmgr_cell_name       the cell, put on its command line as rdna1_kmgr.cell=NAME
            rdna1_kmgr_cell_parameter  the cell's one word (amdgpu.cwsr_enable=0, amdgpu.rdna1_quirks=0x12)

Files (journaled in journal/experiment/ as one step; `experiment stop`, the last cell, and `rollback` remove
them, regenerate grub.cfg and unset the variables):

    /etc/grub.d/02_rdna1-kmgr-experiment        the GRUB code above (after 00_header's load_env)
    /etc/default/grub.d/rdna1-kmgr.experiment.cfg   appends ${rdna1_kmgr_cell_args} to GRUB_CMDLINE_LINUX;
                                                 sorted after the guard's rdna1-kmgr.cfg, so a cell's
                                                 rdna1_quirks comes last on the line and is the one amdgpu takes
    /etc/systemd/system/rdna1-kmgr-experiment.service   every boot: `rdna1-kmgr experiment boot-step`
    and its multi-user.target.wants link.
"""

from __future__ import annotations

from pathlib import Path

from rdna1_kmgr.core import runner
from rdna1_kmgr.core.errors import HostError
from rdna1_kmgr.core.files import make_dirs, write_atomic
from rdna1_kmgr.experiment.kernel_cells import KernelCell
from rdna1_kmgr.install import boot_guard, grub_commands, journal_checks
from rdna1_kmgr.install.journal_records import Done
from rdna1_kmgr.install.profile_journal import ExperimentJournal
from rdna1_kmgr.install.target_root import TargetRoot
from rdna1_kmgr.install.undo import Writer, regenerate

STATE = "rdna1_kmgr_cell"
NAME = "rdna1_kmgr_cell_name"
PARAMETER = "rdna1_kmgr_cell_parameter"
CELL_PARAMETER = "rdna1_kmgr.cell"  # on the cell's command line: which cell this boot is
GRUB_SCRIPT = "etc/grub.d/02_rdna1-kmgr-experiment"
GRUB_DEFAULTS = "etc/default/grub.d/rdna1-kmgr.experiment.cfg"
UNIT = "etc/systemd/system/rdna1-kmgr-experiment.service"
UNIT_LINK = "etc/systemd/system/multi-user.target.wants/rdna1-kmgr-experiment.service"
STEP = "write the experiment's boot files"

_GRUB_SCRIPT = """\
#!/bin/sh
# Written by `rdna1-kmgr experiment kernel`; `experiment stop` and `rollback` remove it. One boot per kernel
# cell: GRUB marks an armed cell booted before the kernel runs, so a boot that hangs is followed by a normal one.
cat <<'EOF'
if [ "${rdna1_kmgr_cell}" = "armed" ]; then
  set rdna1_kmgr_cell=booted
  save_env rdna1_kmgr_cell
  set rdna1_kmgr_cell_args="${rdna1_kmgr_cell_parameter} rdna1_kmgr.cell=${rdna1_kmgr_cell_name}"
else
  set rdna1_kmgr_cell_args=""
fi
export rdna1_kmgr_cell_args
EOF
"""

_GRUB_DEFAULTS = """\
# Written by `rdna1-kmgr experiment kernel`; `experiment stop` and `rollback` remove it. GRUB fills
# ${rdna1_kmgr_cell_args} at boot (see /etc/grub.d/02_rdna1-kmgr-experiment): one experiment cell's boot.
GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX \\${rdna1_kmgr_cell_args}"
"""


def files(root: TargetRoot) -> dict[Path, tuple[str, int]]:
    """Every file the cells' boots need, with content and mode."""
    return {
        root.path / GRUB_SCRIPT: (_GRUB_SCRIPT, 0o755),
        root.path / GRUB_DEFAULTS: (_GRUB_DEFAULTS, 0o644),
        root.path / UNIT: (
            f"""\
[Unit]
Description=rdna1-kmgr experiment: run this boot's kernel cell, record it, arm the next
After=multi-user.target graphical.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart={boot_guard.tool_path()} experiment boot-step
StandardOutput=journal+console
TimeoutStartSec=infinity

[Install]
WantedBy=multi-user.target
""",
            0o644,
        ),
    }


def journal_rules(root: TargetRoot) -> dict[str, journal_checks.StepRule]:
    """What the experiment's journal may record: its one step, these files, their undo (journal_checks)."""
    paths = [*files(root), root.path / UNIT_LINK]
    undone = regenerate(Writer.EXPERIMENT_BOOTS, undo_commands(root))
    return {STEP: journal_checks.StepRule(frozenset(paths).__contains__, [None], undone)}


journal_checks.register(ExperimentJournal.NAME, journal_rules)


def unavailable(root: TargetRoot) -> str | None:
    """Why this machine cannot boot cells (None: it can): the boot guard's needs, GRUB first."""
    return boot_guard.unavailable(root)


def arm_command(root: TargetRoot, cell: KernelCell) -> list[str]:
    return boot_guard.editenv(root, "set", f"{STATE}=armed", f"{NAME}={cell.name}", f"{PARAMETER}={cell.parameter}")


def undo_commands(root: TargetRoot) -> list[list[str]]:
    return [["update-grub"], boot_guard.editenv(root, "unset", STATE, NAME, PARAMETER)]


def plan_lines(root: TargetRoot, first: KernelCell) -> list[str]:
    lines = [f"write {path} (absent before; journaled)" for path in files(root)]
    lines.append(f"link {root.path / UNIT_LINK} -> /{UNIT}")
    lines += [" ".join(["update-grub"]), " ".join(arm_command(root, first))]
    return lines


def install(root: TargetRoot, journal: ExperimentJournal, first: KernelCell) -> None:
    """The files, journaled as one step (removing them is the undo), then GRUB's configuration and the first
    cell armed. A run killed anywhere in here is undone by `experiment stop` or `rollback`."""
    paths = [*files(root), root.path / UNIT_LINK]
    parents = sorted({p.parent for p in paths if not p.parent.exists()}, key=lambda d: len(d.parts))
    journal.record_intent(
        STEP, None, replaces=paths, dirs=parents, undo=regenerate(Writer.EXPERIMENT_BOOTS, undo_commands(root))
    )
    for path, (text, mode) in files(root).items():
        make_dirs(path.parent)
        write_atomic(path, text.encode(), mode)
    link = root.path / UNIT_LINK
    make_dirs(link.parent)
    link.unlink(missing_ok=True)
    link.symlink_to(f"/{UNIT}")
    hint = "the experiment's boots could not be set up"
    grub_commands.run(
        [["update-grub"], arm_command(root, first)],
        lambda command: runner.run(command, timeout=900, error=HostError, hint=hint),
    )
    journal.append(Done(STEP))
    daemon_reload(root)


def arm(root: TargetRoot, cell: KernelCell) -> None:
    grub_commands.run(
        [arm_command(root, cell)], lambda c: runner.run(c, error=HostError, hint="check /boot/grub/grubenv")
    )


def daemon_reload(root: TargetRoot) -> None:
    if root.is_system and Path("/run/systemd/system").is_dir():
        runner.run(["systemctl", "daemon-reload"], check=False)


def installed(root: TargetRoot) -> bool:
    return (root.path / GRUB_SCRIPT).is_file()


def this_cell(root: TargetRoot) -> str | None:
    """The cell this boot is, from its command line (None: a normal boot)."""
    return boot_guard.cmdline_value(root, CELL_PARAMETER)


def env_state(root: TargetRoot) -> tuple[str | None, str | None]:
    """(armed|booted|None, the cell's name) from GRUB's environment block."""
    env = boot_guard.env_values(root)
    return env.get(STATE), env.get(NAME)
