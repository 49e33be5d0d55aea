"""Compile probes: the kernel-header macros the series takes on trust, confirmed against real headers."""

import pytest

from rdna1_kmgr.core.errors import BuildError
from rdna1_kmgr.modbuild import compile_probes
from rdna1_kmgr.render import quirk_catalog


def test_the_probe_includes_each_header_once_and_names_each_macro():
    source = compile_probes.probe_source(
        {"FIELD_GET": "linux/bitfield.h", "FIELD_PREP": "linux/bitfield.h", "SZ_256M": "linux/sizes.h"}
    )
    assert source.count("#include <linux/bitfield.h>") == 1 and "#include <linux/sizes.h>" in source
    assert '#ifndef SZ_256M\n#error "rdna1-kmgr probe: SZ_256M is not defined by <linux/sizes.h>"' in source


def test_no_headers_no_probe_and_no_claim():
    assert compile_probes.confirm("0.0.0-no-such-kernel", {"FIELD_GET": "linux/bitfield.h"}) is False


def test_the_catalogs_kernel_macros_are_defined_by_real_headers(headers_61):
    assert compile_probes.confirm(headers_61, quirk_catalog.core().kernel_names) is True


@pytest.mark.parametrize(
    "names, said",
    [
        (
            {"SZ_256M": "linux/sizes.h", "RDNA1_NO_SUCH_MACRO": "linux/sizes.h"},
            "rdna1-kmgr probe: RDNA1_NO_SUCH_MACRO is not defined by <linux/sizes.h>",
        ),
        ({"SZ_256M": "linux/rdna1_no_such_header.h"}, "rdna1_no_such_header.h"),
    ],
)
def test_a_macro_or_header_the_headers_lack_stops_the_build_naming_it(headers_61, names, said):
    with pytest.raises(BuildError) as err:
        compile_probes.confirm(headers_61, names)
    assert said in str(err.value) and headers_61 in str(err.value)
    assert "\n" not in str(err.value)
