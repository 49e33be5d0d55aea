"""Fixtures shared by the test suite: real Debian kernel sources and real kernel headers.

Real sources are fetched from the system's apt archive through rdna1_kmgr.source.debian_archive and unpacked through
rdna1_kmgr.source.kernel_source, into a persistent test cache that outlives test runs:

    $RDNA1_KMGR_TEST_CACHE (default /var/cache/rdna1-kmgr-tests)
        apt/<suite>/   private package lists, refreshed when a day old
        debs/          the linux-source .debs (~140-165 MB each)
        src/<version>/ the unpacked amd subsets (~410-540 MB each)

The first run downloads and unpacks (a few seconds to download each .deb here, ~15-25 s to unpack); later
runs only ask the cached lists which version is current and find it unpacked. Several sessions may share the
cache at once: entries are locked and published atomically.

Every test that uses one of these fixtures is marked `realsource` (deselect with -m "not realsource").
"""

import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import second_lane

# The helper modules the test modules share (never another test module): their asserts get pytest's messages too
pytest.register_assert_rewrite(
    "doctor_checks",
    "install_checks",
    "install_system",
    "kernel_plans",
    "kernel_style",
    "layout_facts",
    "series_checks",
    "source_fixtures",
    "vm_fixtures",
)

from rdna1_kmgr.core import tool_env  # noqa: E402
from rdna1_kmgr.modbuild import prerequisites  # noqa: E402
from rdna1_kmgr.source import debian_archive, kernel_source  # noqa: E402

# built_module_61 / built_module_612: one real amdgpu build per session, shared by every test module
# wholesystem first: build_fixtures imports it, and pytest rewrites a plugin's asserts only when it imports it
pytest_plugins = [
    "wholesystem",
    "build_fixtures",
    "rocm_fixtures",
    "torch_fixtures",
]

TEST_CACHE_ENV = "RDNA1_KMGR_TEST_CACHE"
DEFAULT_TEST_CACHE = "/var/cache/rdna1-kmgr-tests"

# Fixtures that reach the Debian archive (and, for headers, install packages on this machine).
REAL_FIXTURES = {
    "real_source_510",
    "real_source_61",
    "real_source_612",
    "real_source_72",
    "real_source_7x",
    "headers_61",
    "headers_612",
    "persistent_cache",
    "debian_rocm",
}


# Tests that need a kernel whose image package is not installed run first: later tests install one (the real
# install tests, and the 6.12 headers, which depend on their image) and purge what they installed only when done.
RUN_FIRST = ("test_vm_test_yes_passes_for_a_kernel_whose_image_is_not_installed",)
# The real kernel upgrade purges the 6.12 kernel, and with it the session's shared 6.12 DKMS build, as a
# purge must: it runs after every other test that uses that build.
RUN_LAST = ("test_apt_installing_a_new_kernel_patches_it_and_purging_it_cleans_up",)


@pytest.hookimpl(trylast=True)  # after -m and -k deselected theirs: the second lane takes only what is left
def pytest_collection_modifyitems(config, items):
    for item in items:
        if REAL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.realsource)
    # The Debian 13 tests run after all the others (RUN_LAST too: they share nothing with it): by then
    # tests/cache_warmer.py, started when the session begins, has filled their caches in the background. A root
    # session that holds other tests too hands them, and the `second_lane` ones, to a second pytest beside it
    # instead (tests/second_lane.py).
    items.sort(
        key=lambda item: (
            item.originalname not in RUN_FIRST,
            item.get_closest_marker("debian13") is not None,
            item.originalname in RUN_LAST,
        )
    )
    moved = second_lane.moved_items(config, items)
    if moved:
        items[:] = [item for item in items if item not in moved]
        setattr(config, LANE_ITEMS, moved)


LANE_ITEMS = "_rdna1_kmgr_lane_items"
LANE = "_rdna1_kmgr_lane"
WARMER = "_rdna1_kmgr_cache_warmer"
WARMER_OFF_ENV = "RDNA1_KMGR_TEST_NO_WARMER"


# What the cache warmer fills: a session with a test that uses one of these starts it.
WARMED_FIXTURES = {"wholesystem_image_61", "wholesystem_uefi_sb_image_61", "wholesystem_image_trixie"}


MADE_MARKER = "_rdna1_kmgr_made_test_marker"


def pytest_sessionstart(session):
    """A test run root set up (core/tool_env.py): the tool honours its test switches (a crash point, the tests'
    apt configuration) only while this root-owned marker exists; removed when the session ends."""
    if os.environ.get(second_lane.CHILD_ENV):
        second_lane.follow_the_first_session()
    if os.geteuid() != 0 or tool_env.test_run():
        return
    tool_env.TEST_MARKER.write_text("rdna1-kmgr's test session: the tool honours its test switches\n")
    tool_env.TEST_MARKER.chmod(0o644)
    setattr(session.config, MADE_MARKER, True)


