"""How a line of a shell file, a systemd unit or pam_env sets variables, read as bash, systemd and pam_env read
them (bash(1) "SIMPLE COMMAND EXPANSION" and `export`; systemd.exec(5) Environment=; pam_env.conf(5))."""

import pytest

from rdna1_kmgr.userspace.environment_files import line_assignments


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "export HIP_VISIBLE_DEVICES=0 HSA_OVERRIDE_GFX_VERSION=10.3.0",
            [("HIP_VISIBLE_DEVICES", "0"), ("HSA_OVERRIDE_GFX_VERSION", "10.3.0")],
        ),
        ("declare -x A=1 B='two words'", [("A", "1"), ("B", "two words")]),
        ("HSA_OVERRIDE_GFX_VERSION=10.3.0 python launch.py --listen", [("HSA_OVERRIDE_GFX_VERSION", "10.3.0")]),
        (
            'Environment=HSA_OVERRIDE_GFX_VERSION=10.3.0 "MIOPEN_FIND_MODE=FAST"',
            [("HSA_OVERRIDE_GFX_VERSION", "10.3.0"), ("MIOPEN_FIND_MODE", "FAST")],
        ),
        ("HSA_OVERRIDE_GFX_VERSION DEFAULT=10.3.0", [("HSA_OVERRIDE_GFX_VERSION", "10.3.0")]),
        ("set -gx HSA_OVERRIDE_GFX_VERSION 10.3.0", [("HSA_OVERRIDE_GFX_VERSION", "10.3.0")]),
        ("unset A B", [("A", None), ("B", None)]),
        ("export PATH", []),
    ],
)
def test_each_variable_a_line_sets(line, expected):
    assert line_assignments(line) == expected


def test_a_command_that_prints_an_assignment_sets_nothing():
    assert "HSA_OVERRIDE_GFX_VERSION" not in [
        name for name, _ in line_assignments("echo HSA_OVERRIDE_GFX_VERSION=10.3.0")
    ]
