"""rdna1_kmgr.core.runner: the one runner of external programs, on real processes.

Sessions (VM runs) are killed whole; one-shot runs raise the project's error kinds with the program's last
stderr line; a timeout stops the program and its children; streams feed and read programs without copies.
"""

import os
import time
from pathlib import Path

import pytest

from rdna1_kmgr.core import process_tree, program_path, runner
from rdna1_kmgr.core.errors import BuildError, HostError

# --- one-shot runs --------------------------------------------------------------------------------------------


def test_a_run_returns_what_the_program_printed():
    result = runner.run(["sh", "-c", "echo out; echo err >&2"])
    assert (result.returncode, result.stdout, result.stderr) == (0, "out\n", "err\n")


def test_a_failure_is_the_error_kind_asked_for_with_the_last_stderr_line():
    with pytest.raises(BuildError) as err:
        runner.run(
            ["sh", "-c", "echo noise >&2; echo 'the real reason' >&2; exit 3"],
            error=BuildError,
            doing="the build",
            hint="read the log",
        )
    assert err.value.line() == "the build failed (exit 3): the real reason: read the log"


def test_check_false_returns_the_failure_instead():
    result = runner.run(["sh", "-c", "exit 4"], check=False)
    assert result.returncode == 4 and not result.ok


def test_a_missing_program_is_one_clear_error():
    with pytest.raises(HostError, match="cannot run no-such-program-here"):
        runner.run(["no-such-program-here", "--version"])


@pytest.mark.system  # killed process trees, waited for: seconds
def test_a_timeout_stops_the_program_and_its_children(tmp_path):
    pidfile = tmp_path / "child"
    with pytest.raises(HostError, match="did not finish within 1 s"):
        runner.run(["sh", "-c", f"sleep 300 & echo $! > {pidfile}; wait"], timeout=1)
    child = int(pidfile.read_text())
    assert not os.path.exists(f"/proc/{child}") or open(f"/proc/{child}/stat").read().split()[2] in "ZX"


def test_lines_arrive_live_and_input_is_fed():
    seen = []
    result = runner.run(["sh", "-c", "cat; echo done >&2"], input="a\nb\n", on_line=seen.append, merge_stderr=True)
    assert seen == ["a", "b", "done"] and result.stdout == "a\nb\ndone\n"


def test_an_argument_is_never_split_or_expanded_by_a_shell(tmp_path):
    odd = "x; touch " + str(tmp_path / "pwned") + " $(id)"
    assert runner.run(["printf", "%s", odd]).stdout == odd
    assert not (tmp_path / "pwned").exists()


def test_every_run_is_logged_with_its_command_line_and_exit(caplog):
    with caplog.at_level("INFO", logger="rdna1_kmgr.runner"):
        runner.run(["sh", "-c", "echo logged-output; exit 0"])
    assert "run: sh -c 'echo logged-output; exit 0'" in caplog.text and "logged-output" in caplog.text


# --- streams --------------------------------------------------------------------------------------------------


def test_pipe_from_streams_bytes_and_raises_on_failure():
    with runner.pipe_from(["sh", "-c", "printf abc"]) as out:
        assert out.read() == b"abc"
    with pytest.raises(HostError, match=r"failed \(exit 2\): broken"):
        with runner.pipe_from(["sh", "-c", "echo broken >&2; exit 2"]) as out:
            out.read()


def test_pipe_from_a_reader_that_stops_early_is_no_failure():
    with runner.pipe_from(["sh", "-c", "yes"]) as out:
        assert out.read(4) == b"y\ny\n"


def test_pipe_into_feeds_a_program_and_reports_its_failure(tmp_path):
    target = tmp_path / "copy"
    with runner.pipe_into(["sh", "-c", f"cat > {target}"]) as sink:
        sink.write(b"payload")
    assert target.read_bytes() == b"payload"
    with pytest.raises(HostError, match="gave up"):
        with runner.pipe_into(["sh", "-c", "echo gave up >&2; exit 1"]) as sink:
            for _ in range(1000):
                sink.write(b"x" * 65536)  # the reader is gone: writing goes on, its exit says why


# --- sessions (VM runs) -----------------------------------------------------------------------------


@pytest.mark.system  # killed process trees, waited for: seconds
def test_a_timeout_kills_every_process_of_the_session(tmp_path):
    outcome = runner.run_session(["sh", "-c", "sleep 300 & sleep 300 & wait"], tmp_path / "out", timeout=1)
    assert outcome.timed_out and outcome.returncode is None
    assert process_tree.session_members(outcome.session) == []


@pytest.mark.system  # killed process trees, waited for: seconds
def test_a_process_ignoring_sigterm_is_killed_all_the_same(tmp_path):
    outcome = runner.run_session(["sh", "-c", "trap '' TERM; sleep 300"], tmp_path / "out", timeout=0.5)
    assert outcome.timed_out and outcome.elapsed >= process_tree._GRACE
    assert process_tree.session_members(outcome.session) == []


def test_a_child_left_behind_after_a_normal_exit_is_swept(tmp_path):
    outcome = runner.run_session(["sh", "-c", "(sleep 300 &); echo bye"], tmp_path / "out", timeout=10)
    assert outcome.returncode == 0 and not outcome.timed_out
    assert process_tree.session_members(outcome.session) == []
    assert (tmp_path / "out").read_text() == "bye\n"


def test_watch_can_stop_a_run_early(tmp_path):
    outcome = runner.run_session(
        ["sh", "-c", "echo ready; sleep 300"], tmp_path / "out", timeout=30, watch=lambda chunk: "ready" in chunk
    )
    assert outcome.stopped_early and outcome.returncode is None
    assert process_tree.session_members(outcome.session) == []