def pytest_collection_finish(session):
    """Start the cache warmer when the session has whole-system tests (as root: they need it anyway), then the
    second lane (tests/second_lane.py) when this session handed it tests."""
    _start_cache_warmer(session)
    moved = getattr(session.config, LANE_ITEMS, [])
    if moved:
        lane = second_lane.start(session.config, moved, Path(tempfile.mkdtemp(prefix="rdna1-kmgr-tests-")))
        setattr(session.config, LANE, lane)
        _say(session.config, f"{lane.tests} tests: a second pytest beside this one (log: {lane.log})")


def _say(config: pytest.Config, line: str) -> None:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(line)


def _start_cache_warmer(session: pytest.Session) -> None:
    items = session.items + getattr(session.config, LANE_ITEMS, [])
    wanted = any(
        item.get_closest_marker("debian13") or WARMED_FIXTURES & set(getattr(item, "fixturenames", ()))
        for item in items
    )
    if not wanted or os.geteuid() != 0 or os.environ.get(WARMER_OFF_ENV) or session.config.option.collectonly:
        return
    log = persistent_cache_root() / "warm" / "warmer.log"
    log.parent.mkdir(exist_ok=True)
    tests = Path(__file__).parent
    warmer = subprocess.Popen(
        ["ionice", "-c2", "-n7", "nice", "-n19", sys.executable, "-m", "cache_warmer", str(log)],
        cwd=tests,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tests), os.environ.get("PYTHONPATH", "")])},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the session's end stops all of it
    )
    ready = warmer.stdout.readline().strip()
    warmer.stdout.close()
    if ready == "busy":  # another session's warmer fills the same caches; the tests wait on its locks
        warmer.wait()
        return
    if ready != "ready":
        warmer.wait()
        raise pytest.UsageError(f"the cache warmer did not start (exit status {warmer.returncode}); see {log}")
    setattr(session.config, WARMER, warmer)
    _say(session.config, f"whole-system images and trixie builds: filled in the background (log: {log})")


