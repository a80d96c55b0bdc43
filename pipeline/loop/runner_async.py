"""One-step-off asynchronous training (`train_async: true`; slime's train_async.py, AReaL's
bounded staleness): rollout k+1 is generated while the trainer trains on rollout k.

The stages before `train` (generate ... train_data) run on the main thread as in the sync loop;
`trainer.train` runs on one background thread (torch releases the GIL in its kernels). The
schedule, with N = `max_weight_staleness`:

    after generating rollout r:  start training the oldest generated rollout (when none trains)
                                 finish every rollout x <= r - N (all x <= r at a save point):
                                   wait for train(x), push its weights (version x + 1) to the
                                   engine, start training x + 1, then run the stages after
                                   `train` (persist, log), eval and commit for x
    then generate rollout r + 1  (the engine serves version r + 1 - N: N versions behind)

Weights reach the engine only from the main thread between two generate stages (no request in
flight, so no engine ever sees a torn update), and only while the trainer is idle (its weights are
read after one `train` returned and before the next starts). Which version generates which rollout
is fixed by the schedule, not by timing, so deterministic mode stays deterministic.

Order and checkpoints: train data, metrics lines, eval and checkpoints stay per rollout id in
order. A rollout with a checkpoint (`save_interval`, and the last one) is a barrier: its training
finishes before the next rollout is generated, so every checkpoint has nothing in flight (the
data source has handed out exactly the prompts of the rollouts trained so far) and `resume=`
continues exactly as the uninterrupted run does (the rollout after a barrier is generated with
the fresh weights in both). The price: with `save_interval=1` nothing overlaps.

Metrics: `perf/stage/train_time` (the trainer's own time), `perf/async_train_wait_time` (the main
thread blocked on it), `perf/async_overlap_time` (training hidden behind generation, eval and
logging: train time minus wait) and `rollout/weight_staleness` (+`_mean`), recomputed against
the version the engine serves when the rollout's training starts (the trainer's version).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Protocol

from pipeline.process.openmp import release_thread_workers
from pipeline.samples.versions import staleness_metrics
from pipeline.stages.context import RolloutContext
from pipeline.stages.train import sync_trained_weights

__all__ = ["AsyncTrainLoop", "run_async"]

logger = logging.getLogger(__name__)


class Pipeline(Protocol):
    """What the loop uses of `pipeline.loop.runner.Pipeline` (a protocol, so this module does not
    import the runner, which imports it)."""

    stages: tuple[tuple[str, Callable[..., None]], ...]
    parts: Any
    schedule: Any
    eval_fn: Any

    def restore_from_checkpoint(self) -> None: ...
    def evaluate(self, rollout_id: int) -> dict[str, Any]: ...
    def start_rollout(self, rollout_id: int) -> RolloutContext: ...
    def run_stages(self, ctx: RolloutContext, stages: Any) -> None: ...
    def add_stage_times(self, ctx: RolloutContext) -> None: ...
    def commit_in_order(self, rollout_id: int, metrics: dict[str, Any]) -> None: ...


def run_async(pipeline: Pipeline) -> dict[str, Any]:
    """Run `pipeline`'s scheduled rollouts with training overlapped; the last step's metrics."""
    return AsyncTrainLoop(pipeline).run()


def _train(trainer: Any, ctx: RolloutContext) -> tuple[dict[str, Any], float]:
    """The background job: `trainer.train` on one rollout's train data; (metrics, seconds)."""
    start = time.perf_counter()
    try:
        metrics = trainer.train(ctx.rollout_id, ctx.train_data) if ctx.train_data is not None else {}
    finally:
        # this thread idles until the next job: its OpenMP workers would cut the decode
        # thread's spin-wait meanwhile (pipeline.process.openmp)
        release_thread_workers()
    return dict(metrics), time.perf_counter() - start


