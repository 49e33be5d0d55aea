"""GRUB's commands run, then the journal checkpointed where they wrote (the power-cut test shows why: GRUB reads
without replaying ext4's journal). tests/core/test_files.py proves the checkpoint itself on a real ext4."""

from pathlib import Path

from rdna1_kmgr.core import runner
from rdna1_kmgr.install import grub_commands, profile_journal, undo


def test_the_folders_are_the_blocks_for_grub_editenv_and_boot_grub_for_update_grub():
    commands = [["update-grub"], ["grub-editenv", "/mnt/sys/boot/grub/grubenv", "set", "a=b"]]
    assert grub_commands.written_folders(commands) == [Path("/boot/grub"), Path("/mnt/sys/boot/grub")]
    assert grub_commands.written_folders([["update-grub"], ["update-grub"]]) == [Path("/boot/grub")]
    assert grub_commands.written_folders([]) == []


def _watch(monkeypatch) -> list:
    events: list = []
    monkeypatch.setattr(grub_commands, "checkpoint_journal", lambda folder: events.append(("checkpoint", folder)))
    return events


def test_the_checkpoint_comes_after_every_command(monkeypatch):
    events = _watch(monkeypatch)
    grub_commands.run(
        [["update-grub"], ["grub-editenv", "/boot/grub/grubenv", "set", "x=1"]], lambda c: events.append(tuple(c))
    )
    assert events == [
        ("update-grub",),
        ("grub-editenv", "/boot/grub/grubenv", "set", "x=1"),
        ("checkpoint", Path("/boot/grub")),
    ]


def test_a_failing_command_leaves_no_checkpoint_and_its_error_goes_up(monkeypatch):
    events = _watch(monkeypatch)

    def failing(command):
        raise RuntimeError(command[0])

    try:
        grub_commands.run([["update-grub"]], failing)
    except RuntimeError as err:
        assert str(err) == "update-grub"
    else:
        raise AssertionError("the command's error was swallowed")
    assert events == []


def test_undo_regenerate_and_write_files_checkpoint_after_their_grub_commands(monkeypatch, tmp_path):
    """The two writers outside the boot guard: rollback's regenerate and the kernel parameter's write_files."""
    events = _watch(monkeypatch)
    monkeypatch.setattr(runner, "run", lambda command, **kw: events.append(tuple(command)))
    regenerate = undo.Regenerate(undo.Writer.FILES, (("update-grub",),))
    assert regenerate.after() == ["update-grub"]
    assert events == [("update-grub",), ("checkpoint", Path("/boot/grub"))]
    events.clear()

    class Journal:
        def record_intent(self, *args, **kw):
            events.append("intent")

        def append(self, record):
            events.append("done")

    said = profile_journal.write_files(Journal(), {tmp_path / "f": b"x"}, after=[["update-grub"]])  # type: ignore[arg-type]
    assert said == [f"wrote {tmp_path / 'f'}", "update-grub"]
    assert events == ["intent", "done", ("update-grub",), ("checkpoint", Path("/boot/grub"))]
