"""The package's layout keeps its promises: stages import only earlier stages, only the runner runs programs,
no module grows past what a reader takes in at once."""

import ast
from pathlib import Path

from layout_facts import PACKAGE, modules

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
MAX_LINES = 550  # lines as `ruff format` lays them out (issues 21 and 41: modules are cut by concept, not by this cap)


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def imported_names(path: Path) -> set[str]:
    """imported_modules, and each name of a `from package import name` (a module or not)."""
    names = imported_modules(path)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
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


# The runner: its entry points (runner.py) and how a program's process tree starts and is stopped (process_tree.py).
RUNNER = ["core/process_tree.py", "core/runner.py"]


def test_only_the_runner_starts_programs():
    starters = {"subprocess", "sh", "pty"}
    found = [
        f"{path.relative_to(PACKAGE)}: {name}"
        for path in modules()
        for name in imported_modules(path)
        if name in starters or name.startswith(("subprocess.", "sh."))
    ]
    assert found == [f"{module}: subprocess" for module in RUNNER]
    calls = [
        str(path.relative_to(PACKAGE))
        for path in modules()
        if "os.system(" in path.read_text() or "os.popen(" in path.read_text() or "os.exec" in path.read_text()
    ]
    assert calls == []


def renames(path: Path) -> list[str]:
    """Where a module renames a file over another: os.replace/os.rename/shutil.move, Path.rename, and
    Path.replace (one argument; str.replace takes two)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        func, owner = node.func, node.func.value
        by_module = isinstance(owner, ast.Name) and (owner.id, func.attr) in {
            ("os", "replace"),
            ("os", "rename"),
            ("shutil", "move"),
        }
        by_path = func.attr == "rename" or (func.attr == "replace" and len(node.args) == 1 and not node.keywords)
        if by_module or (by_path and not (isinstance(owner, ast.Name) and owner.id == "os")):
            found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    return found


def test_only_core_files_writes_files_atomically():
    """One write_atomic, move_into_place, link_in_place and publish_tree (core/files.py): a second copy drifts (the six the
    package had differed in fsyncs, modes and temporary names)."""
    found = [where for path in modules() for where in renames(path) if path != PACKAGE / "core" / "files.py"]
    assert found == []
    assert len(renames(PACKAGE / "core" / "files.py")) == 5  # the check sees what it forbids


def json_writes(path: Path) -> list[str]:
    """Where a module hands write_atomic a json.dumps(...) of its own (the shape write_json replaced)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        if name != "write_atomic":
            continue
        arguments = [*node.args, *(k.value for k in node.keywords)]
        if any(
            isinstance(inner, ast.Call)
            and isinstance(inner.func, ast.Attribute)
            and inner.func.attr == "dumps"
            and isinstance(inner.func.value, ast.Name)
            and inner.func.value.id == "json"
            for argument in arguments
            for inner in ast.walk(argument)
        ):
            found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    return found


def test_json_files_are_written_by_write_json():
    """One write_json (core/files.py): the records' indent, key order and closing newline in one place."""
    files = PACKAGE / "core" / "files.py"
    found = [where for path in modules() if path != files for where in json_writes(path)]
    assert found == []
    assert len(json_writes(files)) == 1  # the check sees what it forbids


def test_no_stage_has_an_import_cycle():
    """Modules of a stage import each other one way (a cycle means a concept cut in two by the line cap)."""
    graph = {}
    for path in modules():
        name = ".".join(("rdna1_kmgr", *path.relative_to(PACKAGE).with_suffix("").parts))
        graph[name] = {m for m in imported_names(path) if m.startswith("rdna1_kmgr.") and m != name}
    cycles = set()

    def visit(name: str, trail: list[str]) -> None:
        for nxt in sorted(graph.get(name, ())):
            if nxt.split(".")[1] != name.split(".")[1]:
                continue  # across stages: test_every_stage_imports_only_itself_and_earlier_stages
            if nxt in trail:
                cycles.add(" -> ".join(trail[trail.index(nxt) :] + [nxt]))
            elif len(trail) < 12:
                visit(nxt, trail + [nxt])

    for name in graph:
        visit(name, [name])
    assert sorted(cycles) == []


def test_no_module_is_longer_than_a_reader_takes_in_at_once():
    long = {str(p.relative_to(PACKAGE)): n for p in modules() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_every_stage_says_what_it_takes_and_leaves():
    for folder in sorted({p.parent for p in modules() if stage_of(p)}):
        doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text()))
        assert doc and len(doc) > 80, f"{folder.name}/__init__.py needs a docstring: what it takes, leaves, keeps"


# Distribution names a stage would branch on; host/ (platform.py and platforms.toml) alone knows them.
DISTRIBUTION_NAMES = {"debian", "ubuntu", "fedora", "arch", "rhel", "centos"}


