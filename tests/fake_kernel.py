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
    added = "".join(
        line[1:]
        for p in patches
        for line in p.text.splitlines(keepends=True)
        if line.startswith("+") and not line.startswith("+++")
    )
    code = name_check.code_of(added)
    code = name_check.expand_pasting(code, name_check.pasting_macros([code]))
    return set(re.findall(r"[A-Za-z_]\w*", code))


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
    "struct amdgpu_vm *vm,", "struct amdgpu_bo_va_mapping *mapping, struct amdgpu_vm *vm,"
)

# KFD's get_pte_flags() and its call in kfd_mem_attach(): before 6.2 it picks UC for coherent allocations
# itself; from 6.18 it takes the VM and returns AMDGPU_VM_* flags
KFD_PTE = {
    "picks": (
        "(struct amdgpu_device *adev, struct kgd_mem *mem)",
        """
	bool coherent = mem->alloc_flags & KFD_IOC_ALLOC_MEM_FLAGS_COHERENT;
	uint32_t mapping_flags = AMDGPU_VM_PAGE_READABLE;
	uint64_t pte_flags;

	mapping_flags |= coherent ?
		AMDGPU_VM_MTYPE_UC : AMDGPU_VM_MTYPE_NC;

	pte_flags = amdgpu_gem_va_map_flags(adev, mapping_flags);
	return pte_flags;
""",
        "get_pte_flags(adev, mem)",
    ),
    "default": (
        "(struct amdgpu_device *adev, struct kgd_mem *mem)",
        """
	uint32_t mapping_flags = AMDGPU_VM_PAGE_READABLE |
				 AMDGPU_VM_MTYPE_DEFAULT;

	return amdgpu_gem_va_map_flags(adev, mapping_flags);
""",
        "get_pte_flags(adev, mem)",
    ),
    "vm": (
        "(struct amdgpu_device *adev, struct amdgpu_vm *vm,\n\t\t\t      struct kgd_mem *mem)",
        """
	uint32_t mapping_flags = AMDGPU_VM_PAGE_READABLE |
				 AMDGPU_VM_MTYPE_DEFAULT;

	return mapping_flags;
""",
        "get_pte_flags(adev, vm, mem)",
    ),
}
# no kernel has it: get_pte_flags() takes the VM while a caller still passes (adev, mem)
KFD_PTE["vm+mem"] = (*KFD_PTE["vm"][:2], "get_pte_flags(adev, mem)")

# amdgpu_amdkfd_gpuvm_alloc_memory_of_gpu() maps KFD's EXT_COHERENT flag (6.8 on, per the catalog)
EXT_COHERENT = """
	if (flags & KFD_IOC_ALLOC_MEM_FLAGS_EXT_COHERENT)
		alloc_flags |= AMDGPU_GEM_CREATE_EXT_COHERENT;"""

# amdgpu_amdkfd_gpuvm_alloc_memory_of_gpu() maps KFD's UNCACHED flag (not in 5.10, per the catalog)
UNCACHED = """
	if (flags & KFD_IOC_ALLOC_MEM_FLAGS_UNCACHED)
		alloc_flags |= AMDGPU_GEM_CREATE_UNCACHED;"""

# amdgpu_amdkfd_get_local_mem_info(), where KFD learns the board's memory: through a struct kgd_dev
# before 5.17, per XCP partition from 6.5 or so
MEM_INFO = {
    "kgd": (
        "(struct kgd_dev *kgd,\n\t\t\t\t      struct kfd_local_mem_info *mem_info)",
        """
	struct amdgpu_device *adev = (struct amdgpu_device *)kgd;

	memset(mem_info, 0, sizeof(*mem_info));
	mem_info->local_mem_size_public = adev->gmc.visible_vram_size;
	mem_info->local_mem_size_private = adev->gmc.real_vram_size -
			adev->gmc.visible_vram_size;
	mem_info->vram_width = adev->gmc.vram_width;
""",
    ),
    "adev": (
        "(struct amdgpu_device *adev,\n\t\t\t\t      struct kfd_local_mem_info *mem_info)",
        """
	memset(mem_info, 0, sizeof(*mem_info));

	mem_info->local_mem_size_public = adev->gmc.visible_vram_size;
	mem_info->local_mem_size_private = adev->gmc.real_vram_size -
						adev->gmc.visible_vram_size;

	mem_info->vram_width = adev->gmc.vram_width;
""",
    ),
    "xcp": (
        "(struct amdgpu_device *adev,\n\t\t\t\t      struct kfd_local_mem_info *mem_info,\n"
        "\t\t\t\t      struct amdgpu_xcp *xcp)",
        """
	memset(mem_info, 0, sizeof(*mem_info));

	if (xcp) {
		mem_info->local_mem_size_private =
				KFD_XCP_MEMORY_SIZE(adev, xcp->id);
	} else {
		mem_info->local_mem_size_public = adev->gmc.visible_vram_size;
		mem_info->local_mem_size_private = adev->gmc.real_vram_size -
						adev->gmc.visible_vram_size;
	}
	mem_info->vram_width = adev->gmc.vram_width;
""",
    ),
}

# where debug_largebar lives: a module parameter (kfd_priv.h's extern), or also a member of struct
# amdgpu_device set from amdgpu.debug_mask (6.11 on, per the catalog)
LARGEBAR_MEMBER = {
    "param": "",
    "debug_mask": "\tbool                            debug_largebar;\n",
}

