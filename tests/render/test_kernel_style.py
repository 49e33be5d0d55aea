"""The rendered patches held to upstream's own rules, on real Debian sources: scripts/checkpatch.pl of the same
kernel accepts every patch, and the objects the series touches compile with W=1 without a warning of their own.

checkpatch.pl (with spelling.txt and const_structs.checkpatch beside it) is not in the unpacked amd subset; it
is taken once from the very linux-source .deb the subset came from (fetched again: the tool deletes the .deb once
it has unpacked the subset), into the persistent test cache.
"""

import pytest
from kernel_style import checkpatch, checkpatch_of, touched_objects, w1_new_warnings

from rdna1_kmgr.render.patch_series import render

AMD = "drivers/gpu/drm/amd"
pytestmark = pytest.mark.realsource


@pytest.mark.parametrize("fixture", ["real_source_61", "real_source_612", "real_source_7x"])
def test_every_patch_passes_the_kernel_s_own_checkpatch(request, tmp_path, fixture):
    source = request.getfixturevalue(fixture)
    script = checkpatch_of(source)
    out = tmp_path / "out"
    manifest = render(source, out)
    for name in manifest.series:
        # No error and no warning at all; the only thing left out is the sign-off (see docs/developer.md).
        assert checkpatch(script, out / name, "--no-signoff") == [], name
        # nor a CHECK of --strict (what drm maintainers run)
        assert checkpatch(script, out / name, "--no-signoff", "--strict") == [], name
        # Without --no-signoff the one complaint is that sign-off: a person's DCO, which a generated patch
        # cannot give.
        assert [line.split(": ", 1)[1] for line in checkpatch(script, out / name)] == [
            "ERROR:MISSING_SIGN_OFF: Missing Signed-off-by: line(s)"
        ], name


@pytest.mark.realbuild
@pytest.mark.parametrize(
    "source_fixture, headers_fixture",
    [
        ("real_source_61", "headers_61"),
        ("real_source_612", "headers_612"),
    ],
)
def test_the_objects_the_series_touches_build_clean_with_w1(request, tmp_path, source_fixture, headers_fixture):
    source = request.getfixturevalue(source_fixture)
    release = request.getfixturevalue(headers_fixture)
    out = tmp_path / "out"
    render(source, out)
    touched = touched_objects(out)
    assert "amdgpu_rdna1" in touched and "amdgpu_amdkfd" in touched
    assert ("../amdkfd/kfd_queue" in touched) == (source_fixture == "real_source_612")  # cwsr-size from 6.12 on
    assert w1_new_warnings(source, out, release, tmp_path) == set()
