"""`vm-test`'s modes: each old flag spelling and its subcommand reach the same mode function with the same
arguments; bad combinations are one line and exit 2, before any mode runs."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from rdna1_kmgr.cli import main
from rdna1_kmgr.commands import vmtest

BDF = "0000:0a:00.0"
KREL = "6.1.0-56-amd64"
MODES = ("emulated_mode", "gpu_mode", "matrix_mode", "plumbing_mode", "restore_mode")


@pytest.fixture
def calls(monkeypatch) -> list[tuple[str, tuple]]:
    """Every mode function replaced by one that notes its name and arguments."""
    seen = []
    for name in MODES:
        monkeypatch.setattr(vmtest, name, lambda *args, _name=name: seen.append((_name, args)))
    return seen


# (old spelling, new spelling, the call both make: mode function and its positional arguments)
SPELLINGS = [
    ([], ["emulated"], ("emulated_mode", (None, None, None, "auto", 300, False, False))),
    (
        ["--emulated", "--kernel", KREL, "--module", "/m.ko", "--manifest", "/m.json", "--accel", "tcg"]
        + ["--timeout", "50", "--yes", "--json"],
        ["emulated", "--kernel", KREL, "--module", "/m.ko", "--manifest", "/m.json", "--accel", "tcg"]
        + ["--timeout", "50", "--yes", "--json"],
        ("emulated_mode", (KREL, "/m.ko", "/m.json", "tcg", 50.0, True, True)),
    ),
    (
        ["--gpu", "auto", "--workload", "conv2d", "--timeout", "60", "--accept-reset-risk", "--force"],
        ["gpu", "auto", "--workload", "conv2d", "--timeout", "60", "--accept-reset-risk", "--force"],
        ("gpu_mode", ("auto", None, None, None, "auto", 60.0, "conv2d", False, True, True, False)),
    ),
    (
        ["--gpu", BDF, "--matrix", "--cell-timeout", "30", "--module", "/m.ko", "--yes"],
        ["matrix", BDF, "--cell-timeout", "30", "--module", "/m.ko", "--yes"],
        ("matrix_mode", (BDF, None, "/m.ko", None, "auto", 30.0, True, False, False, False)),
    ),
    (
        ["--gpu", BDF, "--plumbing-only", "--kernel", KREL, "--accel", "kvm", "--json"],
        ["plumbing", BDF, "--kernel", KREL, "--accel", "kvm", "--json"],
        ("plumbing_mode", (BDF, KREL, "kvm", 300, False, False, False, True)),
    ),
    (["--restore", "--json"], ["restore", "--json"], ("restore_mode", (True,))),
    (["--restore"], ["restore"], ("restore_mode", (False,))),
]


@pytest.mark.parametrize("old, new, call", SPELLINGS, ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_each_old_spelling_and_its_subcommand_make_the_same_call(calls, old, new, call):
    for args in (old, new):
        result = CliRunner().invoke(main, ["vm-test", *args])
        assert result.exit_code == 0, result.output
    assert calls == [call, call]


@pytest.mark.parametrize(
    "args, line",
    [
        (["--emulated", "--gpu", BDF], "--emulated and --gpu exclude each other"),
        (["--matrix"], "--matrix runs on the board"),
        (["--gpu", BDF, "--matrix", "--plumbing-only"], "--matrix runs on the board"),
        (["--restore", "--gpu", BDF], "--restore takes no --gpu or --plumbing-only"),
        (["--plumbing-only"], "--plumbing-only needs --gpu BDF"),
        (["--accept-reset-risk"], "--accept-reset-risk and --force only apply with --gpu"),
        (["--workload", "conv2d"], "the conv2d workload needs a GPU passed through"),
        (["--timeout", "0", "--restore"], "invalid --timeout 0"),
        (["--json", "restore"], "options before `vm-test restore` are not read"),
        (["--gpu", BDF, "plumbing", BDF], "options before `vm-test plumbing` are not read"),
    ],
)
def test_a_bad_combination_is_one_line_exit_2_and_runs_no_mode(calls, args, line):
    result = CliRunner().invoke(main, ["vm-test", *args])
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [result.stderr.splitlines()[0]]
    assert result.stderr.startswith(f"rdna1-kmgr: error: {line}")
    assert calls == []


@pytest.mark.parametrize(
    "args, line",
    [
        (["gpu", "03:00"], "invalid PCI address '03:00'"),
        (["plumbing", "0000:0a:00.0;reboot"], "invalid PCI address '0000:0a:00.0;reboot'"),
        (["matrix", "auto", "--cell-timeout", "0"], "invalid --cell-timeout 0"),
        (["emulated", "--manifest", "/m.json"], "--manifest goes with --module"),
        (["emulated", "--timeout", "-1"], "invalid --timeout -1"),
    ],
)
def test_a_subcommand_refuses_bad_values_in_one_line_with_exit_2(args, line):
    result = CliRunner().invoke(main, ["vm-test", *args])
    assert result.exit_code == 2, result.output
    (err,) = result.stderr.splitlines()
    assert err.startswith(f"rdna1-kmgr: error: {line}")


@pytest.mark.parametrize(
    "args, unknown", [(["emulated", "--gpu", BDF], "--gpu"), (["restore", "--timeout", "5"], "--timeout")]
)
def test_a_subcommand_takes_only_its_own_options(calls, args, unknown):
    result = CliRunner().invoke(main, ["vm-test", *args])
    assert result.exit_code == 2 and f"No such option '{unknown}'" in result.stderr
    assert calls == []
