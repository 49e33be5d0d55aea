"""A flow told once: a list of stages, each of which can say what it would do (`plan`) and do it (`run`).

The dry run and the run read the same list, so they cannot drift apart: `build --dry-run` is the build's
pipeline planned, the build is that pipeline run. A stage reads and fills one context object (the flow's own
dataclass); what it tells while it works goes through core/progress (`progress.say`), the one reporter, so a
caller that keeps a story (follow's log) captures every stage's lines with `progress.reporting_to`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

Context = TypeVar("Context")
ContextIn = TypeVar("ContextIn", contravariant=True)


class Stage(Protocol[ContextIn]):
    """One step of a flow: its name, what it would do (lines, nothing changed) and doing it."""

    name: str

    def plan(self, ctx: ContextIn) -> list[str]: ...

    def run(self, ctx: ContextIn) -> None: ...


@dataclass(frozen=True)
class StageTime:
    """How long one stage ran."""

    name: str
    seconds: float


@dataclass(frozen=True)
class Pipeline(Generic[Context]):
    """The stages of one flow, in order."""

    stages: Sequence[Stage[Context]]

    @property
    def names(self) -> list[str]:
        return [stage.name for stage in self.stages]

    def plan(self, ctx: Context) -> list[str]:
        """Every stage's plan, in order (a stage may find more in ctx from the ones planned before it)."""
        lines: list[str] = []
        for stage in self.stages:
            lines += stage.plan(ctx)
        return lines

    def run(
        self, ctx: Context, clock: Callable[[], float] = time.monotonic, on_stage: Callable[[str], None] | None = None
    ) -> list[StageTime]:
        """Run every stage in order (the first that raises ends it); how long each took.
        `on_stage` hears each stage's name as it starts (follow names the stage that failed)."""
        times: list[StageTime] = []
        for stage in self.stages:
            if on_stage is not None:
                on_stage(stage.name)
            started = clock()
            stage.run(ctx)
            times.append(StageTime(stage.name, round(clock() - started, 3)))
        return times
