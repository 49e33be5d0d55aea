"""Progress: a live line on a terminal, a few plain lines in a pipe, objects counted from kbuild's output."""

import io

import hellomod

from rdna1_kmgr.core.progress import Progress, count_sources, is_compiled_object

KBUILD_LINES = [
    "make: Entering directory '/usr/src/linux-headers-6.1.0-56-common'",
    "  CC [M]  /t/drivers/gpu/drm/amd/amdgpu/amdgpu_drv.o",
    "  CC [M]  /t/drivers/gpu/drm/amd/amdgpu/../display/dc/core/dc.o",
    "  AS [M]  /t/drivers/x/entry.o",
    "  LD [M]  /t/drivers/gpu/drm/amd/amdgpu/amdgpu.o",
    "  MODPOST /t/drivers/gpu/drm/amd/amdgpu/Module.symvers",
    "  CC [M]  /t/drivers/gpu/drm/amd/amdgpu/amdgpu.mod.o",
    "  LD [M]  /t/drivers/gpu/drm/amd/amdgpu/amdgpu.ko",
    "/t/x.c:1:1: error: CC [M] in a message is not a compiled object",
]


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_compiled_objects_are_kbuilds_cc_and_as_lines():
    assert [is_compiled_object(line) for line in KBUILD_LINES] == [
        False,
        True,
        True,
        True,
        False,
        False,
        True,
        False,
        False,
    ]


def test_a_pipe_gets_a_few_plain_lines():
    out, clock = io.StringIO(), FakeClock()
    progress = Progress("building amdgpu", total=8, stream=out, live=False, clock=clock)
    for _ in range(8):
        clock.now += 10
        progress.advance()
    progress.finish()
    lines = out.getvalue().splitlines()
    assert lines == [
        "building amdgpu: started, 8 objects to go",
        "building amdgpu: 2/8 objects, 0:20",
        "building amdgpu: 4/8 objects, 0:40",
        "building amdgpu: 6/8 objects, 1:00",
        "building amdgpu: done, 8/8 objects in 1:20",
    ]
    assert "\r" not in out.getvalue()


def test_a_pipe_without_a_total_reports_now_and_then():
    out, clock = io.StringIO(), FakeClock()
    progress = Progress("unpacking", stream=out, live=False, plain_interval=30, clock=clock, unit="MB")
    for _ in range(100):
        clock.now += 1
        progress.advance()
    progress.finish()
    lines = out.getvalue().splitlines()
    assert lines[0] == "unpacking: started"
    assert lines[1:4] == ["unpacking: 30 MB, 0:30", "unpacking: 60 MB, 1:00", "unpacking: 90 MB, 1:30"]
    assert lines[-1] == "unpacking: done, 100 MB in 1:40"


def test_a_terminal_gets_one_redrawn_line_with_the_elapsed_time():
    out, clock = io.StringIO(), FakeClock()
    progress = Progress("building amdgpu", total=700, stream=out, live=True, clock=clock)
    for line in KBUILD_LINES:
        clock.now += 0.5
        progress.feed(line)
    clock.now += 61
    progress.tick()
    progress.finish("done")
    text = out.getvalue()
    assert text.count("\n") == 1  # only the final line ends a line
    assert "\r\033[Kbuilding amdgpu: 4/700 objects, 1:05" in text
    # done: the estimated total (an upper bound) gives way to what was compiled
    assert text.endswith("\r\033[Kbuilding amdgpu: done, 4/4 objects in 1:05\n")


def test_more_objects_than_estimated_never_show_more_done_than_the_total():
    out = io.StringIO()
    progress = Progress("building", total=2, stream=out, live=False)
    for _ in range(3):
        progress.advance()
    progress.finish("failed")
    assert out.getvalue().splitlines()[-1].startswith("building: failed, 3/3 objects")


def test_a_build_that_ends_below_the_estimate_ends_at_n_of_n():
    """kbuild compiles 696 of the 698 objects the tree names for 6.1: the last line says 696/696."""
    out = io.StringIO()
    progress = Progress("building", total=698, stream=out, live=False)
    for _ in range(696):
        progress.advance()
    progress.finish("done")
    assert out.getvalue().splitlines()[-1].startswith("building: done, 696/696 objects in ")
    failed = Progress("building", total=698, stream=io.StringIO(), live=False)
    failed.advance(3)
    failed.finish("failed")
    assert failed.stream.getvalue().splitlines()[-1].startswith("building: failed, 3/698 objects")


def test_the_total_is_counted_from_the_makefiles_of_the_tree(tmp_path):
    hellomod.write_tree(tmp_path)
    (tmp_path / hellomod.LOCATION / "unused.c").write_text("/* in no Makefile */\n")
    assert count_sources(tmp_path) == 2  # main.c and table.c


def test_every_line_said_inside_reporting_to_goes_to_its_stream_the_downloads_and_the_vm_tests_too(tmp_path, capsys):
    """follow keeps its story this way (issue 21: its log missed the download lines): the real download
    (a file:// URL through tarball_fetch's own loop), the VM test's and the guest kernel's lines."""
    from rdna1_kmgr.core.progress import reporting_to, say
    from rdna1_kmgr.source import tarball_fetch
    from rdna1_kmgr.vm import engine

    tarball = tmp_path / "linux-9.9.tar.xz"
    tarball.write_bytes(b"\0" * (3 * 1024 * 1024 + 5))
    story = io.StringIO()
    with reporting_to(story):
        tarball_fetch._download(tarball.as_uri(), tmp_path / "copy.tar.xz")
        engine.say("booting")
        say("a line")
    say("after")
    lines = story.getvalue().splitlines()
    download = [line for line in lines if line.startswith("downloading copy.tar.xz: ")]
    assert download[0] == "downloading copy.tar.xz: started, 4 MB to go"
    assert download[-1].startswith("downloading copy.tar.xz: done, 4/4 MB in ")
    assert lines[len(download) :] == ["vm-test: booting", "a line"]
    assert capsys.readouterr().err == "after\n"  # outside it: stderr, as before
