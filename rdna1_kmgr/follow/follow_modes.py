"""`follow`'s four modes (one kernel, the pending ones, defer, removed) and what each returns: a typed result
that the command renders and --json serialises (core/output.py), the same keys as before they were typed."""

from __future__ import annotations

from dataclasses import dataclass

from rdna1_kmgr.follow import follow_record, kernel_follow, kernel_removal


@dataclass(frozen=True)
class FollowPlan:
    """--dry-run of any mode: what it would do, line by line."""

    plan: list[str]


@dataclass(frozen=True)
class Removed:
    kernel: str
    removed: list[str]  # what was dropped for it
    lines: list[str]  # what the hook prints (nothing: removal is quiet)


@dataclass(frozen=True)
class Deferred:
    kernel: str
    deferred: bool  # noted as pending (False: follow has nothing to do, or the kernel has its install)
    lines: list[str]


@dataclass(frozen=True)
class Followed:
    kernels: list[follow_record.FollowRecord | kernel_follow.NotOptedIn]  # each kernel's record (follow_record.py)
    failed: int  # the first failure's exit code; 0 when every kernel ended patched or stock by choice
    lines: list[str]  # one per kernel that follow acted on: its state and why


FollowResult = FollowPlan | Removed | Deferred | Followed


def removed(kernel: str, dry_run: bool) -> FollowPlan | Removed:
    if dry_run:
        return FollowPlan(kernel_removal.plan(kernel))
    return Removed(kernel, kernel_removal.forget(kernel), [])


def deferred(kernel: str, dry_run: bool) -> FollowPlan | Deferred:
    if dry_run:
        return FollowPlan([f"note {kernel} as pending in {follow_record.pending_dir()}"])
    said = kernel_follow.defer(kernel)
    return Deferred(kernel, said is not None, [f"rdna1-kmgr: {said}"] if said else [])


def followed(kernel: str | None, source: str | None, dry_run: bool) -> FollowPlan | Followed:
    """Follow `kernel`, or every pending kernel when it is None (a failure of one of them is recorded and the
    others go on; one kernel by hand raises its StageFailed)."""
    kernels = follow_record.pending() if kernel is None else [kernel]
    if dry_run:
        plan = [line for k in kernels for line in kernel_follow.plan(k, source)]
        return FollowPlan(plan or ["no kernel is pending: nothing to follow"])
    records: list[follow_record.FollowRecord | kernel_follow.NotOptedIn] = []
    failed = 0
    for k in kernels:
        try:
            records.append(kernel_follow.follow(k, source))
        except kernel_follow.StageFailed as err:
            if kernel is not None:
                raise  # one kernel by hand: its reason is the error line
            stand_in = follow_record.FollowRecord(k, "stock", None, reason=err.line())  # its record is gone
            records.append(follow_record.read(k) or stand_in)
            failed = failed or err.exit_code
    lines = [
        f"rdna1-kmgr: {r.kernel}: {follow_record.describe(r)}"
        for r in records
        if isinstance(r, follow_record.FollowRecord)
    ]
    return Followed(records, failed, lines)
