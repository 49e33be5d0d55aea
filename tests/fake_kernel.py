"""A tiny fake kernel tree: the top Makefile and the few amdgpu/amdkfd files the quirks hook, in the shape
of a given kernel generation. Enough for the renderer and `patch`; not for a compiler."""

from pathlib import Path

AMD = "drivers/gpu/drm/amd"

GET_VM_PTE = {
    # 5.10 - 6.17: the MTYPE comes with the mapping
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
}
""",
}


def make_tree(root: Path, version: str = "6.1.192", shape: str = "mapping", *, omit: str | None = None) -> Path:
    """Write a fake tree for `version` ("7.3-rc2" style for a release candidate) under root.

    omit: the name of a function to leave out, to see the renderer refuse.
    """
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

	ret = amdgpu_driver_load_kms(adev, flags);
	if (ret)
		goto err_pci;
	return 0;
}

static int __init amdgpu_init(void)
{
	amdgpu_amdkfd_init();

	/* let modprobe override vga console setting */
	return pci_register_driver(&amdgpu_kms_pci_driver);
}
""",
        f"{AMD}/amdgpu/gmc_v10_0.c": (
            '#include "amdgpu.h"\n#include "navi10_enum.h"\n\n'
            + GET_VM_PTE[shape]
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

	mapping_flags |= AMDGPU_VM_MTYPE_NC;

	pte_flags = amdgpu_gem_va_map_flags(adev, mapping_flags);
	return pte_flags;
}
""",
        f"{AMD}/amdgpu/amdgpu.h": """#ifndef __AMDGPU_H__
#define __AMDGPU_H__

struct amdgpu_device;

struct amdgpu_device {
	struct device			*dev;
	struct pci_dev			*pdev;

	bool                            dc_enabled;
};

#endif
""",
        f"{AMD}/amdgpu/amdgpu_amdkfd.c": """#include "amdgpu_amdkfd.h"

void amdgpu_amdkfd_get_local_mem_info(struct amdgpu_device *adev,
				      struct kfd_local_mem_info *mem_info)
{
	memset(mem_info, 0, sizeof(*mem_info));

	mem_info->local_mem_size_public = adev->gmc.visible_vram_size;
	mem_info->local_mem_size_private = adev->gmc.real_vram_size -
						adev->gmc.visible_vram_size;
	mem_info->vram_width = adev->gmc.vram_width;
}
""",
        f"{AMD}/amdkfd/kfd_crat.c": """#include "kfd_crat.h"
#include "amdgpu.h"

static int kfd_create_vcrat_image_gpu(void *pcrat_image,
				      size_t *size, struct kfd_node *kdev,
				      uint32_t proximity_domain)
{
	local_mem_info = kdev->local_mem_info;

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
    return root
