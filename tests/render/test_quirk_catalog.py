"""The catalog's `needed_when` and `fixed_when`: cwsr-size and topology-sizes are left out in one line where the
kernel has nothing for them to fix, and where upstream's own fix is recognised (a covering BO mapping, gfx10 sized
for 40 waves; the two lines of 8fc2796dea6f). A form neither list recognises keeps the quirk (issue 48)."""

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
        "upstream already accepts ROCm's size (a BO mapping that covers KFD's): "
        "kfd_queue.c: kfd_queue_buffer_get() contains `user_addr + size - 1 > mapping->last`"
    )


def test_gfx10_sized_from_the_topology_means_upstream_already_accepts_rocms_size():
    sized = STOCK.replace(": cu_num * 32;", ": cu_num * props->simd_per_cu * props->max_waves_per_simd;")
    assert why_left_out(sized) == (
        "upstream already sizes the debugger area as ROCm does: "
        "kfd_queue.c contains `props->simd_per_cu * props->max_waves_per_simd`"
    )


def test_a_renamed_function_is_not_taken_for_upstream_s_fix():
    """Before issue 48 a kfd_queue_buffer_get renamed (or its check reworded) read as "upstream already accepts
    ROCm's size" and dropped the quirk: only a recognised form may say that."""
    renamed = STOCK.replace("kfd_queue_buffer_get", "kfd_queue_bo_get")
    assert why_left_out(renamed) is None
    reworded = STOCK.replace("user_addr + size - 1 != mapping->last", "mapping->last != user_addr + size - 1")
    assert why_left_out(reworded) is None
    assert why_left_out(STOCK.replace(": cu_num * 32;", ": cu_num * waves_per_cu;")) is None


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


TOPOLOGY = "drivers/gpu/drm/amd/amdkfd/kfd_topology.c"
# Debian 6.12's node_show() and the control-stack check (kfd_topology.c, kfd_queue.c, read by hand), cut to the
# lines the facts read; EXPORT is what upstream 8fc2796dea6f added after num_cp_queues.
CHECK = """
int kfd_queue_acquire_buffers(struct kfd_process_device *pdd, struct queue_properties *properties)
{
	if (properties->ctl_stack_size != topo_dev->node_props.ctl_stack_size) {
		err = -EINVAL;
		goto out_err_unreserve;
	}
}
"""
NODE_SHOW = """
static ssize_t node_show(struct kobject *kobj, struct attribute *attr, char *buffer)
{
	int offs = 0;

	sysfs_show_32bit_prop(buffer, offs, "num_cp_queues",
			      dev->node_props.num_cp_queues);
EXPORT
	return offs;
}
"""
EXPORT = """	sysfs_show_32bit_prop(buffer, offs, "cwsr_size",
			      dev->node_props.cwsr_size);
	sysfs_show_32bit_prop(buffer, offs, "ctl_stack_size",
			      dev->node_props.ctl_stack_size);
"""


def why_sizes_left_out(queue: str | None, topology: str) -> str | None:
    sizes = quirk_catalog.load_quirks()["topology-sizes"]
    return sizes.not_needed(lambda rel: {QUEUE: queue, TOPOLOGY: topology}.get(rel))


def test_a_kernel_that_checks_the_control_stack_and_does_not_print_it_needs_topology_sizes():
    assert why_sizes_left_out(CHECK, NODE_SHOW.replace("EXPORT\n", "")) is None


def test_a_kernel_that_prints_the_sizes_is_upstream_s_fix():
    assert why_sizes_left_out(CHECK, NODE_SHOW.replace("EXPORT\n", EXPORT)) == (
        "the kernel already prints cwsr_size and ctl_stack_size (upstream 8fc2796dea6f): "
        'kfd_topology.c contains `"ctl_stack_size"`'
    )
    # recognised by the key it prints, wherever node_show went
    moved = NODE_SHOW.replace("EXPORT\n", EXPORT).replace("node_show", "kfd_node_props_show")
    assert why_sizes_left_out(CHECK, moved).startswith("the kernel already prints")


def test_a_kernel_without_the_control_stack_check_has_nothing_for_topology_sizes():
    """6.1's kfd_queue.c has no queue buffer checks at all."""
    assert why_sizes_left_out("void print_queue(struct queue *q)\n{\n}\n", NODE_SHOW.replace("EXPORT\n", "")) == (
        "nothing to fix on this kernel: kfd_queue.c does not contain `topo_dev->node_props.ctl_stack_size`"
    )


def test_the_check_moved_to_another_function_still_needs_topology_sizes():
    moved = CHECK.replace("kfd_queue_acquire_buffers", "kfd_queue_check_sizes")
    assert why_sizes_left_out(moved, NODE_SHOW.replace("EXPORT\n", "")) is None
