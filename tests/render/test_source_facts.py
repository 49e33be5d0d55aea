"""Facts of a source, checked on the text of the tree: what chooses a quirk's variant."""

import pytest

from rdna1_kmgr.render.source_facts import Fact

GMC = "drivers/gpu/drm/amd/amdgpu/gmc_v10_0.c"
TEXT = """static void gmc_v10_0_get_vm_pte(struct amdgpu_device *adev,
				 struct amdgpu_vm *vm, uint32_t vm_flags,
				 uint64_t *flags)
{
	/* before 6.2 KFD set AMDGPU_GEM_CREATE_COHERENT buffers to UC itself */
	if (bo && bo->flags & (AMDGPU_GEM_CREATE_UNCACHED |
			       AMDGPU_GEM_CREATE_EXT_COHERENT))
		*flags = AMDGPU_PTE_MTYPE_NV10(*flags, MTYPE_UC);
}
"""


def read(rel):
    return TEXT if rel == GMC else None


def fact(**raw):
    return Fact.parse({"file": GMC, "function": "gmc_v10_0_get_vm_pte", **raw}, "test")


def test_each_kind_of_fact_holds_or_says_why_not():
    assert fact(parameters="uint32_t vm_flags").check(read) is None
    assert (
        fact(contains="bo->flags & (AMDGPU_GEM_CREATE_UNCACHED | AMDGPU_GEM_CREATE_EXT_COHERENT)").check(read) is None
    )
    assert fact(lacks="mapping").check(read) is None
    assert fact(parameters="mapping").check(read) == "gmc_v10_0.c: gmc_v10_0_get_vm_pte() does not take `mapping`"
    assert fact(lacks="MTYPE_UC").check(read) == "gmc_v10_0.c: gmc_v10_0_get_vm_pte() contains `MTYPE_UC`"


def test_a_comment_is_not_code():
    # the comment mentions AMDGPU_GEM_CREATE_COHERENT; the code does not use it
    assert fact(contains="AMDGPU_GEM_CREATE_COHERENT").check(read) is not None
    assert fact(lacks="AMDGPU_GEM_CREATE_COHERENT").check(read) is None


def test_a_missing_function_or_file_holds_no_fact():
    missing = Fact.parse({"file": GMC, "function": "gone", "lacks": "x"}, "test")
    assert missing.check(read) == f"{GMC}: function gone() not found"
    assert Fact.parse({"file": "nope.c", "contains": "x"}, "test").check(read) == "nope.c not found"


def test_a_whole_file_fact_and_its_description():
    whole = Fact.parse({"file": GMC, "contains": "uint64_t *flags"}, "test")
    assert whole.check(read) is None
    assert str(whole) == "gmc_v10_0.c contains `uint64_t *flags`"
    assert str(fact(parameters="vm_flags")) == "gmc_v10_0.c: gmc_v10_0_get_vm_pte() takes `vm_flags`"


@pytest.mark.parametrize(
    "raw",
    [
        {"file": GMC},
        {"file": GMC, "contains": "a", "lacks": "b"},
        {"file": GMC, "parameters": "a"},
        {"contains": "a"},
        {"file": GMC, "contains": "a", "kernel": "6.1"},
    ],
)
def test_malformed_facts_are_refused_when_the_catalog_loads(raw):
    with pytest.raises(ValueError, match="test: fact"):
        Fact.parse(raw, "test")
