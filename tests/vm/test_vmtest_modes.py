"""`vm-test`'s modes: bare `vm-test` and `vm-test emulated` reach the emulated mode with the same arguments, each
subcommand its own mode; the old flags (`--emulated`, `--gpu`, `--matrix`, `--plumbing-only`, `--restore`) are
gone; bad combinations are one line and exit 2, before any mode runs."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from rdna1_kmgr.cli import main
from rdna1_kmgr.commands import vmtest
from rdna1_kmgr.vm import verdict

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


EMULATED_OPTIONS = "--kernel 6.1.0-56-amd64 --module /m.ko --manifest /m.json --accel tcg --timeout 50 --yes --json"


@pytest.mark.parametrize(
    "options, call",
    [
        ([], ("emulated_mode", (None, None, None, "auto", 300, False))),
        (EMULATED_OPTIONS.split(), ("emulated_mode", (KREL, "/m.ko", "/m.json", "tcg", 50.0, True))),
    ],
    ids=["defaults", "every option"],
)
def test_bare_vm_test_and_vm_test_emulated_make_the_same_call(calls, options, call):
    for args in (options, ["emulated", *options]):
        result = CliRunner().invoke(main, ["vm-test", *args])
        assert result.exit_code == 0, result.output
    assert calls == [call, call]


# (the subcommand as typed, the call it makes: mode function and its positional arguments)
SUBCOMMANDS = [
    (
        ["gpu", "auto", "--workload", "conv2d", "--timeout", "60", "--accept-reset-risk", "--force"],
        ("gpu_mode", ("auto", None, None, None, "auto", 60.0, "conv2d", False, True, True)),
    ),
    (
        ["matrix", BDF, "--cell-timeout", "30", "--module", "/m.ko", "--yes"],
        ("matrix_mode", (BDF, None, "/m.ko", None, "auto", 30.0, True, False, False)),
    ),
    (
        ["plumbing", BDF, "--kernel", KREL, "--accel", "kvm", "--json"],
        ("plumbing_mode", (BDF, KREL, "kvm", 300, False, False, False)),
    ),
    (["restore", "--json"], ("restore_mode", ())),
    (["restore"], ("restore_mode", ())),
]


@pytest.mark.parametrize("args, call", SUBCOMMANDS, ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_each_subcommand_makes_its_call(calls, args, call):
    result = CliRunner().invoke(main, ["vm-test", *args])
    assert result.exit_code == 0, result.output
    assert calls == [call]


@pytest.mark.parametrize(
    "args, gone",
    [
        (["--emulated"], "--emulated"),
        (["--gpu", BDF], "--gpu"),
        (["--gpu", BDF, "--matrix"], "--gpu"),
        (["--matrix"], "--matrix"),
        (["--gpu", BDF, "--plumbing-only"], "--gpu"),
        (["--plumbing-only"], "--plumbing-only"),
        (["--restore"], "--restore"),
        (["--restore", "--json"], "--restore"),
        # the options only the old --gpu and --matrix read: their subcommands take them now
        (["--workload", "conv2d"], "--workload"),
        (["--cell-timeout", "30"], "--cell-timeout"),
        (["--accept-reset-risk"], "--accept-reset-risk"),
        (["--force"], "--force"),
    ],
)
def test_the_old_mode_flags_are_gone(calls, args, gone):
    result = CliRunner().invoke(main, ["vm-test", *args])
    assert result.exit_code == 2, result.output
    assert f"No such option '{gone}'" in result.stderr
    assert calls == []


@pytest.mark.parametrize(
    "args, line",
    [
        (["--json", "restore"], "options before `vm-test restore` are not read"),
        (["--kernel", KREL, "plumbing", BDF], "options before `vm-test plumbing` are not read"),
        (["--yes", "emulated"], "options before `vm-test emulated` are not read"),
    ],
)
def test_options_before_a_subcommand_are_one_line_exit_2_and_run_no_mode(calls, args, line):
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


def test_bare_vm_test_says_which_kernels_build_it_tests_when_the_running_kernel_is_not_the_distributions(monkeypatch):
    """The notice goes to stderr while it works; the record's lines to stdout, as the emulated test prints them."""
    running = os.uname().release
    monkeypatch.setattr(vmtest, "resolve_kernel", lambda given: SimpleNamespace(release=KREL + "-other"))
    monkeypatch.setattr(
        vmtest.built_module, "for_kernel", lambda release: SimpleNamespace(path="/m.ko", selftest_cases=3)
    )
    passed = verdict.Record(
        verdict="pass",
        reason="all checks passed",
        mode="emulated",
        kernel=KREL + "-other",
        module="/m.ko",
        module_sha256="a" * 64,
        accel="tcg",
        checks=(verdict.Check("load", True, "loaded"),),
        selftest=None,
        console_log=None,
        seconds=12.5,
        started="2026-01-01T00:00:00+00:00",
        tool_version="t",
        record="/var/lib/rdna1-kmgr/validations/x.json",
    )
    monkeypatch.setattr(vmtest.engine, "validate_module", lambda *args, **kwargs: passed)
    result = CliRunner().invoke(main, ["vm-test"])
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [
        f"rdna1-kmgr: the running kernel {running} is not the distribution's; "
        f"testing the build for {KREL}-other (give --kernel to choose)"
    ]
    assert result.stdout.splitlines() == [
        "ok    load            loaded",
        f"verdict pass (emulated, {KREL}-other, tcg, 12.5 s); record /var/lib/rdna1-kmgr/validations/x.json",
    ]
