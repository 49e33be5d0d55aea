"""doctor finds HSA_OVERRIDE_GFX_VERSION and the *_VISIBLE_DEVICES variables wherever an owner's machine sets
them, each finding naming the file and line (issue 50): two assignments on one `export` line, conda's env vars
(<env>/conda-meta/state, as `conda env config vars set` writes it: a JSON object with "env_vars"), conda's
activate.d, A1111's launcher, a systemd user unit, /etc/environment."""

import json

import pytest
from doctor_checks import board_root, by_check, run

A1111_LAUNCHER = """#!/bin/bash
# forum advice for Navi 1
export COMMANDLINE_ARGS="--precision full --no-half"
export HSA_OVERRIDE_GFX_VERSION=10.3.0
"""


@pytest.mark.parametrize(
    ("path", "text", "line"),
    [
        ("home/owner/.bashrc", "alias ll='ls -l'\nexport HIP_VISIBLE_DEVICES=0 HSA_OVERRIDE_GFX_VERSION=10.3.0\n", 2),
        ("home/owner/stable-diffusion-webui/webui-user.sh", A1111_LAUNCHER, 4),
        ("etc/environment", 'PATH="/usr/local/bin:/usr/bin"\nHSA_OVERRIDE_GFX_VERSION="10.3.0"\n', 2),
        (
            "home/owner/.config/systemd/user/comfyui.service",
            "[Service]\nEnvironment=HSA_OVERRIDE_GFX_VERSION=10.3.0\n",
            2,
        ),
        ("home/owner/miniconda3/envs/sd/etc/conda/activate.d/rocm.sh", "export HSA_OVERRIDE_GFX_VERSION=10.3.0\n", 1),
        ("home/owner/ComfyUI/run_amd.sh", "HSA_OVERRIDE_GFX_VERSION=10.3.0 python main.py\n", 1),
    ],
)
def test_the_override_is_found_with_its_file_and_line(tmp_path, path, text, line):
    tree = board_root(tmp_path)
    tree.file(path, text)
    override = by_check(run(tree), "gfx-override")
    assert [f["level"] for f in override] == ["problem"], override
    assert f"HSA_OVERRIDE_GFX_VERSION=10.3.0 in /{path}:{line}" in override[0]["seen"]
    assert f"/{path}" in override[0]["todo"] and f"line {line}" in override[0]["todo"]


def test_condas_env_vars_are_found_and_unset_the_conda_way(tmp_path):
    tree = board_root(tmp_path)
    state = {"env_vars": {"MIOPEN_FIND_MODE": "FAST", "HSA_OVERRIDE_GFX_VERSION": "10.3.0"}}
    tree.file("home/owner/miniconda3/envs/sd/conda-meta/state", json.dumps(state, indent=2) + "\n")
    (override,) = by_check(run(tree), "gfx-override")
    assert "in /home/owner/miniconda3/envs/sd/conda-meta/state:4" in override["seen"], override["seen"]
    assert "conda env config vars unset HSA_OVERRIDE_GFX_VERSION -p /home/owner/miniconda3/envs/sd" in override["todo"]


def test_an_ok_says_what_was_read(tmp_path):
    tree = board_root(tmp_path)
    tree.file("home/owner/.bashrc", "export EDITOR=vi\n")
    tree.file("home/owner/stable-diffusion-webui/webui-user.sh", "export COMMANDLINE_ARGS=\n")
    (override,) = by_check(run(tree), "gfx-override")
    assert override["level"] == "ok" and "owner's 1 shell files, 1 launchers" in override["seen"], override["seen"]