def pytest_sessionfinish(session, exitstatus):
    """The second lane is waited for (stopped when this session was interrupted) and its failure is this
    session's. The warmer is done when the Debian 13 tests ran; if the session ends first, it is stopped (SIGTERM
    unwinds its mounts and its copy of the image). The test-run marker goes with the session that made it."""
    lane = getattr(session.config, LANE, None)
    if lane is not None:
        second_lane.close_handoff(lane)
        status = second_lane.finish(lane, interrupted=exitstatus == pytest.ExitCode.INTERRUPTED)
        if status != 0 and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if getattr(session.config, MADE_MARKER, False):
        tool_env.TEST_MARKER.unlink(missing_ok=True)
    warmer = getattr(session.config, WARMER, None)
    if warmer is None or warmer.poll() is not None:
        return
    os.killpg(warmer.pid, signal.SIGTERM)
    try:
        warmer.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(warmer.pid, signal.SIGKILL)
        warmer.wait()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The second lane's whole report, after this session's."""
    lane = getattr(config, LANE, None)
    if lane is not None:
        terminalreporter.section(f"the second lane (exit status {lane.process.returncode}, {lane.log})")
        terminalreporter.write(lane.log.read_text())
        # the closing line counts the lane's tests too, under names of their own
        for word, number in second_lane.counts(lane.log).items():
            terminalreporter.stats.setdefault(f"{word} in the second lane", []).extend([lane] * number)


def persistent_cache_root() -> Path:
    """The persistent cache real fixtures fill (created on first use)."""
    root = Path(os.environ.get(TEST_CACHE_ENV, DEFAULT_TEST_CACHE))
    root.mkdir(parents=True, exist_ok=True)
    return root


@contextmanager
def _using_test_cache() -> Iterator[Path]:
    """Point rdna1_kmgr's cache_dir() at the persistent test cache for a while (session fixtures cannot use
    monkeypatch)."""
    root = persistent_cache_root()
    before = os.environ.get("RDNA1_KMGR_CACHE")
    os.environ["RDNA1_KMGR_CACHE"] = str(root)
    try:
        yield root
    finally:
        if before is None:
            del os.environ["RDNA1_KMGR_CACHE"]
        else:
            os.environ["RDNA1_KMGR_CACHE"] = before


@pytest.fixture
def persistent_cache(monkeypatch) -> Path:
    """For one test: rdna1_kmgr's cache_dir() is the persistent test cache (so its apt lists, .debs and
    unpacked trees are shared with the session fixtures below instead of fetched again)."""
    root = persistent_cache_root()
    monkeypatch.setenv("RDNA1_KMGR_CACHE", str(root))
    return root


def current_debian_source(package: str, suite: str) -> Path:
    """The unpacked amd subset of the newest `package` (linux-source-X.Y) Debian `suite` has today."""
    with _using_test_cache():
        version = debian_archive.PrivateArchive(suite).candidate(package)
        if version is None:
            pytest.fail(f"Debian {suite} no longer has {package}; update the fixture to a series it has")
        return kernel_source.fetch_debian_source(version, suite)


@pytest.fixture(scope="session")
def real_source_510() -> Path:
    """linux-source-5.10 from bullseye-security (5.10.2xx, Debian 11's kernel), asked of the archive the system
    fetches its own security suite from, through a private apt state (the system's sources stay as they are).
    No headers fixture: for rendering and applying patches only."""
    return current_debian_source("linux-source-5.10", "bullseye-security")


@pytest.fixture(scope="session")
def real_source_61() -> Path:
    """linux-source-6.1 from bookworm-security, the version current today (6.1.192-2 when written):
    a tree with the top Makefile and drivers/gpu/drm/amd. Matches `headers_61`."""
    return current_debian_source("linux-source-6.1", "bookworm-security")


@pytest.fixture(scope="session")
def real_source_612() -> Path:
    """linux-source-6.12 from bookworm-backports (6.12.95-1~bpo12+1 when written). Matches `headers_612`."""
    return current_debian_source("linux-source-6.12", "bookworm-backports")


@pytest.fixture(scope="session")
def real_source_72() -> Path:
    """linux-source-7.2 from sid (7.2.13-1 when written). No headers fixture: sid's need sid's toolchain,
    so this tree is for rendering and applying patches only."""
    return current_debian_source("linux-source-7.2", "sid")


@pytest.fixture(scope="session")
def real_source_7x() -> Path:
    """The linux-source-7.x trixie-backports' `linux-source` metapackage points to (7.3.4 when written): the
    kernel Debian 13's follow story builds (tests/install/test_debian13_story.py). Its headers need trixie's
    toolchain: that compile happens in the story's trixie root."""
    with _using_test_cache():
        depends = debian_archive.PrivateArchive("trixie-backports").fields("linux-source").get("Depends", "")
    match = re.search(r"\blinux-source-(7\.\d+)\b", depends)
    if match is None:
        pytest.skip(f"trixie-backports' linux-source points to no 7.x source today (Depends: {depends!r})")
    return current_debian_source(f"linux-source-{match.group(1)}", "trixie-backports")


def installed_headers(suite: str) -> str:
    """The kernel release `suite`'s linux-headers-amd64 points to today, with its headers, DKMS and the build
    tools installed on this machine (through rdna1_kmgr.modbuild.prerequisites, installing what is missing)."""
    with _using_test_cache():
        krel = debian_archive.current_kernel_abi(suite)
        apt = prerequisites.Apt()
        missing = apt.missing(apt.required(krel))
        if missing and os.geteuid() != 0:
            pytest.skip(f"installing {' '.join(missing)} needs root")
        prerequisites.ensure_prerequisites(krel, yes=True, manager=apt)
    return krel


@pytest.fixture(scope="session")
def kernel_61() -> str:
    """The release "6.1.0-NN-amd64" bookworm-security's metapackage points to (asked through the test cache's own
    apt state; nothing installed)."""
    with _using_test_cache():
        return debian_archive.current_kernel_abi("bookworm-security")


@pytest.fixture(scope="session")
def headers_61() -> str:
    """The release "6.1.0-NN-amd64" bookworm-security's metapackage points to, headers installed
    (/lib/modules/<release>/build exists). Installs packages when missing: root only, skipped otherwise."""
    return installed_headers("bookworm-security")


def previous_abi(release: str, suite: str) -> str:
    """The newest kernel ABI before `release` (6.1.0-56-amd64 -> 6.1.0-55-amd64) whose headers `suite` still
    carries, or skip."""
    base, abi, flavour = release.rsplit("-", 2)
    archive = debian_archive.PrivateArchive(suite)
    with _using_test_cache():
        for number in range(int(abi) - 1, max(int(abi) - 8, 0), -1):
            older = f"{base}-{number}-{flavour}"
            if archive.candidate(f"linux-headers-{older}"):
                return older
    pytest.skip(f"{suite} carries no kernel headers older than {release}")


@pytest.fixture(scope="session")
def headers_61_point_release(headers_61) -> Iterator[tuple[str, str]]:
    """(older, newer): bookworm-security's current 6.1 ABI and the one before it, both headers installed (6.1.0-55
    and -56 when written: the same Linux 6.1.192 under two ABI names). The older headers are purged after the
    session when this fixture installed them, so later tests see the machine's kernels as they were."""
    older = previous_abi(headers_61, "bookworm-security")
    had_it = Path(f"/lib/modules/{older}/build/Makefile").exists()
    with _using_test_cache():
        apt = prerequisites.Apt()
        if apt.missing(apt.required(older)) and os.geteuid() != 0:
            pytest.skip(f"installing the headers of {older} needs root")
        prerequisites.ensure_prerequisites(older, yes=True, manager=apt)
    yield older, headers_61
    if not had_it:
        common = older.rsplit("-", 1)[0] + "-common"
        subprocess.run(
            ["apt-get", "purge", "-y", "-q", f"linux-headers-{older}", f"linux-headers-{common}"],
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
            capture_output=True,
            check=True,
        )


@pytest.fixture(scope="session")
def headers_612() -> str:
    """The release "6.12.NN+deb12-amd64" bookworm-backports' metapackage points to, headers installed from
    bookworm-backports (adding /etc/apt/sources.list.d/rdna1-kmgr-backports.sources if the system does not
    list backports yet). Installs packages when missing: root only, skipped otherwise."""
    return installed_headers("bookworm-backports")
