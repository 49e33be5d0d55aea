"""The rdna1_quirks mask: `install --quirks` parses it once (0x3, 3, 0b11; anything else is one line), and each
place it goes to gets its own documented spelling."""

import pytest
from click.testing import CliRunner

from rdna1_kmgr.cli import main
from rdna1_kmgr.core.errors import UsageError
from rdna1_kmgr.render.quirk_mask import QuirkMask


@pytest.mark.parametrize("text, bits", [("0x12", 0x12), ("0X12", 0x12), ("18", 18), ("0b10010", 18), ("0", 0)])
def test_install_quirks_takes_hex_decimal_and_binary(text, bits):
    assert QuirkMask.parse(text) == QuirkMask(bits)


@pytest.mark.parametrize("text", ["", "crat-mem", "0x", "-1", "0x80000000", "1.5", "0x1 0x2", "012"])
def test_anything_else_is_one_line_naming_what_was_given(text):
    with pytest.raises(UsageError) as err:
        QuirkMask.parse(text)
    assert err.value.line() == f"invalid quirk mask {text!r}: give a number such as 0x1 (see `rdna1-kmgr quirks`)"


def test_the_command_line_refuses_a_bad_mask_before_anything_happens():
    result = CliRunner().invoke(main, ["install", "--quirks", "lots", "--dry-run"])
    assert result.exit_code == 2
    assert "invalid quirk mask 'lots'" in result.output and "Traceback" not in result.output


def test_each_edge_gets_its_own_spelling():
    mask = QuirkMask(0x10)
    # modprobe.d(5): "options modulename option...", an option being name=value
    assert mask.modprobe_options == "options amdgpu rdna1_quirks=0x10"
    # kernel-parameters.txt: a module's parameter on the command line is module.parameter=value
    assert mask.kernel_parameter == "amdgpu.rdna1_quirks=0x10"
    assert str(mask) == "0x10" and mask.parameter == "rdna1_quirks=0x10"
    assert QuirkMask.from_kernel_parameter(mask.kernel_parameter) == mask
    assert QuirkMask.from_kernel_parameter("amdgpu.cwsr_enable=0") is None


def test_the_bits_a_build_lacks():
    assert QuirkMask(0x12).outside(QuirkMask(0x0E)) == QuirkMask(0x10)
    assert QuirkMask(0x06).outside(QuirkMask(0x0E)) == QuirkMask(0)
    with pytest.raises(UsageError):
        QuirkMask(-1)
