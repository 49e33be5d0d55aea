"""Driving shim's MokManager over a UEFI guest's serial console, as an owner at the keyboard would.

OVMF mirrors its text console on the serial port as a VT100 terminal: the screen arrives as text with escape
sequences (cursor moves, colours) in between, and keys go back as bytes (arrows are ESC [ A / ESC [ B, Enter is
a carriage return). The driver reads the screen text since its last key press, waits for each prompt with a
time limit, and fails with the end of the console when a prompt never comes.

The owner's round after `mokutil --import` (or `--delete`) and a reboot:

    "Press any key to perform MOK management"  any key (shim waits 10 s, then boots on)
    "Perform MOK management" menu              down to "Enroll MOK" (or "Delete MOK"), Enter
    "[Enroll MOK]" ("View key 0", "Continue")  down to "Continue", Enter
    "Enroll the key(s)?" ("No", "Yes")         down to "Yes", Enter
    "Password:"                                the one-time password given to mokutil, Enter
    "Perform MOK management" with "Reboot"     Enter: the firmware resets (QEMU, with -no-reboot, exits)
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from wholesystem import GuestConsole

DOWN = b"\x1b[B"
UP = b"\x1b[A"
ENTER = b"\r"
NUDGES = 4  # times a menu whose last entry never showed is asked to draw again
# CSI sequences (cursor, colours, erase) and the character-set switches a VT100 terminal driver sends.
_ESCAPES = re.compile(r"\x1b(\[[0-9;?]*[A-Za-z]|[()][0-9A-B]|[=>])")
# Every entry shim's main menu can have, to find where the wanted one is in the menu drawn.
MAIN_MENU_ENTRIES = (
    "Continue boot",
    "Reboot",
    "Enroll MOK",
    "Delete MOK",
    "Change Secure Boot state",
    "Set MOK password",
    "Clear MOK password",
    "Reset MOK list",
    "Enroll key from disk",
    "Enroll hash from disk",
)


def screen_text(raw: str) -> str:
    """What a person would read: the console's text without the terminal's escape sequences."""
    return _ESCAPES.sub(" ", raw).replace("\r", "")


@dataclass
class MokManager:
    """One MokManager round: `action` is "Enroll MOK" or "Delete MOK"; the screenshot is taken of the main
    menu (the guest's display, over QMP)."""

    action: str
    password: str
    screenshot: Path | None = None
    prompt_timeout: float = 240  # OVMF and shim under TCG: the first prompt comes a minute or two after power-on
    seen: list[str] = field(default_factory=list)  # the prompts met, in order

    def __call__(self, console: GuestConsole) -> None:
        self.console = console
        self.mark = 0  # where in the console's bytes the screen since the last key press begins
        self.wait_for("Press any key to perform MOK management", self.prompt_timeout)
        self.press(ENTER)
        menu = self.drawn("Perform MOK management", "Enroll hash from disk")  # the menu's last entry
        if self.screenshot:
            console.screendump(self.screenshot)
        self.choose(menu, self.action)
        title = "[Enroll MOK]" if self.action == "Enroll MOK" else "[Delete MOK]"
        self.choose(self.drawn(title, "Continue"), "Continue", entries=("View key 0", "Continue"))
        question = "Enroll the key(s)?" if self.action == "Enroll MOK" else "Delete the key(s)?"
        if not self.shows(question, 60):
            # On a busy host the serial port can drop the question's line, which shim draws once: its No and Yes,
            # which only that dialog draws (and redraws when the selection moves), tell that it is there.
            self.seen.append(f"{question} (its line lost on the serial port)")
            self.drawn("No", "Yes")
        else:
            self.drawn(question, "Yes")
        self.press(DOWN)  # "No" is first and selected
        self.press(ENTER)
        self.wait_for("Password")
        for char in self.password:
            self.press(char.encode(), pause=0.3)
        self.press(ENTER)
        self.choose(self.drawn("Perform MOK management", "Reboot"), "Reboot")

    def drawn(self, title: str, last: str) -> str:
        """Wait for a menu or question titled `title` to be drawn down to `last`; its text from the title on.

        QEMU's serial port drops a byte it cannot pass on after a few tries, so on a busy host part of a frame can
        be missing: then moving the selection down and back up (where it was) has the firmware draw the first
        entries again."""
        start = self.mark
        self.wait_for(title)
        for _ in range(NUDGES):
            if self.shows(last, 30):
                break
            self.press(DOWN)
            self.press(UP)
        else:
            self.wait_for(last, 1)  # fails with the console's tail
        time.sleep(1)  # the rest of the frame
        screen = screen_text(self.console.raw()[start:])
        return screen[screen.index(title) :]

    def screen(self) -> str:
        """The screen text since the last key press."""
        return screen_text(self.console.raw()[self.mark :])

    def shows(self, prompt: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while prompt not in self.screen():
            if self.console.closed or time.monotonic() > deadline:
                return False
            time.sleep(0.5)
        self.seen.append(prompt)
        return True

    def wait_for(self, prompt: str, timeout: float = 120) -> None:
        """Wait until `prompt` is on the screen since the last key; fail with the console's tail."""
        if not self.shows(prompt, timeout):
            why = "the guest is gone" if self.console.closed else f"not within {timeout:.0f} s"
            tail = "\n".join(screen_text(self.console.raw()).splitlines()[-40:])
            raise AssertionError(f"MokManager: {prompt!r} never came ({why}); seen {self.seen}; console:\n{tail}")

    def press(self, key: bytes, pause: float = 1.0) -> None:
        self.mark = len(self.console.raw())  # raw bytes: an escape sequence still arriving cannot shift it
        self.console.send(key)
        time.sleep(pause)  # the firmware polls its serial terminal; keys typed too fast run together

    def choose(self, menu: str, entry: str, entries: tuple[str, ...] = MAIN_MENU_ENTRIES) -> None:
        """Move down from the first entry of the menu drawn in `menu` to `entry`, and press Enter. `entries` are in
        the order shim draws them (a redraw can repeat some of them out of order in the text)."""
        order = [e for e in entries if e in menu]
        if entry not in order:
            raise AssertionError(f"MokManager: no {entry!r} in the menu {order}")
        for _ in range(order.index(entry)):
            self.press(DOWN)
        self.press(ENTER)