def test_ctrl_c_stops_the_session_and_goes_on_up(tmp_path, monkeypatch):
    def interrupt(chunk):
        raise KeyboardInterrupt

    sessions = []
    real_popen = process_tree.subprocess.Popen

    def recording_popen(*args, **kwargs):
        proc = real_popen(*args, **kwargs)
        sessions.append(proc.pid)
        return proc

    monkeypatch.setattr(process_tree.subprocess, "Popen", recording_popen)
    with pytest.raises(KeyboardInterrupt):
        runner.run_session(
            ["sh", "-c", "echo go; sleep 300 & sleep 300"], tmp_path / "out", timeout=30, watch=interrupt
        )
    assert sessions and process_tree.session_members(sessions[0]) == []


def test_output_survives_a_child_that_reopens_its_stdout(tmp_path):
    """QEMU opens /proc/self/fd/1 for its console; on a plain file that truncated what came before."""
    script = "echo from-the-shell; sleep 0.3; echo from-the-reopen > /proc/self/fd/1"
    runner.run_session(["sh", "-c", script], tmp_path / "out", timeout=10)
    assert (tmp_path / "out").read_text() == "from-the-shell\nfrom-the-reopen\n"


@pytest.mark.system  # killed process trees, waited for: seconds
def test_on_tick_runs_while_the_program_does():
    ticks = []
    runner.run(["sleep", "1.2"], on_tick=lambda: ticks.append(time.monotonic()))
    assert len(ticks) >= 2


def test_a_command_logs_what_it_ran_where_the_log_folder_exists(tmp_path, monkeypatch):
    """Through the real CLI: the command line, the programs it ran and their exits land in commands.log."""
    import logging
    import subprocess
    import sys
    from pathlib import Path

    monkeypatch.setenv("RDNA1_KMGR_LOG", str(tmp_path))
    cli = Path(sys.executable).parent / "rdna1-kmgr"
    subprocess.run([str(cli), "detect"], check=True, capture_output=True, env={**os.environ})
    text = (tmp_path / "commands.log").read_text()
    assert "command: rdna1-kmgr detect" in text
    if runner.which("dkms"):  # detect asks dkms for its version where it is installed
        assert "run: dkms --version" in text and "exit 0 after" in text
    logging.getLogger("rdna1_kmgr").handlers.clear()


def test_no_log_folder_means_no_log_written(tmp_path, monkeypatch):
    import subprocess
    import sys
    from pathlib import Path

    missing = tmp_path / "not-here"
    cli = Path(sys.executable).parent / "rdna1-kmgr"
    subprocess.run(
        [str(cli), "detect"], check=True, capture_output=True, env={**os.environ, "RDNA1_KMGR_LOG": str(missing)}
    )
    assert not missing.exists()


def test_a_system_program_is_found_off_a_normal_users_path():
    """A normal user's PATH on Debian has no sbin folder; modinfo (kmod) lives in /usr/sbin. `status` without sudo
    runs it (found in a newcomer's run: "cannot run modinfo")."""
    if not Path("/usr/sbin/modinfo").exists() and not Path("/sbin/modinfo").exists():
        pytest.skip("kmod's modinfo is not installed in an sbin folder")
    result = runner.run(["modinfo", "--version"], env={"PATH": "/usr/local/bin:/usr/bin:/bin"})
    assert result.ok and "kmod" in result.stdout
    assert runner.which("modinfo") is not None


def test_the_system_program_folders_come_after_a_users_own(monkeypatch):
    """A normal user's PATH on Debian (/etc/profile) has no sbin folder; the tool appends them, never ahead of
    what the user put first and never twice."""
    monkeypatch.setattr(program_path.os, "geteuid", lambda: 1000)
    monkeypatch.setenv("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games")
    program_path.include_system_programs()
    assert (
        os.environ["PATH"] == "/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games:/usr/local/sbin:/usr/sbin:/sbin"
    )
    monkeypatch.setenv("PATH", "/opt/x/bin:/usr/sbin:/usr/bin")
    program_path.include_system_programs()
    assert os.environ["PATH"] == "/opt/x/bin:/usr/sbin:/usr/bin:/usr/local/sbin:/sbin"


def test_under_root_a_folder_someone_else_can_change_leaves_path(monkeypatch, tmp_path):
    """The attack: a root shell (or `sudo -E`) with a user's folder first on PATH, holding a `modinfo` of theirs.
    Under root that folder goes (and relative ones), root's own folders keep their order, and Debian's root PATH
    is there after them: the real modinfo runs."""
    if os.geteuid() != 0:
        pytest.skip("root's PATH")
    users = tmp_path / "home-bin"
    users.mkdir()
    (users / "modinfo").write_text("#!/bin/sh\necho planted\n")
    (users / "modinfo").chmod(0o755)
    os.chown(users, 65534, 65534)  # nobody's, as a user's ~/bin is the user's
    roots = tmp_path / "roots-bin"
    roots.mkdir(mode=0o755)
    monkeypatch.setenv("PATH", f"{users}:.:{roots}:/usr/games:{roots}")
    program_path.include_system_programs()
    assert os.environ["PATH"] == f"{roots}:/usr/games:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert "planted" not in runner.run(["modinfo", "--version"]).stdout
    group_writable = tmp_path / "shared-bin"
    group_writable.mkdir()
    group_writable.chmod(0o775)
    monkeypatch.setenv("PATH", f"{group_writable}:/usr/bin")
    program_path.include_system_programs()
    assert str(group_writable) not in os.environ["PATH"].split(os.pathsep)
