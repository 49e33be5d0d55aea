"""The render's manifest: what render writes reads back the same, every older manifest still reads, and a
manifest of another schema is refused in one line saying to render again."""

import json

import pytest
from fake_kernel import make_tree

from rdna1_kmgr.core.errors import UsageError
from rdna1_kmgr.modbuild import built_module
from rdna1_kmgr.render.manifest import Manifest
from rdna1_kmgr.render.patch_series import render
from rdna1_kmgr.render.quirk_mask import QuirkMask

# The keys of manifest.json as render wrote them before the manifest was typed (patch_series.py, 0.x).
KEYS_BEFORE = {
    "kernel_version",
    "renderer_version",
    "devices",
    "quirks",
    "left_out",
    "asked_quirks",
    "bits",
    "quirks_mask",
    "active_by_default",
    "all_bits_mask",
    "kernel_names",
    "selftest_cases",
    "series",
    "patches",
    "patchset_sha256",
}


@pytest.fixture
def rendered(tmp_path):
    out = tmp_path / "out"
    manifest = render(make_tree(tmp_path / "linux"), out, ["crat-mem"])
    return out, manifest


def test_the_written_file_is_todays_shape_with_schema_1_and_reads_back_equal(rendered):
    out, manifest = rendered
    text = (out / "manifest.json").read_text()
    data = json.loads(text)
    # issue 37 added the default-on quirks kept beside the asked ones, and those left out with --no-quirk
    assert data["schema"] == 1 and set(data) - {"schema"} == KEYS_BEFORE | {"kept_quirks", "declined_quirks"}
    assert text == json.dumps(data, indent=2, sort_keys=True) + "\n"
    assert data["asked_quirks"] == ["crat-mem"] and data["quirks"][0]["id"] == "crat-mem"
    assert data["quirks_mask"] == 0 and data["all_bits_mask"] == 0x2  # crat-mem: bit 1, opt-in
    assert Manifest.from_json(data) == manifest
    assert Manifest.read(out / "manifest.json").to_json() == data


def test_a_manifest_without_schema_from_before_the_typed_one_reads_as_schema_1():
    # what render wrote before asked_quirks, active_by_default and all_bits_mask were recorded
    old = {
        "kernel_version": "6.1.158",
        "devices": ["0x731F"],
        "quirks": [{"id": "crat-mem", "bits": ["crat-mem"], "variant": "kgd", "facts": []}, "coarse-mtype"],
        "quirks_mask": 3,
        "selftest_cases": 4,
        "patches": {"0001-out-of-tree.patch": "ab" * 32},
        "patchset_sha256": "cd" * 32,
    }
    manifest = Manifest.from_json(old)
    assert manifest.quirk_ids == ["crat-mem", "coarse-mtype"]
    assert manifest.asked_quirks == ("crat-mem", "coarse-mtype")  # it carried what was asked
    assert manifest.active_by_default == ("crat-mem", "coarse-mtype")  # it loaded every quirk on
    assert manifest.carried_mask == QuirkMask(3) and manifest.selftest_cases == 4
    assert Manifest.from_json({"asked_quirks": None, "quirks": ["crat-mem"]}).asked_quirks is None
    assert Manifest.from_json({"selftest_cases": []}).selftest_cases is None  # a wrong type reads as unknown


@pytest.mark.parametrize("schema", [2, 0, "1", None, True])
def test_another_schema_is_one_line_saying_to_render_again(tmp_path, schema):
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"schema": schema, "kernel_version": "6.1.158"}))
    with pytest.raises(UsageError) as err:
        Manifest.read(path)
    line = err.value.line()
    assert "\n" not in line and str(path) in line and f"is of schema {schema!r}; this rdna1-kmgr reads schema 1" in line
    assert "render it again" in line
    # the commands that take a module's manifest (vm-test --manifest, install) refuse it the same way
    module = tmp_path / "amdgpu.ko"
    module.write_bytes(b"ko")
    with pytest.raises(UsageError) as refused:
        built_module.for_path(module, path)
    assert refused.value.line() == line


def test_an_unreadable_manifest_is_one_line_and_a_missing_one_is_none(tmp_path):
    path = tmp_path / "manifest.json"
    path.write_text("{not json")
    with pytest.raises(UsageError, match="unreadable manifest"):
        Manifest.read(path)
    module = tmp_path / "amdgpu.ko"
    module.write_bytes(b"ko")
    assert built_module.for_path(module).manifest is None