class AsyncTrainLoop:
    """The schedule of the module docstring over one `Pipeline` (its stages, parts and sinks)."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        names = [name for name, _ in pipeline.stages]
        if "train" not in names:
            raise ValueError(f"train_async: true needs the train stage; the stages are {names}")
        cut = names.index("train")
        self.before, self.after = pipeline.stages[:cut], pipeline.stages[cut + 1:]
        self.trainer = self.pipeline.parts.plugin("trainer")
        if self.trainer is None:
            raise ValueError("train_async: true needs a trainer (trainer=policy_gradient or trainer=function)")
        self.bound = int(pipeline.schedule.max_weight_staleness)
        # generated, not yet finished, in rollout order; the first one is the one training
        self.pending: deque[RolloutContext] = deque()
        self.training: Future[tuple[dict[str, Any], float]] | None = None
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainer")

    def run(self) -> dict[str, Any]:
        """Every scheduled rollout; returns the metrics of the last step."""
        pipe, sched = self.pipeline, self.pipeline.schedule
        last: dict[str, Any] = {}
        pipe.restore_from_checkpoint()
        try:
            before_train: dict[str, Any] = {}
            if sched.eval_before_train and pipe.eval_fn is not None:
                before_train = pipe.evaluate(sched.start_rollout_id)
            for rollout_id in range(sched.start_rollout_id, sched.num_rollout):
                ctx = pipe.start_rollout(rollout_id)
                ctx.metrics.update(before_train)
                before_train = {}
                pipe.run_stages(ctx, self.before)
                self.pending.append(ctx)
                self.start_training()
                finish_to = rollout_id if sched.should_save(rollout_id) else rollout_id - self.bound
                while self.pending and self.pending[0].rollout_id <= finish_to:
                    last = self.finish_oldest()
        finally:
            # Ctrl-C or an error: the training in flight ends (seconds); queued ones never start
            self.executor.shutdown(wait=True, cancel_futures=True)
        return last

    def start_training(self) -> None:
        """Start training the oldest pending rollout unless one trains already. Its staleness is
        taken here, against the version the engine serves (the trainer's, as the push came first)."""
        if self.training is not None or not self.pending:
            return
        ctx = self.pending[0]
        serving = getattr(self.pipeline.parts.plugin("engine"), "weight_version", None)
        if isinstance(serving, int):
            ctx.extra_metrics.update(staleness_metrics(ctx.samples, serving))
        self.training = self.executor.submit(_train, self.trainer, ctx)

    def finish_oldest(self) -> dict[str, Any]:
        """Wait for the oldest rollout's training, push its weights, start the next training,
        then its remaining stages, eval and commit (as the sync loop); returns its metrics."""
        pipe, parts = self.pipeline, self.pipeline.parts
        ctx = self.pending.popleft()
        assert self.training is not None, "the oldest pending rollout is always training"
        waited_from = time.perf_counter()
        try:
            train_metrics, seconds = self.training.result()
        except Exception as exc:
            exc.add_note(f"in stage 'train' of rollout {ctx.rollout_id} (trained in the background: train_async)")
            raise
        finally:
            self.training = None
        waited = time.perf_counter() - waited_from
        ctx.metrics.update(train_metrics)
        if ctx.train_data is not None:  # as the sync train stage: no train data, no update, no sync
            ctx.metrics.update(sync_trained_weights(self.trainer, parts))
        ctx.timings["train"] = seconds
        ctx.metrics["perf/async_train_wait_time"] = waited
        ctx.metrics["perf/async_overlap_time"] = max(0.0, seconds - waited)
        self.start_training()  # the next rollout trains while this one is logged and the next generates
        pipe.run_stages(ctx, self.after)
        pipe.add_stage_times(ctx)
        metrics = dict(ctx.metrics)
        if pipe.eval_fn is not None and pipe.schedule.should_eval(ctx.rollout_id):
            metrics.update(pipe.evaluate(ctx.rollout_id))  # the engine serves version rollout_id + 1
        if pipe.schedule.should_save(ctx.rollout_id) and self.training is not None:
            raise RuntimeError(f"train_async: rollout {ctx.rollout_id} is checkpointed while rollout "
                               f"{self.pending[0].rollout_id} trains (a checkpoint must be a barrier)")
        pipe.commit_in_order(ctx.rollout_id, metrics)
        return metrics
