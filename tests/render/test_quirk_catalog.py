"""The catalog's `needed_when`: cwsr-size is left out in one line where the kernel has nothing for it to fix, and
where upstream already accepts ROCm's CWSR size (a covering BO mapping, or gfx10 sized for 40 waves)."""

from rdna1_kmgr.render import quirk_catalog

QUEUE = "drivers/gpu/drm/amd/amdkfd/kfd_queue.c"
# The three functions as Debian's 6.12 has them (kfd_queue.c, read by hand), cut to the lines the facts read.
STOCK = """
int kfd_queue_buffer_get(struct amdgpu_vm *vm, void __user *addr, struct amdgpu_bo **pbo, u64 expected_size)
{
	if (user_addr != mapping->start ||
	    (size != 0 && user_addr + size - 1 != mapping->last)) {
		goto out_err;
	}
	return 0;
}

int kfd_queue_acquire_buffers(struct kfd_process_device *pdd, struct queue_properties *properties)
{
	err = kfd_queue_buffer_get(vm, (void *)properties->ctx_save_restore_area_address,
				   &properties->cwsr_bo, total_cwsr_size);
	return err;
}

void kfd_queue_ctx_save_restore_size(struct kfd_topology_device *dev)
{
	wave_num = (gfxv < 100100) ?	/* GFX_VERSION_NAVI10 */
		    min(cu_num * 40, props->array_count / props->simd_arrays_per_engine * 512)
		    : cu_num * 32;
}
"""


def why_left_out(text: str | None) -> str | None:
    cwsr = quirk_catalog.load_quirks()["cwsr-size"]
    return cwsr.not_needed(lambda rel: text if rel == QUEUE else None)


def test_stock_6_12_needs_cwsr_size():
    assert why_left_out(STOCK) is None


def test_a_kernel_without_the_check_has_nothing_to_fix():
    assert why_left_out(None) == f"nothing to fix on this kernel: {QUEUE} not found"


def test_a_covering_mapping_check_means_upstream_already_accepts_rocms_size():
    relaxed = STOCK.replace("user_addr + size - 1 != mapping->last", "user_addr + size - 1 > mapping->last")
    assert why_left_out(relaxed) == (
        "upstream already accepts ROCm's size: "
        "kfd_queue.c: kfd_queue_buffer_get() does not contain `user_addr + size - 1 != mapping->last`"
    )


def test_gfx10_sized_from_the_topology_means_upstream_already_accepts_rocms_size():
    sized = STOCK.replace(": cu_num * 32;", ": cu_num * props->simd_per_cu * props->max_waves_per_simd;")
    assert why_left_out(sized) == "upstream already accepts ROCm's size: kfd_queue.c does not contain `cu_num * 32;`"


def test_the_32_waves_moved_into_a_helper_as_in_7_2_still_need_cwsr_size():
    """Debian's 7.2 (kfd_queue.c, read by hand) sizes waves in get_num_waves(): still 32 per CU on gfx10."""
    moved = STOCK.replace(
        """	wave_num = (gfxv < 100100) ?	/* GFX_VERSION_NAVI10 */
		    min(cu_num * 40, props->array_count / props->simd_arrays_per_engine * 512)
		    : cu_num * 32;""",
        """	wave_num = get_num_waves(props, gfxv, cu_num);""",
    )
    helper = """
static u32 get_num_waves(struct kfd_node_properties *props, u32 gfxv, u32 cu_num)
{
	u32 wave_num = 0;

	if (gfxv < 100100)
		wave_num = min(cu_num * 40,
				props->array_count / props->simd_arrays_per_engine * 512);
	else if (gfxv < 120500)
		wave_num = cu_num * 32;
	else if (gfxv <= 120501)
		wave_num = cu_num * 64;
	return wave_num;
}
"""
    assert moved != STOCK
    assert why_left_out(helper + moved) is None
