"""Finding places in kernel C source by what they are (a function, a statement), never by line number.

Stable point releases move lines and reflow code; anchoring on a function's body and on a statement's
text (compared with white space folded) keeps a hook in place across them. A statement that has had
several forms across the supported series is looked up by all of them (the forms are data, given by the
caller). Each lookup raises AnchorNotFound naming the file and what was missing, so a renderer can refuse
with one clear line.

Text is the file's bytes decoded without newline translation: a CRLF file keeps its '\r' before every
'\n', and every span here ends after the '\n' (so after the '\r' too).
"""

import re
from dataclasses import dataclass


class AnchorNotFound(Exception):
    def __init__(self, path: str, what: str):
        super().__init__(f"{path}: {what} not found")
        self.path = path
        self.what = what


class AnchorMisplaced(AnchorNotFound):
    """The anchor was found, but not where the hook needs it (before a statement it must follow)."""

    def __init__(self, path: str, what: str):
        Exception.__init__(self, f"{path}: {what}")
        self.path = path
        self.what = what


@dataclass(frozen=True)
class Span:
    start: int  # offset of the first character
    end: int  # offset just past the last character


def _skip_literal(text: str, i: int) -> int:
    """Offset past the comment, string or char literal starting at i (or i itself if none starts there)."""
    if text.startswith("/*", i):
        end = text.find("*/", i + 2)
        return len(text) if end < 0 else end + 2
    if text.startswith("//", i):
        end = text.find("\n", i)
        return len(text) if end < 0 else end
    if text[i] in "\"'":
        quote, j = text[i], i + 1
        while j < len(text) and text[j] != quote:
            j += 2 if text[j] == "\\" else 1
        return j + 1
    return i


def matching_brace(text: str, open_at: int) -> int:
    """Offset of the '}' closing the '{' at open_at, skipping comments and literals."""
    depth, i = 0, open_at
    while i < len(text):
        skipped = _skip_literal(text, i)
        if skipped != i:
            i = skipped
            continue
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise ValueError("unbalanced braces")


def definition(text: str, path: str, name: str) -> Span:
    """The whole top-level definition of function or initialised variable `name`, from its first line
    to its closing '}' (or '};').

    A definition starts at the beginning of a line (kernel style) and is followed by '{' before any ';',
    which tells it apart from prototypes and calls.
    """
    head = re.compile(rf"^[A-Za-z_][^;{{}}()]*\b{re.escape(name)}\s*(\([^;{{]*?\))?\s*(=\s*)?\{{", re.M | re.S)
    for match in head.finditer(text):
        close = matching_brace(text, match.end() - 1)
        end = close + 1
        if text.startswith(";", end):
            end += 1
        return Span(match.start(), end)
    raise AnchorNotFound(path, f"function {name}()")


def parameters(text: str, path: str, function: str) -> Span:
    """The inside of a function definition's parameter list: from after '(' to its ')'."""
    whole = definition(text, path, function)
    head = text[whole.start : text.index("{", whole.start)]
    open_at = head.find("(")
    if open_at < 0:  # an initialised variable, not a function
        raise AnchorNotFound(path, f"parameter list of {function}()")
    depth = 0
    for i in range(open_at, len(head)):
        depth += {"(": 1, ")": -1}.get(head[i], 0)
        if depth == 0:
            return Span(whole.start + open_at + 1, whole.start + i)
    raise AnchorNotFound(path, f"parameter list of {function}()")


def body(text: str, path: str, function: str) -> Span:
    """The inside of a function's braces: from after '{' to the closing '}'."""
    whole = definition(text, path, function)
    open_at = text.index("{", whole.start)
    return Span(open_at + 1, matching_brace(text, open_at))


def _folded(statement: str) -> re.Pattern:
    """A pattern matching `statement` with any run of white space (including none around punctuation),
    whole words at its ends (`kdev->adev` is not found in `kdev->adevice`)."""
    tokens = re.findall(r"\w+|\S", statement)
    pattern = r"\s*".join(re.escape(tok) for tok in tokens)
    if tokens and re.match(r"\w", tokens[0]):
        pattern = r"(?<!\w)" + pattern
    if tokens and re.match(r"\w", tokens[-1]):
        pattern += r"(?!\w)"
    return re.compile(pattern)


