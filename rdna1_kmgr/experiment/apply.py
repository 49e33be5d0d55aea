"""`rdna1-kmgr experiment apply`: install the last experiment's answer through the journaled profile path
(install/user_profile.py); a backend setting is a line of the owner's program, said, not installed."""

from __future__ import annotations

from rdna1_kmgr.core.errors import UsageError
from rdna1_kmgr.experiment import answer
from rdna1_kmgr.install import user_profile
from rdna1_kmgr.userspace import profiles as profile_data
from rdna1_kmgr.vm import cell_outcomes


def apply(cell_id: str | None = None, dry_run: bool = False) -> dict:
    record = answer.read_latest()
    if record is None:
        raise UsageError("no experiment has run on this machine", "run `rdna1-kmgr experiment` first")
    if cell_id is None:
        chosen = record.get("recommended")
        if chosen is None:
            raise UsageError("the last experiment found no passing cell to apply", f"see {record.get('html')}")
    else:
        chosen = next((c for c in record["cells"] if c["cell"] == cell_id), None)
        if chosen is None or chosen["outcome"] != "pass":
            passing = ", ".join(c["cell"] for c in record["cells"] if c["outcome"] == "pass") or "none"
            raise UsageError(f"cell {cell_id!r} did not pass in the last experiment", f"passing cells: {passing}")
    profile = profile_data.get(chosen["profile"])
    backend = cell_outcomes.BACKENDS[chosen["backend"]]
    result = {"cell": chosen["cell"], "dry_run": dry_run, "profile": None, "code": backend.code or None}
    if not profile.changes_nothing:
        result["profile"] = user_profile.install(profile.name, dry_run=dry_run)
    return result
