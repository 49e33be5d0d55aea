"""A tiny fake kernel tree: the top Makefile and the few amdgpu/amdkfd files the quirks hook. Each hooked
place can take any of the forms it has had across the supported kernels, independently of the version in
the top Makefile (a distribution's backport mixes them). Enough for the renderer and `patch`; not for a
compiler."""

import re
from pathlib import Path
from unittest import mock

from rdna1_kmgr.core.errors import SourceError
from rdna1_kmgr.render import name_check
from rdna1_kmgr.render.patch_series import render_series

AMD = "drivers/gpu/drm/amd"
NAMES_HEADER = f"{AMD}/include/fake_names.h"


def series_names(tree: Path) -> set[str]:
    """Every identifier the series for `tree` adds (rendered with the name check off), or none if the
    tree does not render at all."""
    with mock.patch.object(name_check, "check"):
        try:
            patches, _ = render_series(tree)
        except SourceError:
            return set()
    added = "".join(line[1:] for p in patches for line in p.text.splitlines(keepends=True)
                    if line.startswith("+") and not line.startswith("+++"))
    return set(re.findall(r"[A-Za-z_]\w*", name_check.code_of(added)))


def names_header(names: set[str]) -> str:
    """A header declaring `names` as members: what a real driver tree and the kernel's headers provide
    (a fake tree has no headers)."""
    members = "".join(f"\tint {name};\n" for name in sorted(names))
    return f"struct fake_names {{\n{members}}};\n"


GET_VM_PTE = {
    # 5.10 - 6.1: the MTYPE comes with the mapping
    "mapping": """static void gmc_v10_0_get_vm_pte(struct amdgpu_device *adev,
				 struct amdgpu_bo_va_mapping *mapping,
				 uint64_t *flags)
{
	*flags &= ~AMDGPU_PTE_MTYPE_NV10_MASK;
	*flags |= (mapping->flags & AMDGPU_PTE_MTYPE_NV10_MASK);

	if (mapping->flags & AMDGPU_PTE_PRT) {
		*flags |= AMDGPU_PTE_PRT;
		*flags &= ~AMDGPU_PTE_VALID;
	}
}
""",
    # 6.2 - 6.17: the same, and coherent buffers are made UC here
    "mapping-uc": """static void gmc_v10_0_get_vm_pte(struct amdgpu_device *adev,
				 struct amdgpu_bo_va_mapping *mapping,
				 uint64_t *flags)
{
	struct amdgpu_bo *bo = mapping->bo_va->base.bo;

	*flags &= ~AMDGPU_PTE_MTYPE_NV10_MASK;
	*flags |= (mapping->flags & AMDGPU_PTE_MTYPE_NV10_MASK);

	if (bo && bo->flags & (AMDGPU_GEM_CREATE_COHERENT |
			       AMDGPU_GEM_CREATE_UNCACHED))
		*flags = AMDGPU_PTE_MTYPE_NV10(*flags, MTYPE_UC);
}
""",
    # 6.18 on: the UAPI flags and the BO come in
    "vm_flags": """static void gmc_v10_0_get_vm_pte(struct amdgpu_device *adev,
				 struct amdgpu_vm *vm,
				 struct amdgpu_bo *bo,
				 uint32_t vm_flags,
				 uint64_t *flags)
{
	switch (vm_flags & AMDGPU_VM_MTYPE_MASK) {
	case AMDGPU_VM_MTYPE_UC:
		*flags = AMDGPU_PTE_MTYPE_NV10(*flags, MTYPE_UC);
		break;
	default:
		*flags = AMDGPU_PTE_MTYPE_NV10(*flags, MTYPE_NC);
		break;
	}

	if (bo && bo->flags & AMDGPU_GEM_CREATE_COHERENT)
		*flags = AMDGPU_PTE_MTYPE_NV10(*flags, MTYPE_UC);
}
""",
}

# no kernel has it: both parameters, a tree where the facts of two coarse-mtype variants hold
GET_VM_PTE["mapping+vm_flags"] = GET_VM_PTE["vm_flags"].replace(
    "struct amdgpu_vm *vm,", "struct amdgpu_bo_va_mapping *mapping, struct amdgpu_vm *vm,")

# KFD's get_pte_flags(): before 6.2 it picks UC for coherent allocations itself
KFD_MTYPE = {
    "picks": "mapping_flags |= coherent ?\n\t\tAMDGPU_VM_MTYPE_UC : AMDGPU_VM_MTYPE_NC;",
    "default": "mapping_flags |= AMDGPU_VM_MTYPE_DEFAULT;",
}

# how kfd_create_vcrat_image_gpu() gets the memory info: through kgd before 5.17
CRAT_MEM_INFO = {
    "kgd": "amdgpu_amdkfd_get_local_mem_info(kdev->kgd, &local_mem_info);",
    "adev": "amdgpu_amdkfd_get_local_mem_info(kdev->adev, &local_mem_info);",
    # the middle of the kgd_dev removal: both
    "kgd+adev": "amdgpu_amdkfd_get_local_mem_info(kdev->adev, &local_mem_info);\n"
                "\tcheck(kdev->kgd);",
}

# the call in amdgpu_pci_probe(): ent->driver_data directly for most of 5.10.y
PROBE_LOAD = {
    "flags": "ret = amdgpu_driver_load_kms(adev, flags);",
    "driver_data": "ret = amdgpu_driver_load_kms(adev, ent->driver_data);",
}