_COMMENTS = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)


def without_comments(text: str) -> str:
    """The text with every comment blanked to spaces (newlines kept): same length, same offsets, so a
    search for code is not fooled by a comment that mentions it."""
    return _COMMENTS.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def find(text: str, span: Span, snippet: str) -> int:
    """Offset of the first occurrence of `snippet` (white space folded) within span, or -1."""
    match = _folded(snippet).search(text, span.start, span.end)
    return match.start() if match else -1


def statement(text: str, path: str, function: str, forms: tuple[str, ...] | list[str] | str) -> Span:
    """The first occurrence inside `function` of a statement in any of its accepted `forms`, extended to
    whole lines. Forms are the shapes one statement has had across kernel releases; the earliest match in
    the body wins, so a form that happens to be a prefix of another cannot move the anchor."""
    forms = (forms,) if isinstance(forms, str) else tuple(forms)
    inside = body(text, path, function)
    found = [m for m in (_folded(f).search(text, inside.start, inside.end) for f in forms) if m]
    if not found:
        said = " or ".join(f"`{f}`" for f in forms)
        raise AnchorNotFound(path, f"statement {said} in {function}()")
    match = min(found, key=lambda m: m.start())
    start = text.rfind("\n", 0, match.start()) + 1
    end = text.find("\n", match.end())
    return Span(start, len(text) if end < 0 else end + 1)


def check_follows(
    text: str, path: str, function: str, anchor: Span, anchor_forms: tuple[str, ...], forms: tuple[str, ...]
) -> None:
    """Check that the statement anchored at `anchor` comes after every occurrence inside `function` of a
    statement in any of its `forms` (what the hook reads is computed there; comments are not code).
    AnchorMisplaced, in one line, when the function has none before the anchor or one after it: the anchor
    found is not the statement the hook was written for."""
    inside = body(text, path, function)
    code = without_comments(text)
    found = [m for f in forms for m in _folded(f).finditer(code, inside.start, inside.end)]
    said, anchor_said = " or ".join(f"`{f}`" for f in forms), f"`{anchor_forms[0]}`"
    if not [m for m in found if m.end() <= anchor.start]:
        raise AnchorMisplaced(path, f"{function}() has no {said} before the hook's anchor {anchor_said}")
    late = [m for m in found if m.end() > anchor.start]
    if late:
        raise AnchorMisplaced(
            path,
            f"{function}() has {said} again after the hook's anchor {anchor_said}: the hook must follow every "
            "one of them",
        )


def comment_above(text: str, offset: int) -> int:
    """Start of the comment block directly above the line at offset (offset itself if none), so an
    insertion does not come between a statement and the comment that explains it."""
    lines = text[:offset].splitlines(keepends=True)
    start = offset
    while lines:
        stripped = lines[-1].strip()
        if not stripped.startswith(("/*", "*", "//")):
            break
        start -= len(lines.pop())
    return start


def top_line(text: str, path: str, line: str) -> Span:
    """A whole top-level line, e.g. a Makefile rule, matched with white space folded."""
    match = re.compile(r"^" + _folded(line).pattern + r"[ \t]*\r?$", re.M).search(text)
    if not match:
        raise AnchorNotFound(path, f"line `{line}`")
    return Span(match.start(), min(match.end() + 1, len(text)))


def after_includes(text: str, path: str) -> int:
    """Offset just after the last #include line of the file's leading include block."""
    last = None
    for match in re.finditer(r"^#include\s+[<\"][^>\"]+[>\"][^\n]*\n", text, re.M):
        last = match
    if last is None:
        raise AnchorNotFound(path, "#include block")
    return last.end()


def indentation_at(text: str, offset: int) -> str:
    """The leading white space of the line containing offset."""
    start = text.rfind("\n", 0, offset) + 1
    line = text[start:]
    return line[: len(line) - len(line.lstrip(" \t"))]
