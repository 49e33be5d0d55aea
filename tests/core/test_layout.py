"""The package's layout keeps its promises: stages import only earlier stages, one module runs programs,
no module grows past what a reader takes in at once."""

import ast
from pathlib import Path

import rdna1_kmgr

PACKAGE = Path(rdna1_kmgr.__file__).parent
# The flow, earliest first (userspace: the user-space profiles as data, beside the quirk catalog). commands/
# and cli.py sit on top of every stage.
STAGES = [
    "core",
    "host",
    "source",
    "render",
    "userspace",
    "modbuild",
    "vm",
    "install",
    "follow",
    "doctor",
    "experiment",
    "commands",
]
MAX_LINES = 650  # lines as `ruff format` lays them out (issue 21: modules are cut by concept, not by this cap)


def modules():
    return sorted(
        p for p in PACKAGE.rglob("*.py") if not {"kmod", "dkms", "qemu", "hooks"} & set(p.relative_to(PACKAGE).parts)
    )


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def stage_of(path: Path) -> str | None:
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else None


def test_every_stage_imports_only_itself_and_earlier_stages():
    wrong = []
    for path in modules():
        stage = stage_of(path)
        if stage is None:
            continue
        assert stage in STAGES, f"{path}: stage {stage} is not in the flow; add it to STAGES in its place"
        for name in imported_modules(path):
            parts = name.split(".")
            if parts[0] == "rdna1_kmgr" and len(parts) > 1 and parts[1] in STAGES:
                if STAGES.index(parts[1]) > STAGES.index(stage):
                    wrong.append(f"{path.relative_to(PACKAGE)} imports {name}")
    assert wrong == []


def test_only_the_runner_starts_programs():
    starters = {"subprocess", "sh", "pty"}
    found = [
        f"{path.relative_to(PACKAGE)}: {name}"
        for path in modules()
        for name in imported_modules(path)
        if name in starters or name.startswith(("subprocess.", "sh."))
    ]
    assert found == ["core/runner.py: subprocess"]
    calls = [
        str(path.relative_to(PACKAGE))
        for path in modules()
        if "os.system(" in path.read_text() or "os.popen(" in path.read_text() or "os.exec" in path.read_text()
    ]
    assert calls == []


def test_no_module_is_longer_than_a_reader_takes_in_at_once():
    long = {str(p.relative_to(PACKAGE)): n for p in modules() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_every_stage_says_what_it_takes_and_leaves():
    for folder in sorted({p.parent for p in modules() if stage_of(p)}):
        doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text()))
        assert doc and len(doc) > 80, f"{folder.name}/__init__.py needs a docstring: what it takes, leaves, keeps"
