"""A pipeline plans its stages in order, runs them in order, times each and stops at the first that fails."""

import pytest

from rdna1_kmgr.core.pipeline import Pipeline


class Step:
    def __init__(self, name, fails=False):
        self.name = name
        self.fails = fails

    def plan(self, ctx):
        ctx.append(f"plan {self.name}")
        return [f"would {self.name}"]

    def run(self, ctx):
        ctx.append(f"run {self.name}")
        if self.fails:
            raise RuntimeError(self.name)


def test_the_plan_is_every_stage_in_order_and_runs_nothing():
    ctx = []
    assert Pipeline([Step("fetch"), Step("render")]).plan(ctx) == ["would fetch", "would render"]
    assert ctx == ["plan fetch", "plan render"]


def test_a_run_runs_in_order_and_times_each_stage():
    ticks = iter([0.0, 1.5, 1.5, 4.0])
    ctx, started = [], []
    times = Pipeline([Step("fetch"), Step("render")]).run(ctx, clock=lambda: next(ticks), on_stage=started.append)
    assert ctx == ["run fetch", "run render"] and started == ["fetch", "render"]
    assert [(t.name, t.seconds) for t in times] == [("fetch", 1.5), ("render", 2.5)]


def test_the_first_failing_stage_ends_the_run():
    ctx = []
    with pytest.raises(RuntimeError, match="render"):
        Pipeline([Step("fetch"), Step("render", fails=True), Step("build")]).run(ctx)
    assert ctx == ["run fetch", "run render"]