def distribution_tests(source: str) -> list[int]:
    """Lines comparing something to a distribution's name (==, !=, in, not in a literal name or a literal
    set, tuple or list of them), or intersecting with a literal set of them."""

    def names_in(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in DISTRIBUTION_NAMES
        if isinstance(node, ast.Set | ast.Tuple | ast.List):
            return any(names_in(element) for element in node.elts)
        return False

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            equality = (ast.Eq, ast.NotEq, ast.In, ast.NotIn)
            if any(isinstance(op, equality) for op in node.ops) and any(
                names_in(side) for side in (node.left, *node.comparators)
            ):
                found.append(node.lineno)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitAnd):
            if names_in(node.left) or names_in(node.right):
                found.append(node.lineno)
    return found


def test_only_host_knows_the_distributions():
    """The stages pick a distribution's way by the names its Platform record holds (host/platform.py), never
    by reading the distribution themselves or testing its name."""
    reads = [
        f"{path.relative_to(PACKAGE)}: {name}"
        for path in modules()
        if stage_of(path) != "host"
        for name in imported_modules(path)
        if name == "distro" or name.startswith("distro.")
    ]
    assert reads == []
    tests = [
        f"{path.relative_to(PACKAGE)}:{line}"
        for path in modules()
        if stage_of(path) != "host"
        for line in distribution_tests(path.read_text())
    ]
    assert tests == []


def test_the_distribution_check_sees_what_it_forbids():
    source = (
        'if system.family == "ubuntu": pass\n'
        'if distro_id in ("fedora", "rhel"): pass\n'
        'if "arch" != name: pass\n'
        'family = ids & {"debian", "ubuntu"}\n'
        'if tool == "dracut" or kind in {"debian-archive"}: pass\n'
    )
    assert distribution_tests(source) == [1, 2, 3, 4]


def test_progress_goes_through_core_progress_not_a_stream_argument():
    """Issue 41: a flow's stages report through core/progress (`say`, `Progress`), which a caller keeping a
    story redirects with `reporting_to`; no function outside core/ takes the stream to write to."""
    found = []
    for path in modules():
        if stage_of(path) == "core":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                args = node.args.args + node.args.kwonlyargs + node.args.posonlyargs
                for arg in args:
                    if arg.annotation is not None and "TextIO" in ast.unparse(arg.annotation):
                        found.append(f"{path.relative_to(PACKAGE)}: {node.name}({arg.arg})")
    assert found == []


# Parameter names that carry a callback to tell the user something; data may carry these names (a workload's
# `report: dict`), a callback may not.
REPORTER_NAMES = {"report", "say", "warn"}


def reporter_parameters(source: str) -> list[str]:
    """Functions taking a reporter callback: a parameter named as one that is typed callable (Callable[...],
    Reporter) or untyped (a callback passed along, or defaulting to a function or a lambda)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            args = node.args.args + node.args.kwonlyargs + node.args.posonlyargs
            for arg in args:
                annotation = ast.unparse(arg.annotation) if arg.annotation is not None else None
                if arg.arg in REPORTER_NAMES and (
                    annotation is None or "Callable" in annotation or "Reporter" in annotation
                ):
                    found.append(f"{getattr(node, 'name', 'lambda')}({arg.arg})")
    return found


def test_progress_goes_through_core_progress_not_a_reporter_argument():
    """Issue 41: vm's `report=` and the experiment's `say`/`warn` callbacks went; their lines go through
    core/progress like the build's, and a caller that keeps them redirects with `reporting_to`."""
    found = [
        f"{path.relative_to(PACKAGE)}: {where}"
        for path in modules()
        if stage_of(path) != "core"
        for where in reporter_parameters(path.read_text())
    ]
    assert found == []


def test_the_reporter_check_sees_what_it_forbids():
    source = (
        "def a(report: Callable[[str], None]): pass\n"
        "def b(x, report=engine.say): pass\n"
        "def c(plan, say): pass\n"
        "def d(*, warn: Reporter = print): pass\n"
        "def e(report: dict, say_more: Callable[[str], None]): pass\n"
    )
    assert reporter_parameters(source) == ["a(report)", "b(report)", "c(say)", "d(warn)"]