# what KFD keeps a device's local_mem_info in: nothing before about 6.0 (kfd_dev_is_large_bar() asks
# amdgpu_amdkfd_get_local_mem_info() into a local), then struct kfd_dev, or struct kfd_node per partition
# (6.5 or so)
KFD_NODE = {
    "kfd_dev": """struct kfd_dev {
	struct amdgpu_device *adev;
	struct kfd_local_mem_info local_mem_info;
};
""",
    # 5.10 - 5.16: the device as a struct kgd_dev, no copy of the memory info
    "kfd_dev-kgd": """struct kfd_dev {
	struct kgd_dev *kgd;
	bool use_iommu_v2;
};
""",
    # midway through the kgd_dev removal (5.16 - 5.17): both, no copy of the memory info yet
    "kfd_dev+kgd": """struct kfd_dev {
	struct kgd_dev *kgd;
	struct amdgpu_device *adev;
};
""",
    # 5.17 - about 5.19: adev, no copy of the memory info yet
    "kfd_dev-local": """struct kfd_dev {
	struct amdgpu_device *adev;
};
""",
    "kfd_node": """struct kfd_node {
	struct amdgpu_device *adev;
	struct kfd_local_mem_info local_mem_info;
	struct kfd_dev *kfd;
};

struct kfd_dev {
	struct amdgpu_device *adev;
};
""",
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
OLD = dict(
    gmc="mapping",
    kfd="picks",
    ext=False,
    uncached=True,
    mem_info="adev",
    largebar="param",
    node="kfd_dev",
    probe="flags",
    init="return",
)
SHAPES = {
    "5.10": {**OLD, "mem_info": "kgd", "probe": "driver_data", "node": "kfd_dev-kgd", "uncached": False},
    "6.1": OLD,
    "6.2": {**OLD, "gmc": "mapping-uc", "kfd": "default"},
    "6.12": {
        **OLD,
        "gmc": "mapping-uc",
        "kfd": "default",
        "ext": True,
        "mem_info": "xcp",
        "largebar": "debug_mask",
        "node": "kfd_node",
    },
    "6.18": {
        **OLD,
        "gmc": "vm_flags",
        "kfd": "vm",
        "ext": True,
        "mem_info": "xcp",
        "largebar": "debug_mask",
        "node": "kfd_node",
    },
}


def make_tree(
    root: Path,
    version: str = "6.1.192",
    shape: str = "6.1",
    *,
    omit: str | None = None,
    missing_names: set[str] = frozenset(),
    **forms,
) -> Path:
    """Write a fake tree for `version` ("7.3-rc2" style for a release candidate) under root, its hooked
    places in the forms of SHAPES[shape], each overridable: gmc=, kfd=, ext= (True: EXT_COHERENT known),
    uncached= (True: UNCACHED known), mem_info=, largebar=, node=, probe=, init=.

    omit: the name of a function to leave out, to see the renderer refuse.
    missing_names: names the tree's headers do not declare; every other name the series uses is
    declared in NAMES_HEADER.
    """
    forms = {**SHAPES[shape], **forms}
    pte_parameters, pte_body, pte_call = KFD_PTE[forms["kfd"]]
    mem_info_parameters, mem_info_body = MEM_INFO[forms["mem_info"]]
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

	"""
        + PROBE_LOAD[forms["probe"]]
        + """
	if (ret)
		goto err_pci;
	return 0;
}

static int __init amdgpu_init(void)
{
	amdgpu_amdkfd_init();

	/* let modprobe override vga console setting */
	"""
        + INIT_REGISTER[forms["init"]]
        + """
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
        f"{AMD}/amdgpu/amdgpu_amdkfd_gpuvm.c": (
            '#include "amdgpu_amdkfd.h"\n\n'
            f"static uint64_t get_pte_flags{pte_parameters}\n{{{pte_body}}}\n\n"
            "int amdgpu_amdkfd_gpuvm_alloc_memory_of_gpu(struct amdgpu_device *adev, uint32_t flags)\n{\n"
            "\tu64 alloc_flags = 0;\n\n"
            "\tif (flags & KFD_IOC_ALLOC_MEM_FLAGS_COHERENT)\n"
            "\t\talloc_flags |= AMDGPU_GEM_CREATE_COHERENT;"
            + (UNCACHED if forms["uncached"] else "")
            + (EXT_COHERENT if forms["ext"] else "")
            + "\n\treturn alloc_flags;\n}\n\n"
            "static int kfd_mem_attach(struct amdgpu_device *adev, struct kgd_mem *mem, struct amdgpu_vm *vm)\n{\n"
            f"\tmem->pte_flags = {pte_call};\n\treturn 0;\n}}\n"
        ),
        f"{AMD}/amdgpu/amdgpu.h": """#ifndef __AMDGPU_H__
#define __AMDGPU_H__

struct amdgpu_device;

struct amdgpu_device {
	struct device			*dev;
	struct pci_dev			*pdev;

"""
        + LARGEBAR_MEMBER[forms["largebar"]]
        + """	bool                            dc_enabled;
};

#endif
""",
        f"{AMD}/amdgpu/amdgpu_amdkfd.c": (
            '#include "amdgpu_amdkfd.h"\n\n'
            f"void amdgpu_amdkfd_get_local_mem_info{mem_info_parameters}\n{{{mem_info_body}}}\n"
        ),
        f"{AMD}/amdkfd/kfd_priv.h": (
            "#ifndef KFD_PRIV_H_INCLUDED\n#define KFD_PRIV_H_INCLUDED\n\n"
            "extern int debug_largebar;\n\n" + KFD_NODE[forms["node"]] + "\n"
            "bool kfd_dev_is_large_bar(struct " + re.split(r"[+-]", forms["node"])[0] + " *dev);\n\n#endif\n"
        ),
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
