"""The rollout loop: stages per rollout_id, eval cadence, checkpoint cadence, metric sinks."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from pipeline.rollout.contracts import as_eval_output
from pipeline.loop.runner_async import run_async
from pipeline.process.stop_signals import deferred_stop
from pipeline.sinks.files import write_samples
from pipeline.sinks.jsonl import MetricsJsonl, clean_value, read_metrics
from pipeline.stages import STAGES, RolloutContext, StageParts
from pipeline.stages.log import eval_metrics
from pipeline.stages.persist import samples_path, write_failed
from pipeline.stages.train import export_policy, policy_missing, save_trainer, trainer_state_dir

__all__ = ["Pipeline", "Schedule", "ROLLOUT_STATE_KEY"]

logger = logging.getLogger(__name__)

# data-source metadata key that carries the rollout function's state across a resume
ROLLOUT_STATE_KEY = "rollout_fn_state"
# data-source metadata key that carries the checkpointed rollout's metrics line: a run killed
# between the checkpoint and the line (SIGKILL, power loss) gets the line back on resume
METRICS_LINE_KEY = "metrics_line"


@dataclass(frozen=True)
class Schedule:
    """Which rollouts run, and when eval and checkpoints happen."""

    start_rollout_id: int
    num_rollout: int
    save_interval: int | None = 1
    eval_interval: int | None = None
    eval_before_train: bool = False
    # train_async: rollout k+1 generates while the trainer trains on k (pipeline.loop.runner_async);
    # max_weight_staleness bounds how many weight versions generation may run behind the trainer
    train_async: bool = False
    max_weight_staleness: int = 1

    def should_save(self, rollout_id: int) -> bool:
        """Every save_interval rollouts, and after the last one."""
        last = rollout_id == self.num_rollout - 1
        return last or (self.save_interval is not None and (rollout_id + 1) % self.save_interval == 0)

    def should_eval(self, rollout_id: int) -> bool:
        """After rollout r when (r + 1) % eval_interval == 0."""
        return self.eval_interval is not None and (rollout_id + 1) % self.eval_interval == 0


@dataclass
class Pipeline:
    """Runs rollouts `schedule.start_rollout_id .. num_rollout - 1` through `stages`, a list of
    (name, fn(ctx, parts)) run in order (`pipeline.stages.STAGES` plus the config's
    `extra_stages`: `pipeline.loop.parts.build_stages`)."""

    parts: StageParts
    schedule: Schedule
    metrics_file: MetricsJsonl
    eval_fn: Callable[..., Any] | None = None
    sinks: list[Any] = field(default_factory=list)
    # console progress (`pipeline.process.logging_setup.RunProgress`): `step(rollout_id, metrics)` per rollout
    progress: Any = None
    stages: tuple[tuple[str, Callable[[RolloutContext, StageParts], None]], ...] = STAGES

    def run(self) -> dict[str, Any]:
        """Run every scheduled rollout; returns the metrics of the last step."""
        sched = self.schedule
        if sched.train_async:
            last = run_async(self)
            self.export_trained_policy(last)
            return last
        last: dict[str, Any] = {}
        self.restore_from_checkpoint()
        for rollout_id in range(sched.start_rollout_id, sched.num_rollout):
            metrics: dict[str, Any] = {}
            if rollout_id == sched.start_rollout_id and sched.eval_before_train and self.eval_fn is not None:
                metrics.update(self.evaluate(rollout_id))
            ctx = self.run_rollout(rollout_id)
            metrics.update(ctx.metrics)
            if self.eval_fn is not None and sched.should_eval(rollout_id):
                metrics.update(self.evaluate(rollout_id))
            self.commit_in_order(rollout_id, metrics)
            last = metrics
        self.export_trained_policy(last)
        return last

    def export_trained_policy(self, last: dict[str, Any]) -> None:
        """After the rollouts: the trained policy as a plain HF folder (when a trainer ran)."""
        trainer = self.parts.plugin("trainer")
        if trainer is not None and self.parts.run_dir is not None and (
                last or policy_missing(trainer, self.parts.run_dir)):
            export_policy(trainer, self.parts.run_dir)

    def commit_in_order(self, rollout_id: int, metrics: dict[str, Any]) -> None:
        """`commit` with Ctrl-C and SIGTERM held back until it is done (checkpoint and metrics line: both or neither)."""
        with deferred_stop():
            self.commit(rollout_id, metrics)

    def commit(self, rollout_id: int, metrics: dict[str, Any]) -> None:
        """A finished rollout: its checkpoint (when scheduled), then its metrics line and sink rows."""
        if self.schedule.should_save(rollout_id):
            start = time.perf_counter()
            self.stash_rollout_state()
            self.stash_metrics_line(rollout_id, metrics)
            trainer = self.parts.plugin("trainer")
            if trainer is not None and self.parts.run_dir is not None:
                # first, so every data-source checkpoint on disk has its trainer state
                try:
                    save_trainer(trainer, self.parts.run_dir, rollout_id)
                except OSError as exc:
                    raise write_failed(exc, f"the trainer state {trainer_state_dir(self.parts.run_dir, rollout_id)}",
                                       rollout_id) from exc
            try:
                self.parts.data_source.save(rollout_id)
            except OSError as exc:
                raise write_failed(exc, f"the data-source checkpoint {self.checkpoint_file(rollout_id)}",
                                   rollout_id) from exc
            metrics["perf/stage/checkpoint_time"] = time.perf_counter() - start
        self.emit(rollout_id, metrics)

    def checkpoint_file(self, rollout_id: int) -> str:
        """The checkpoint path `data_source.save(rollout_id)` writes (its folder when unknown)."""
        save_dir = getattr(self.parts.data_source, "save_dir", None)
        return f"{save_dir}/rollout_{rollout_id}.json" if save_dir is not None else "(no save_dir)"

    def stash_rollout_state(self) -> None:
        """Put the rollout function's state (e.g. the adaptive pass-rate estimate) into the data
        source's `metadata`, so the checkpoint written next carries it (a resume continues
        exactly); rollout functions without `state_dict` are skipped."""
        state_dict = getattr(self.parts.rollout_fn, "state_dict", None)
        metadata = getattr(self.parts.data_source, "metadata", None)
        if callable(state_dict) and isinstance(metadata, dict):
            metadata[ROLLOUT_STATE_KEY] = state_dict()

    def stash_metrics_line(self, rollout_id: int, metrics: dict[str, Any]) -> None:
        """Put `rollout_id`'s metrics into the data source's `metadata`, so the checkpoint written
        next carries the line written after it (`restore_metrics_line`)."""
        metadata = getattr(self.parts.data_source, "metadata", None)
        if isinstance(metadata, dict):
            metadata[METRICS_LINE_KEY] = {"step": rollout_id, **{k: clean_value(v) for k, v in metrics.items()}}

    def restore_from_checkpoint(self) -> None:
        """On a resume: the rollout function's state and a lost metrics line, when the checkpoint has them."""
        self.restore_rollout_state()
        self.restore_metrics_line()

    def restore_rollout_state(self) -> None:
        """Load the state `stash_rollout_state` left in a resumed data source, if any."""
        metadata = getattr(self.parts.data_source, "metadata", None)
        load = getattr(self.parts.rollout_fn, "load_state_dict", None)
        if isinstance(metadata, dict) and ROLLOUT_STATE_KEY in metadata and callable(load):
            load(metadata[ROLLOUT_STATE_KEY])
            logger.info("restored the rollout function's state from the checkpoint")

    def restore_metrics_line(self) -> None:
        """The checkpointed rollout's metrics line and sink rows, when metrics.jsonl lacks them (the
        run was killed after writing the checkpoint and before the line)."""
        metadata = getattr(self.parts.data_source, "metadata", None)
        line = metadata.get(METRICS_LINE_KEY) if isinstance(metadata, dict) else None
        step = self.schedule.start_rollout_id - 1
        if not isinstance(line, dict) or line.get("step") != step:
            return
        path = self.metrics_file.path
        if path.exists() and any(row["step"] == step for row in read_metrics(path)):
            return
        logger.warning("%s had no line for rollout %d (the run was stopped between its checkpoint and its "
                       "metrics line); restored the line from the checkpoint", path, step)
        self.emit(step, {k: v for k, v in line.items() if k != "step"})

    def run_rollout(self, rollout_id: int) -> RolloutContext:
        """One rollout step through every stage, each timed as perf/stage/<name>_time."""
        ctx = self.start_rollout(rollout_id)
        self.run_stages(ctx, self.stages)
        self.add_stage_times(ctx)
        return ctx

    def start_rollout(self, rollout_id: int) -> RolloutContext:
        """Tell the data source a rollout begins (`begin_rollout`, when it has one); a fresh context."""
        begin = getattr(self.parts.data_source, "begin_rollout", None)
        if callable(begin):
            begin(rollout_id)
        return RolloutContext(rollout_id=rollout_id)

    def run_stages(self, ctx: RolloutContext,
                   stages: tuple[tuple[str, Callable[[RolloutContext, StageParts], None]], ...]) -> None:
        """Run `stages` in order on `ctx`, timing each into `ctx.timings`."""
        for name, stage in stages:
            start = time.perf_counter()
            try:
                stage(ctx, self.parts)
            except Exception as exc:
                exc.add_note(f"in stage {name!r} of rollout {ctx.rollout_id}")
                raise
            ctx.timings[name] = time.perf_counter() - start

    @staticmethod
    def add_stage_times(ctx: RolloutContext) -> None:
        """`perf/stage/<name>_time` for every timed stage."""
        for name, seconds in ctx.timings.items():
            ctx.metrics[f"perf/stage/{name}_time"] = seconds

    def evaluate(self, rollout_id: int) -> dict[str, Any]:
        """Call the eval function with evaluation=True; eval/<name> metrics; dump eval samples."""
        start = time.perf_counter()
        raw = self.eval_fn(self.parts.args, rollout_id, self.parts.data_source, evaluation=True)
        out = as_eval_output(raw, "eval function")
        for name, d in out.data.items():
            lengths = {k: len(d[k]) for k in ("rewards", "truncated", "samples") if k in d}
            if len(set(lengths.values())) > 1:
                raise ValueError(f"eval function: dataset {name!r} has unequal lengths {lengths}")
        extra = dict(out.metrics or {})
        # slime's custom eval log hook: True skips the default metrics; the eval function's own
        # (extra_metrics, which the hook may edit) are logged either way
        hook = self.parts.plugin("eval_rollout_log")
        skip = hook is not None and bool(hook(rollout_id, self.parts.args, out.data, extra))
        metrics = {} if skip else eval_metrics(self.parts.args, out.data)
        metrics.update({k if "/" in k else f"eval/{k}": v for k, v in extra.items()})
        metrics["perf/eval_time"] = time.perf_counter() - start
        if self.parts.run_dir is not None:
            for name, d in out.data.items():
                if d.get("samples"):
                    write_samples(samples_path(self.parts.run_dir, rollout_id, f"eval_{name}"), d["samples"])
        return metrics

    def emit(self, step: int, metrics: dict[str, Any]) -> None:
        """One metrics.jsonl line and one row in every sink for `step`."""
        self.metrics_file.log(step, metrics)
        for sink in self.sinks:
            sink.log(step, metrics)
        if self.progress is not None:
            self.progress.step(step, metrics)
