"""Whether a rendered series applies to its source with `patch -p1`, proven without changing the source.

The files the series touches are copied into a scratch folder and the patches applied there in series order:
`patch --dry-run` of each patch alone would not see what an earlier patch did to the same file.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

from rdna1_kmgr.core import runner
from rdna1_kmgr.core.errors import SourceError

_TOUCHED = re.compile(r"^--- a/(\S+)", re.M)


def series_names(series_dir: Path) -> list[str]:
    names = [line.strip() for line in (series_dir / "series").read_text().splitlines()]
    return [name for name in names if name and not name.startswith("#")]


def check_applies(tree: Path, series_dir: Path) -> list[str]:
    """Apply the series to a copy of the files it changes; the files, or a SourceError naming the patch."""
    names = series_names(series_dir)
    touched = sorted(
        {rel for name in names for rel in _TOUCHED.findall((series_dir / name).read_text(errors="replace"))}
    )
    with tempfile.TemporaryDirectory(prefix="rdna1-kmgr-apply-") as scratch:
        for rel in touched:
            if (tree / rel).is_file():
                (Path(scratch) / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(tree / rel, Path(scratch) / rel)
        for name in names:
            runner.run(
                ["patch", "-p1", "--batch", "--forward", "--quiet", "-d", scratch, "-i", str(series_dir / name)],
                error=SourceError,
                doing=f"applying {name} to {tree}",
                hint="the series does not fit this source; report it with the source's version",
            )
    return touched