def dict_indexing(source: str) -> list[str]:
    """`x["key"]` and `x.get("key")` in a command: a flow's result read as a dict. os.environ is a dict by
    nature; a regular expression's match is read with .group("name")."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            if isinstance(node.slice.value, str):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            first = node.args[0] if node.args else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                if ast.unparse(node.func.value) != "os.environ":
                    found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_commands_read_typed_results_not_dicts():
    """Issue 41: a flow returns a frozen dataclass; its command renders the fields and --json serialises it
    (core/output.py). A string key on a result in commands/ is a dict that slipped through."""
    found = []
    for path in sorted((PACKAGE / "commands").glob("*.py")):
        found += [f"commands/{path.name}:{hit}" for hit in dict_indexing(path.read_text())]
    assert found == []


def test_the_dict_indexing_rule_sees_what_it_forbids():
    source = (
        'result["plan"]\n'
        'record.get("stopped")\n'
        'done.get("done", done.get("next_boot", []))\n'
        'os.environ.get("SUDO_UID", "")\n'
        "rows[0]\n"
        'match.group("name")\n'
        "result.plan\n"
    )
    assert [hit.split(":")[0] for hit in dict_indexing(source)] == ["1", "2", "3", "3"]


# Bare `dict` annotations left, by module: the untyped records a module still passes around (the journal's, the
# verdicts'). A module leaves this table once it is typed, and a count only goes down: a module not listed may
# have none (issue 51). Count: `pytest tests/core/test_layout.py -k bare_dict -rA` prints the total.
BARE_DICT_ALLOWED = {
    "core/owner.py": 2,
    "core/process_tree.py": 1,
    "doctor/code_objects.py": 1,
    "doctor/control_stack.py": 1,
    "doctor/finding.py": 2,
    "doctor/kfd_access.py": 2,
    "doctor/kpack.py": 2,
    "doctor/queue_cwsr.py": 5,
    "doctor/rocm_libraries.py": 2,
    "doctor/therock_wheels.py": 3,
    "doctor/torch_builds.py": 2,
    "experiment/answer.py": 6,
    "experiment/apply.py": 1,
    "experiment/cell_run.py": 6,
    "experiment/issue_report.py": 12,
    "experiment/kernel_cells.py": 2,
    "experiment/kernel_run.py": 15,
    "follow/status.py": 16,
    "host/host_facts.py": 1,
    "host/platform.py": 1,
    "host/sysfs.py": 1,
    "host/system_identity.py": 1,
    "install/boot_guard.py": 2,
    "install/install_gate.py": 2,
    "install/kernel_parameters.py": 1,
    "install/stock_loader.py": 1,
    "install/user_profile.py": 1,
    "modbuild/build_result.py": 1,
    "modbuild/key_status.py": 1,
    "modbuild/module_build.py": 2,
    "modbuild/prerequisites.py": 1,
    "modbuild/signing.py": 2,
    "render/manifest.py": 1,
    "render/patch_series.py": 2,
    "render/quirk_catalog.py": 9,
    "render/source_facts.py": 1,
    "source/distro_source.py": 4,
    "source/kernel_source.py": 1,
    "source/ubuntu_source.py": 1,
    "userspace/environment_files.py": 1,
    "userspace/profiles.py": 2,
    "vm/cell_outcomes.py": 2,
    "vm/engine.py": 3,
    "vm/experiment.py": 6,
    "vm/experiment_guest.py": 1,
    "vm/gpu_checks.py": 5,
    "vm/guest.py": 2,
    "vm/plumbing_guest.py": 1,
    "vm/plumbing_run.py": 2,
    "vm/reset_readiness.py": 1,
    "vm/verdict.py": 13,
    "vm/vfio.py": 3,
    "vm/vfio_journal.py": 1,
}


def bare_dict_annotations(source: str) -> int:
    """`dict` without its key and value types, in parameter, return and variable annotations."""
    found = 0
    for node in ast.walk(ast.parse(source)):
        annotations = []
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            arguments = node.args
            every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs, arguments.vararg, arguments.kwarg]
            annotations = [a.annotation for a in every if a is not None and a.annotation is not None]
            annotations += [node.returns] if node.returns is not None else []
        elif isinstance(node, ast.AnnAssign):
            annotations = [node.annotation]
        for annotation in annotations:
            found += sum(
                1
                for sub in ast.walk(annotation)
                if isinstance(sub, ast.Name) and sub.id == "dict" and not _subscripted(annotation, sub)
            )
    return found


def _subscripted(tree: ast.AST, name: ast.Name) -> bool:
    return any(isinstance(node, ast.Subscript) and node.value is name for node in ast.walk(tree))


def test_no_module_has_more_bare_dict_annotations_than_it_is_allowed():
    counts = {str(path.relative_to(PACKAGE)): bare_dict_annotations(path.read_text()) for path in modules()}
    over = {
        name: (count, BARE_DICT_ALLOWED.get(name, 0))
        for name, count in counts.items()
        if count > BARE_DICT_ALLOWED.get(name, 0)
    }
    assert over == {}, "bare dict annotations over the module's allowance (count, allowed): " + repr(over)
    print(f"bare dict annotations: {sum(counts.values())} in {sum(1 for c in counts.values() if c)} modules")


def test_the_bare_dict_count_sees_what_it_forbids():
    source = "def f(a: dict, b: dict[str, int], c: list[dict] | None = None) -> dict:\n    x: dict = {}\n"
    assert bare_dict_annotations(source) == 4
