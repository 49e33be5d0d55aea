"""The README stays a page an owner reads in five minutes, and every link between the README and docs/ lands:
the file exists and, for a `#anchor`, a heading of that file makes that anchor (GitHub's rule: lower case,
punctuation dropped, spaces to dashes)."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGES = [
    "README.md",
    "CHANGELOG.md",
    "bench/RESULTS.md",
    *(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md")),
]


def anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)  # no headings inside code blocks
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^#+ (.+)$", text, re.M)}


def test_the_readme_is_at_most_150_lines():
    assert len((REPO / "README.md").read_text().splitlines()) <= 150


def test_every_link_between_the_pages_lands():
    assert len(PAGES) >= 8
    broken = []
    for page in PAGES:
        for link in re.findall(r"\]\(([^)\s]+)\)", (REPO / page).read_text()):
            if re.match(r"[a-z]+:", link):
                continue
            path, _, anchor = link.partition("#")
            target = (REPO / page).parent / path if path else REPO / page
            if not target.exists():
                broken.append(f"{page}: {link}: no such file")
            elif anchor and target.suffix == ".md" and anchor not in anchors(target):
                broken.append(f"{page}: {link}: no such heading")
    assert broken == []
