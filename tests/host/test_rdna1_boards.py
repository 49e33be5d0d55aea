"""The boards the tool lists, pinned by literals copied by hand from amdgpu_drv.c's pciidlist (Debian's 6.1.192,
lines 1924-1946: CHIP_NAVI10, CHIP_NAVI14, CHIP_NAVI12), never from the module under test."""

from rdna1_kmgr.host import rdna1_boards

NAVI10 = (0x7310, 0x7312, 0x7318, 0x7319, 0x731A, 0x731B, 0x731E, 0x731F)
NAVI14 = (0x7340, 0x7341, 0x7347, 0x734F)
NAVI12 = (0x7360, 0x7362)


def test_every_rdna1_id_of_the_kernel_is_listed_with_its_chip():
    assert rdna1_boards.RDNA1_IDS == tuple(sorted(NAVI10 + NAVI14 + NAVI12))
    for ids, chip in ((NAVI10, "navi10"), (NAVI14, "navi14"), (NAVI12, "navi12")):
        assert [rdna1_boards.chip_of(i) for i in ids] == [chip] * len(ids)
        assert all(rdna1_boards.is_rdna1(0x1002, i) for i in ids)
    assert rdna1_boards.chip_of(0x73BF) is None and not rdna1_boards.is_rdna1(0x1002, 0x73BF)  # Navi21: RDNA2
    assert not rdna1_boards.is_rdna1(0x10DE, 0x731F)
