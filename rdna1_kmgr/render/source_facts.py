"""Facts of a kernel source that choose a quirk's template variant, read from the exact tree being patched.

A version number says little about a distribution kernel: RHEL 9 ships a 5.14 top Makefile over a driver
from 6.x, vendor 5.10.y trees carry fixes from later releases. So a variant never says "Linux >= X"; it
lists what the code it hooks must look like, and the renderer takes the one variant whose facts all hold.

A fact, as written in quirk.toml (`file` relative to the source root; `function` optional for
contains/lacks, which then look at the whole file; text is compared with white space folded, and
comments do not count):

    { file = F, function = FN, contains = "TEXT" }     FN's body (or F) contains TEXT
    { file = F, function = FN, lacks = "TEXT" }        FN's body (or F) does not contain TEXT
    { file = F, function = FN, parameters = "TEXT" }   FN's parameter list contains TEXT

A fact about a function the file does not define does not hold (neither `contains` nor `lacks`).
"""

from collections.abc import Callable
from dataclasses import dataclass

from rdna1_kmgr.source import c_anchors

TESTS = ("contains", "lacks", "parameters")


@dataclass(frozen=True)
class Fact:
    file: str
    test: str  # one of TESTS
    text: str
    function: str | None = None

    @classmethod
    def parse(cls, raw: dict, origin: str) -> "Fact":
        tests = [t for t in TESTS if t in raw]
        unknown = set(raw) - {"file", "function", *TESTS}
        if len(tests) != 1 or unknown or "file" not in raw or (tests == ["parameters"] and "function" not in raw):
            raise ValueError(f"{origin}: fact {raw}: needs `file`, one of {TESTS} (`parameters` with a `function`)")
        return cls(raw["file"], tests[0], raw[tests[0]], raw.get("function"))

    @property
    def where(self) -> str:
        name = self.file.rsplit("/", 1)[-1]
        return f"{name}: {self.function}()" if self.function else name

    def __str__(self) -> str:
        verb = {"contains": "contains", "lacks": "lacks", "parameters": "takes"}[self.test]
        return f"{self.where} {verb} `{self.text}`"

    def check(self, read: Callable[[str], str | None]) -> str | None:
        """None when the fact holds on the tree `read` gives files of, else why not (one phrase)."""
        text = read(self.file)
        if text is None:
            return f"{self.file} not found"
        try:
            if self.test == "parameters":
                assert self.function is not None, "parse lets no `parameters` fact without its `function` through"
                span = c_anchors.parameters(text, self.file, self.function)
            elif self.function:
                span = c_anchors.body(text, self.file, self.function)
            else:
                span = c_anchors.Span(0, len(text))
        except c_anchors.AnchorNotFound as err:
            return f"{err.path}: {err.what} not found"
        found = c_anchors.find(c_anchors.without_comments(text), span, self.text) >= 0
        if found == (self.test != "lacks"):
            return None
        verb = {"contains": "does not contain", "lacks": "contains", "parameters": "does not take"}[self.test]
        return f"{self.where} {verb} `{self.text}`"


def first_failure(facts, read: Callable[[str], str | None]) -> str | None:
    """Why the first of `facts` that does not hold on the tree `read` gives files of fails, or None when all hold."""
    return next((why for why in (fact.check(read) for fact in facts) if why), None)
