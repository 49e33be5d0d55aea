"""The series' own check that every name its added code uses exists in the tree it patches."""

import pytest

from rdna1_kmgr.core.errors import SourceError
from rdna1_kmgr.render import name_check
from rdna1_kmgr.render.name_check import Added, TreeNames

AMD = "drivers/gpu/drm/amd"
CRAT = f"{AMD}/amdkfd/kfd_crat.c"
FUNCTION = """static int kfd_create_vcrat_image_gpu(void *pcrat_image, struct kfd_node *kdev)
{
	struct kfd_local_mem_info local_mem_info;

	amdgpu_amdkfd_get_local_mem_info(kdev->adev, &local_mem_info);
	return 0;
}
"""
HEADER = """/* the kgd_dev pointer was removed in 5.17: struct kfd_dev { void *kgd; } */
struct kfd_node {
	struct amdgpu_device *adev;
	int (*get_info)(struct kfd_node *node);
};
#define KFD_NODE_MAX 8
"""


@pytest.fixture
def tree(tmp_path):
    (tmp_path / AMD / "amdkfd").mkdir(parents=True)
    (tmp_path / AMD / "include").mkdir(parents=True)
    (tmp_path / CRAT).write_text(FUNCTION)
    (tmp_path / AMD / "include/kfd_node.h").write_text(HEADER)
    return TreeNames.scan(tmp_path)


def hook(code):
    return Added(CRAT, code, FUNCTION)


def test_names_the_tree_has_pass(tree):
    name_check.check(
        tree,
        [
            hook("amdgpu_rdna1_crat_mem_info(kdev->adev, &local_mem_info);"),
            hook("return kdev->get_info(kdev) + KFD_NODE_MAX;"),
        ],
        {},
    )


def test_a_member_the_tree_does_not_have_is_refused_with_its_file(tree):
    # `kgd` occurs in the tree, but only in a comment
    with pytest.raises(SourceError, match=rf"`kgd` \(a struct member, in {CRAT}\)"):
        name_check.check(
            tree, [hook("amdgpu_rdna1_crat_mem_info((struct amdgpu_device *)kdev->kgd, &local_mem_info);")], {}
        )


def test_a_function_or_macro_the_tree_does_not_have_is_refused(tree):
    with pytest.raises(SourceError, match=r"`amdgpu_amdkfd_get_vram_usage` \(a function"):
        name_check.check(tree, [hook("amdgpu_amdkfd_get_vram_usage(kdev->adev);")], {})
    with pytest.raises(SourceError, match=r"`KFD_NODE_MIN` \(a name"):
        name_check.check(tree, [hook("return KFD_NODE_MIN;")], {})


def test_a_hook_may_only_use_locals_of_its_own_function(tree):
    # `pdev` is nowhere in kfd_create_vcrat_image_gpu()
    other = Added(CRAT, "amdgpu_rdna1_probe(kdev->adev);", "static int f(struct pci_dev *pdev)\n{\n}\n")
    with pytest.raises(SourceError, match=r"`kdev` \(a local name"):
        name_check.check(tree, [other], {})


def test_names_the_series_declares_and_kernel_names_pass(tree):
    core = {
        f"{AMD}/amdgpu/amdgpu_rdna1.c": (
            "struct ctx {\n\tu32 failed;\n};\nstatic int helper(u32 quirk)\n{\n\treturn quirk;\n}\n"
            "static void count(struct ctx *c)\n{\n}\n"
        )
    }
    added = [Added(f"{AMD}/amdgpu/amdgpu_rdna1.c", "c->failed = helper(FIELD_PREP(KFD_NODE_MAX, 1));")]
    with pytest.raises(SourceError, match="FIELD_PREP"):
        name_check.check(tree, added, core)
    name_check.check(tree, added, core, kernel_names=["FIELD_PREP"])


def test_makefiles_are_not_c(tree):
    name_check.check(tree, [Added(f"{AMD}/amdgpu/Makefile", "amdgpu-y += amdgpu_rdna1.o\n")], {})


PASTING_CORE = {
    f"{AMD}/amdgpu/amdgpu_rdna1.c": "#define RDNA1_KFD(flag)\tKFD_NODE_##flag\n"
    "static const int cases[] = {\n\tRDNA1_KFD(MAX) | RDNA1_KFD( MAX ),\n};\n"
}


def test_names_built_by_the_series_pasting_macros_are_expanded_and_checked(tree):
    core = dict(PASTING_CORE)
    added = [name_check.Added(rel, text) for rel, text in core.items()]
    name_check.check(tree, added, core)  # KFD_NODE_MAX is in the tree's header
    core = {rel: text.replace("RDNA1_KFD( MAX )", "RDNA1_KFD(MIN)") for rel, text in PASTING_CORE.items()}
    added = [name_check.Added(rel, text) for rel, text in core.items()]
    with pytest.raises(SourceError, match=r"`KFD_NODE_MIN` \(a name, in .*amdgpu_rdna1.c\)"):
        name_check.check(tree, added, core)


def test_a_pasting_macro_expands_its_parameters_only():
    macros = name_check.pasting_macros(["#define RDNA1_PAIR(a, b)\tPREFIX_##a##_##b | a_b\n"])
    assert name_check.expand_pasting("x = RDNA1_PAIR(ONE, TWO);", macros) == "x = PREFIX_ONE_TWO | a_b;"
    # the definition itself is not a use; a use with the wrong number of arguments is left as it is
    assert name_check.expand_pasting("#define RDNA1_PAIR(a, b)\tPREFIX_##a##_##b | a_b\nRDNA1_PAIR(X)", macros) == (
        "\nRDNA1_PAIR(X)"
    )
