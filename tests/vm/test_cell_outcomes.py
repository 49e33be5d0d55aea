"""What a cell's failure text names: ROCr's and HIP's own messages (ROCr's "Memory access fault by GPU node-N ...
Reason: ..." after a GPU page fault; KfdDriver::CreateQueue's HSA_STATUS_ERROR_OUT_OF_RESOURCES; HIP's "invalid
device function" and "device kernel image is invalid"; MIOpen's "No suitable algorithm")."""

import pytest

from rdna1_kmgr.vm import cell_outcomes


@pytest.mark.parametrize(
    ("text", "outcome"),
    [
        (
            "Memory access fault by GPU node-1 (Agent handle: 0x55d0c0) on address 0x7f0000. Reason: Page not "
            "present or supervisor privilege.",
            "memory-fault",
        ),
        ("hip runtime: HSA_STATUS_ERROR_OUT_OF_RESOURCES: The runtime failed to allocate", "queue-failed"),
        (":0:rocdevice.cpp :2982: Device::acquireQueue: hsa_queue_create failed!", "queue-failed"),
        ("HIP error: invalid device function", "invalid-device-function"),
        ("HIP error: device kernel image is invalid", "kernel-image-invalid"),
        (
            "miopenStatusUnknownError: No suitable algorithm was found to execute the required convolution",
            "not-applicable",
        ),
        ("HIP error: unspecified launch failure", None),
    ],
)
def test_the_text_names_the_outcome(text, outcome):
    assert cell_outcomes.from_text(text) == outcome