# the end of amdgpu_init(): a proposed fix unwinds on failure
INIT_REGISTER = {
    "return": "return pci_register_driver(&amdgpu_kms_pci_driver);",
    "unwind": "r = pci_register_driver(&amdgpu_kms_pci_driver);\n\tif (r)\n\t\tgoto error_pci_register;\n\n\treturn 0;",
}

# the shapes of each generation (what the top Makefile's version alone would suggest)
SHAPES = {
    "5.10": dict(gmc="mapping", kfd="picks", crat="kgd", probe="driver_data", init="return"),
    "6.1": dict(gmc="mapping", kfd="picks", crat="adev", probe="flags", init="return"),
    "6.2": dict(gmc="mapping-uc", kfd="default", crat="adev", probe="flags", init="return"),
    "6.18": dict(gmc="vm_flags", kfd="default", crat="adev", probe="flags", init="return"),
}


def make_tree(root: Path, version: str = "6.1.192", shape: str = "6.1", *, omit: str | None = None,
              missing_names: set[str] = frozenset(), **forms) -> Path:
    """Write a fake tree for `version` ("7.3-rc2" style for a release candidate) under root, its hooked
    places in the forms of SHAPES[shape], each overridable: gmc=, kfd=, crat=, probe=, init=.

    omit: the name of a function to leave out, to see the renderer refuse.
    missing_names: names the tree's headers do not declare; every other name the series uses is
    declared in NAMES_HEADER.
    """
    forms = {**SHAPES[shape], **forms}
    base, _, rc = version.partition("-")
    major, minor, *rest = base.split(".")
    files = {
        "Makefile": (
            "# SPDX-License-Identifier: GPL-2.0\n"
            f"VERSION = {major}\nPATCHLEVEL = {minor}\nSUBLEVEL = {rest[0] if rest else 0}\n"
            f"EXTRAVERSION = {'-' + rc if rc else ''}\nNAME = Fake\n"
        ),
        f"{AMD}/amdgpu/Makefile": (
            "FULL_AMD_PATH=$(srctree)/$(src)/..\n"
            "amdgpu-y += amdgpu_drv.o gmc_v10_0.o\n\n"
            "obj-$(CONFIG_DRM_AMDGPU)+= amdgpu.o\n"
        ),
        f"{AMD}/amdgpu/amdgpu_trace.h": (
            "/* This part must be outside protection */\n"
            "#undef TRACE_INCLUDE_PATH\n"
            "#define TRACE_INCLUDE_PATH ../../drivers/gpu/drm/amd/amdgpu\n"
            "#include <trace/define_trace.h>\n"
        ),
        f"{AMD}/amdgpu/amdgpu_drv.c": """#include "amdgpu.h"
#include "amdgpu_drv.h"

static int amdgpu_pci_probe(struct pci_dev *pdev,
			    const struct pci_device_id *ent)
{
	/* a brace in a comment { and a string "}" must not confuse the scan */
	adev->pdev = pdev;

	""" + PROBE_LOAD[forms["probe"]] + """
	if (ret)
		goto err_pci;
	return 0;
}

static int __init amdgpu_init(void)
{
	amdgpu_amdkfd_init();

	/* let modprobe override vga console setting */
	""" + INIT_REGISTER[forms["init"]] + """
}
""",
        f"{AMD}/amdgpu/gmc_v10_0.c": (
            '#include "amdgpu.h"\n#include "navi10_enum.h"\n\n'
            + GET_VM_PTE[forms["gmc"]]
            + "\nstatic const struct amdgpu_gmc_funcs gmc_v10_0_gmc_funcs = {\n"
            "\t.get_vm_pte = gmc_v10_0_get_vm_pte,\n};\n\n"
            "static void gmc_v10_0_set_gmc_funcs(struct amdgpu_device *adev)\n{\n"
            "\tadev->gmc.gmc_funcs = &gmc_v10_0_gmc_funcs;\n}\n"
        ),
        f"{AMD}/amdgpu/amdgpu_amdkfd_gpuvm.c": """#include "amdgpu_amdkfd.h"

static uint64_t get_pte_flags(struct amdgpu_device *adev, struct kgd_mem *mem)
{
	uint32_t mapping_flags = AMDGPU_VM_PAGE_READABLE;
	uint64_t pte_flags;

	""" + KFD_MTYPE[forms["kfd"]] + """

	pte_flags = amdgpu_gem_va_map_flags(adev, mapping_flags);
	return pte_flags;
}
""",
        f"{AMD}/amdkfd/kfd_crat.c": """#include "kfd_crat.h"
#include "amdgpu.h"

static int kfd_create_vcrat_image_gpu(void *pcrat_image,
				      size_t *size, struct kfd_node *kdev,
				      uint32_t proximity_domain)
{
	""" + CRAT_MEM_INFO[forms["crat"]] + """

	if (local_mem_info.local_mem_size_private == 0)
		ret = fill(HSA_MEM_HEAP_TYPE_FB_PUBLIC);
	else
		ret = fill(HSA_MEM_HEAP_TYPE_FB_PRIVATE);
	return ret;
}
""",
    }
    for rel, text in files.items():
        if omit:
            text = text.replace(omit, omit + "_renamed")
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (root / NAMES_HEADER).parent.mkdir(parents=True, exist_ok=True)
    (root / NAMES_HEADER).write_text(names_header(series_names(root) - set(missing_names)))
    return root
