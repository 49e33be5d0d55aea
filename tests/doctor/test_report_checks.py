"""doctor is what it gathered and a tuple of checks (doctor/report.py): every module report.py takes findings from
is called by exactly one entry of the tuple (therock_wheels' come through torch_builds', per torch build)."""

import ast
import inspect
from pathlib import Path

from rdna1_kmgr.doctor import report

DOCTOR = Path(report.__file__).parent


def _imported_doctor_modules() -> set[str]:
    tree = ast.parse(Path(report.__file__).read_text())
    return {
        alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module == "rdna1_kmgr.doctor"
        for alias in node.names
    }


def test_every_module_report_takes_findings_from_is_called_by_exactly_one_check():
    with_findings = sorted(
        name
        for name in _imported_doctor_modules() - {"therock_wheels"}
        if any(
            isinstance(n, ast.FunctionDef) and n.name == "findings"
            for n in ast.parse((DOCTOR / f"{name}.py").read_text()).body
        )
    )
    assert len(with_findings) >= 14, with_findings
    sources = {check.__name__: inspect.getsource(check) for check in report.CHECKS}
    assert len(sources) == len(report.CHECKS), "a check listed twice"
    for module in with_findings:
        # gfx_override's are gathered once: the processor the override makes ROCm load feeds the other checks
        called = f"{module}.findings(" if module != "gfx_override" else "g.override[0]"
        callers = [name for name, source in sources.items() if called in source]
        assert len(callers) == 1, (module, callers)
