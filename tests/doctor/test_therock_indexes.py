"""TheRock's indexes by channel and build date. Expected URLs as read in ROCm/TheRock at 89553ce3: RELEASES.md
line 107 (the multi-arch nightly index), build_tools/setup_venv.py lines 57-59 (each channel's index since #7547,
2026-08-22), #6550 (the release index before it); versions as docs/packaging/versioning.md writes them."""

import pytest

from rdna1_kmgr.doctor import therock_indexes


@pytest.mark.parametrize(
    ("channel", "version", "urls"),
    [
        ("nightly", "7.13.0a20260601", ("https://rocm.nightlies.amd.com/whl-multi-arch/",)),
        ("nightly", "7.13.0a20260821", ("https://rocm.nightlies.amd.com/whl-multi-arch/",)),
        ("nightly", "7.13.0a20260822", ("https://nightly.repo.amd.com/rocm/whl-next/",)),
        ("nightly", None, ("https://nightly.repo.amd.com/rocm/whl-next/",)),
        ("bkc", "10.1.0a20260811.bkc.20260823", ("https://bkc.repo.amd.com/rocm/whl-next/",)),
        (
            "release",
            "10.1.0",
            ("https://stable.repo.amd.com/rocm/whl-next/", "https://repo.amd.com/rocm/whl-multi-arch/"),
        ),
        # a new release install: today's index, and the one releases were promoted to until the move (#7351)
        (
            "release",
            None,
            ("https://stable.repo.amd.com/rocm/whl-next/", "https://repo.amd.com/rocm/whl-multi-arch/"),
        ),
        (
            "prerelease",
            "10.1.0rc2",
            ("https://rc.repo.amd.com/rocm/whl-next/", "https://rocm.prereleases.amd.com/whl-multi-arch/"),
        ),
    ],
)
def test_each_build_gets_the_index_it_was_published_to(channel, version, urls):
    assert therock_indexes.indexes(channel, version) == urls


def test_the_date_of_a_version_is_its_last_one():
    assert str(therock_indexes.built_on("2.11.0+rocm7.13.0a20260601")) == "2026-06-01"
    assert str(therock_indexes.built_on("10.1.0a20260811.bkc.20260813")) == "2026-08-13"
    assert therock_indexes.built_on("10.1.0") is None and therock_indexes.built_on("7.13.0a20261399") is None


def test_the_reference_table_lists_every_index_with_its_source():
    table = therock_indexes.markdown_table()
    assert len(table) == 2 + len(therock_indexes.TABLE)
    assert all(row.count("|") == 5 and "`https://" in row for row in table[2:])
