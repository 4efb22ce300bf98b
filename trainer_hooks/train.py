"""Reference config-driven training run: a tiny causal LM on the config's data.

    python -m trainer_hooks.train --config=configs/demo.py --workdir=/tmp/demo

It shows the plugin end to end: iterators from the config, the model and
data position saved in one orbax step by `CheckpointHook`, `DataMetricsHook`
and a progress line, and a resume from the latest step when rerun with the
same workdir. Every step's batch fingerprint goes to `WORKDIR/batches.jsonl`
and the metrics to `WORKDIR/metrics.jsonl`, so a resumed run can be compared
with an uninterrupted one. Several processes: pass `--coordinator`,
`--num_processes` and `--process_id` on each (or set `JAX_COORDINATOR_ADDRESS`,
`JAX_NUM_PROCESSES`, `JAX_PROCESS_ID`), or `--distributed` on a cluster JAX
detects by itself.
"""

# ruff: noqa: E402 - a multi-process launcher exits before the heavy imports

from __future__ import annotations

import sys

from trainer_hooks.early_config_check import exit_if_config_is_bad, exit_with_error, parse_or_exit
from trainer_hooks.launch import define_launch_flags, exit_if_watching

if __name__ == "__main__":  # both read the flags alone (the packages import their names lazily)
    exit_if_config_is_bad(sys.argv[1:])
    exit_if_watching(sys.argv[1:])

import logging as std_logging
import os
import signal
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
import portpicker
from absl import app, flags, logging
from etils import epath
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec

from trainer_hooks.adaptive_mixture import (
    ADAPTIVE_MIXTURE_ITEM,
    AdaptiveMixtureHook,
    check_adaptive_mixture,
)
from trainer_hooks.batch_log import BatchLog, batch_fingerprint
from trainer_hooks.checkpointing import CheckpointHook, checkpoint_manager, restore_or_initialize
from trainer_hooks.config import with_defaults
from trainer_hooks.data_metrics import DataMetricsHook
from trainer_hooks.lost_process import die_with_parent, in_child
from trainer_hooks.model import ModelConfig, create_train_state, eval_step, train_step
from trainer_hooks.progress import ProgressHook
from trainer_hooks.writers import WRITER_KINDS, make_writer
from xlstm_data import (
    DataCheckpointError,
    DataConfigError,
    DataReadError,
    create_mesh,
    iterators_from_config,
)
from xlstm_data.config.overrides import define_config_file

_CONFIG = define_config_file(
    "Run config (a configs/*.py file); override keys with --config.KEY=VALUE."
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Checkpoints, metrics and batch log go here.")
_LAUNCH = define_launch_flags()
_CPU_DEVICES = flags.DEFINE_integer(
    "cpu_devices", None, "CPU devices per process (CPU runs).", lower_bound=1
)
_INIT_TIMEOUT = flags.DEFINE_integer("initialization_timeout", 300, "Seconds to wait for peers.")
_RESTORE_STEP = flags.DEFINE_integer(
    "restore_step",
    None,
    "Restore this checkpoint step instead of the latest (e.g. when the latest is damaged).",
    lower_bound=0,
)
_START_DATA_FRESH = flags.DEFINE_bool(
    "start_data_fresh", False, "Restore only the model and start the data stream over."
)
_ALLOW_CHANGE = flags.DEFINE_list(
    "allow_data_config_change",
    [],
    "Data-config keys (glob patterns) allowed to differ from the checkpoint's.",
)
_PREEMPT_AT = flags.DEFINE_integer(
    "simulate_preemption_at_step",
    None,
    "SIGKILL this process right after this step (to try resuming).",
)
_VERBOSE = flags.DEFINE_bool(
    "verbose", False, "Keep INFO logs of all libraries (default: only this run's own)."
)
_WRITER = flags.DEFINE_enum(
    "writer",
    "jsonl",
    list(WRITER_KINDS),
    "Metrics to WORKDIR/metrics.jsonl (jsonl), and also TensorBoard event files to "
    "WORKDIR/tensorboard (tensorboard; needs no TensorFlow).",
)
_FINGERPRINTS = flags.DEFINE_bool(
    "fingerprints", True, "Log a per-step batch fingerprint to WORKDIR/batches.jsonl."
)


#: Exit status after a pre-emption notice was handled (128 + SIGTERM, as a shell reports it).
PREEMPTED_EXIT_CODE = 143


class _OwnInfoOnly(std_logging.Filter):
    """Drops INFO records from other libraries (orbax is chatty); keeps warnings."""

    def filter(self, record: std_logging.LogRecord) -> bool:
        if record.levelno >= std_logging.WARNING:
            return True
        return any(part in record.pathname for part in ("trainer_hooks", "xlstm_data"))


def _size_the_cpu_thread_pool(devices: int) -> None:
    """Gives XLA's CPU client 2 threads per local device (unless PJRT_NPROC is set).

    Called for multi-process runs only: one process keeps its collectives in
    process, and more threads than cores only slow its steps.

    The CPU client runs device executions, and the tasks that launch them, on
    one pool of max(cores, devices) threads, and a launch waits while its
    device has 32 computations in flight. With gloo collectives across
    processes, a waiting launch can hold the thread the other local device's
    half of a collective needs, and every process then waits forever: 2
    processes x 2 devices on a 2-core machine hung at an eval after a
    checkpoint in about one run in ten, and a reproducer hung every time with
    2 threads and never with 4 (jaxlib 0.10.2; `jax_cpu_enable_async_dispatch`
    does not help). The variable is read when the CPU backend starts.
    """
    os.environ.setdefault("PJRT_NPROC", str(max(2 * devices, os.cpu_count() or 1)))


def _start_processes() -> None:
    """Joins the other processes, from flags, JAX_* variables or cluster detection."""
    coordinator = _LAUNCH.coordinator.value or os.environ.get("JAX_COORDINATOR_ADDRESS")
    if _CPU_DEVICES.value:
        if coordinator or _LAUNCH.distributed.value:  # collectives across processes
            _size_the_cpu_thread_pool(_CPU_DEVICES.value)
        jax.config.update("jax_num_cpu_devices", _CPU_DEVICES.value)
    num_processes = _LAUNCH.num_processes.value or _env_int("JAX_NUM_PROCESSES")
    process_id = _LAUNCH.process_id.value
    if process_id is None:
        process_id = _env_int("JAX_PROCESS_ID")
    if coordinator or _LAUNCH.distributed.value:
        # Values left None are detected by JAX (SLURM, Open MPI, Kubernetes, TPU pods).
        jax.distributed.initialize(
            coordinator_address=coordinator,
            num_processes=num_processes,
            process_id=process_id,
            initialization_timeout=_INIT_TIMEOUT.value,
            heartbeat_timeout_seconds=_LAUNCH.heartbeat_timeout.value,
        )
    else:
        # A one-process service on loopback, for JAX's preemption notice (SIGTERM),
        # which orbax's pre-emption policy and CheckpointHook act on. Its CPU
        # collectives stay in-process: gloo over TCP made a CPU step 10-30x slower.
        jax.config.update("jax_cpu_collectives_implementation", None)
        jax.distributed.initialize(
            coordinator_address=f"127.0.0.1:{portpicker.pick_unused_port()}",
            num_processes=1,
            process_id=0,
            initialization_timeout=_INIT_TIMEOUT.value,
        )


def _set_later_steps_aside(manager: Any, step: int, aside: epath.Path) -> None:
    """Moves the steps after `step` out of the way, so the run continues from `step`.

    They belong to the continuation being abandoned (a damaged latest step,
    say); kept in `aside`, never deleted, and the run saves its own steps.
    """
    kept = sorted(manager.all_steps())
    if step not in kept:
        raise DataCheckpointError(
            f"--restore_step={step} is not a checkpoint step in {manager.directory}; steps "
            f"kept: {kept}"
        )
    later = [s for s in kept if s > step]
    if not later:
        return
    if jax.process_index() == 0:
        aside.mkdir(parents=True, exist_ok=True)
        for s in later:
            target = aside / f"{s}.{time.strftime('%Y%m%dT%H%M%S')}"
            epath.Path(manager.directory / str(s)).rename(target)
            logging.warning(
                "--restore_step=%d: set checkpoint step %d aside in %s", step, s, target
            )
    multihost_utils.sync_global_devices("restore_step_set_aside")
    manager.reload()


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise app.UsageError(f"environment variable {name}={value!r} is not an integer") from None


def model_vocab_size(configured: int | None, iterators: Sequence[Any]) -> int:
    """The model's vocabulary: `model.vocab_size`, checked against the data's.

    An embedding lookup clamps ids beyond its table on accelerators, so a
    vocabulary smaller than the data's would train on wrong tokens silently.

    Args:
      configured: `config.model.vocab_size`, or None to use the data's.
      iterators: The run's iterators; their `sources` declare vocabularies.
    """
    vocabularies = {
        name: int(source.vocab_size)
        for iterator in iterators
        for name, source in getattr(iterator, "sources", {}).items()
        if getattr(source, "vocab_size", None) is not None
    }
    if configured is None:
        if not vocabularies:
            raise DataConfigError(
                "model.vocab_size is unset and no data source declares its vocabulary; "
                "set model.vocab_size to the tokenizer's vocabulary size"
            )
        return max(vocabularies.values())
    largest = max(vocabularies.items(), key=lambda item: item[1], default=None)
    if largest is not None and configured < largest[1]:
        raise DataConfigError(
            f"model.vocab_size={configured} is smaller than the vocabulary of data source "
            f"{largest[0]!r} ({largest[1]} ids); set model.vocab_size >= {largest[1]} or leave "
            "it unset to use the data's"
        )
    return int(configured)


def train(config: Any, workdir: str) -> dict[str, Any]:
    """Trains (or resumes) the run in `workdir`; returns a short summary."""
    config = with_defaults(config)
    workdir_path = epath.Path(os.path.abspath(workdir))
    workdir_path.mkdir(parents=True, exist_ok=True)
    primary = jax.process_index() == 0
    mesh = create_mesh(config.mesh.axis_dims)
    batch_axes = config.mesh.batch_axis_names
    train_iter, eval_iters = iterators_from_config(config.data, mesh, batch_axis_names=batch_axes)
    adaptive = dict(config.adaptive_mixture)
    adaptive_on = int(adaptive.pop("every_steps") or 0) > 0
    if adaptive_on:  # refuses a bad section by key before any step
        check_adaptive_mixture(
            config.adaptive_mixture.every_steps,
            adaptive["step_size"],
            adaptive["smoothing"],
            adaptive["reference_loss"],
            train_iter.source_names,
        )
    manager = checkpoint_manager(
        workdir_path / "checkpoints",
        max_to_keep=config.checkpoint.max_to_keep,
        json_items=[ADAPTIVE_MIXTURE_ITEM],
    )
    if manager.latest_step() is None:  # nothing to restore: fill packing bins during init
        train_iter.start_prefetch()
    num_steps = int(config.num_train_steps)
    seq_len = train_iter.data_config.max_target_length
    model_config = ModelConfig.from_config(
        config.model,
        model_vocab_size(config.model.vocab_size, [train_iter, *eval_iters.values()]),
        seq_len,
    )
    replicated = NamedSharding(mesh, PartitionSpec())
    init = jax.jit(
        lambda rng: create_train_state(
            rng,
            model_config,
            float(config.learning_rate),
            seq_len,
            warmup_steps=int(config.warmup_steps),
        ),
        out_shardings=replicated,
    )
    state = init(jax.random.key(int(config.seed)))
    saved_mixture: list[Any] = []  # the adaptive hook's saved sums, if any
    restore_step = _RESTORE_STEP.value
    if restore_step is not None:
        _set_later_steps_aside(manager, restore_step, workdir_path / "abandoned_checkpoints")
    state, start_step = restore_or_initialize(
        manager,
        train_iter,
        state,
        step=restore_step,
        start_data_fresh=_START_DATA_FRESH.value,
        allow_data_config_change=_ALLOW_CHANGE.value,
        extra_items={ADAPTIVE_MIXTURE_ITEM: saved_mixture.append} if adaptive_on else None,
    )

    batch_sharding = train_iter.sharding
    step_fn = jax.jit(
        train_step,
        in_shardings=(replicated, batch_sharding),
        out_shardings=(
            replicated,
            {"loss": replicated, "tokens": replicated, "token_loss": batch_sharding},
        ),
        donate_argnums=0,
    )
    eval_fn = jax.jit(eval_step, in_shardings=(replicated, batch_sharding))

    writer = make_writer(_WRITER.value, workdir_path, primary=primary)
    batch_log = BatchLog(workdir_path / "batches.jsonl", enabled=primary and _FINGERPRINTS.value)
    log_every = int(config.log_every_steps)
    latest: dict[str, Any] = {}
    data_hook = DataMetricsHook(writer, train_iter, every_steps=log_every, start_step=start_step)
    # Before the checkpoint hook, so a checkpoint at an update step holds the update.
    mixture_hooks, extra_items = [], {}
    if adaptive_on:
        mixture_hook = AdaptiveMixtureHook(
            train_iter,
            every_steps=config.adaptive_mixture.every_steps,
            start_step=start_step,
            **adaptive,
        )
        for saved in saved_mixture:
            mixture_hook.set_state(saved)
        mixture_hooks.append(mixture_hook)
        extra_items[ADAPTIVE_MIXTURE_ITEM] = mixture_hook.state
    loss_hooks = [*mixture_hooks, data_hook]
    checkpoint_hook = CheckpointHook(
        manager,
        lambda: state,
        train_iter,
        every_steps=config.checkpoint.every_steps,
        every_secs=config.checkpoint.every_secs,
        start_step=start_step,
        extra_items=extra_items,
    )
    hooks = [
        *mixture_hooks,
        checkpoint_hook,
        data_hook,
        ProgressHook(
            num_steps,
            every_steps=log_every,
            every_secs=None,
            iterator=train_iter,
            metrics=lambda: {"loss": float(latest["loss"])},
            start_step=start_step,
        ),
    ]

    def evaluate(step: int) -> None:
        for name, iterator in eval_iters.items():
            started = time.perf_counter()
            logging.info("eval %s at step %d: %s batches", name, step, iterator.iterator_length)
            totals = [eval_fn(state, batch) for batch in iterator]
            loss_sum = sum(float(t["loss_sum"]) for t in totals)
            tokens = sum(float(t["tokens"]) for t in totals)
            loss = loss_sum / max(tokens, 1.0)
            writer.write_scalars(step, {f"eval/{name}/loss": loss})
            logging.info(
                "eval %s at step %d: loss %.4f over %d tokens in %.1f s",
                name,
                step,
                loss,
                tokens,
                time.perf_counter() - started,
            )

    eval_every = int(config.eval_every_steps or 0)
    if start_step >= num_steps:
        logging.warning("the checkpoint is at step %d >= num_train_steps=%d", start_step, num_steps)
    pending: tuple[int, int, dict[str, Any], str | None, int] | None = None
    preempted_at: int | None = None
    loop_started = time.perf_counter()
    for step in range(start_step + 1, num_steps + 1):
        batch = next(train_iter)
        fingerprint = batch_fingerprint(batch) if _FINGERPRINTS.value else None
        state, metrics = step_fn(state, batch)
        for hook in loss_hooks:
            hook.record_loss(metrics["token_loss"], batch.source_ids)
        if pending is not None:
            _log_step(batch_log, writer, *pending, log_every)
        data_step = train_iter.data_step_at(step - 1)  # the batch of update `step`
        pending = (step, data_step, metrics, fingerprint, int(batch.inputs.shape[0]))
        latest = metrics
        for hook in hooks:
            hook(step)
        if checkpoint_hook.preempted:
            preempted_at = step
            break
        if eval_every and step % eval_every == 0:
            evaluate(step)
        if step == _PREEMPT_AT.value:
            _log_step(batch_log, writer, *pending, log_every)
            logging.warning("simulating a pre-emption after step %d: SIGKILL", step)
            os.kill(os.getpid(), signal.SIGKILL)
    train_secs = time.perf_counter() - loop_started
    if pending is not None:
        _log_step(batch_log, writer, *pending, log_every)
    if start_step < num_steps and preempted_at is None:
        checkpoint_hook.finish(num_steps)
        if eval_iters and not (eval_every and num_steps % eval_every == 0):
            evaluate(num_steps)
    tokens_seen = data_hook.tokens_seen()  # over every data host
    writer.flush()
    batch_log.close()
    manager.close()
    for iterator in (train_iter, *eval_iters.values()):
        iterator.close()
    return {
        "resumed_from_step": start_step,
        "final_step": num_steps if preempted_at is None else preempted_at,
        "preempted": preempted_at is not None,
        "final_loss": float(latest["loss"]) if latest else None,
        "checkpoints": str(workdir_path / "checkpoints"),
        "saved_steps": list(manager.all_steps()),
        "metrics": str(workdir_path / "metrics.jsonl"),
        "batches": str(workdir_path / "batches.jsonl"),
        "tokens_seen": tokens_seen,
        "data_wait_secs": float(np.round(train_iter.data_counters.wait_secs, 3)),
        "train_secs": float(np.round(train_secs, 3)),
    }


def _log_step(
    batch_log: Any,
    writer: Any,
    step: int,
    data_step: int,
    metrics: Mapping[str, Any],
    fingerprint: str | None,
    batch_size: int,
    log_every: int,
) -> None:
    """Logs a step once its (asynchronously computed) metrics are ready.

    `data_step` is the plan's step of the batch (`xlstm-data batch --step`):
    step - 1 unless `data.skip_steps` skipped data before it.
    """
    loss, tokens = float(metrics["loss"]), int(metrics["tokens"])
    batch_log.write(
        step,
        data_step=data_step,
        fingerprint=fingerprint,
        batch_size=batch_size,
        tokens=tokens,
        loss=loss,
    )
    if step % log_every == 0:
        writer.write_scalars(step, {"train/loss": loss, "train/data_step": data_step})


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if _CONFIG.value is None or not _WORKDIR.value:
        raise app.UsageError("--config and --workdir are required")
    debug = _LAUNCH.is_debug()
    # A lost process aborts the others inside JAX: a multi-process run trains in a
    # child (`launch.exit_if_watching`, before the imports), whose abort the
    # launched process turns into one line (see trainer_hooks.lost_process).
    if in_child():
        die_with_parent()
    if not _VERBOSE.value:
        logging.get_absl_handler().addFilter(_OwnInfoOnly())
    _start_processes()
    try:
        summary = train(_CONFIG.value, _WORKDIR.value)
    except (DataConfigError, DataCheckpointError, DataReadError) as error:
        # A user's error: its message names the key, file or record and what is valid.
        if debug:
            raise
        exit_with_error(f"{error} (--debug shows where)", 1)
    except Exception as error:
        if in_child() and jax.process_count() > 1 and "Gloo" in str(error):
            # A collective's peer closed its connection: a process was probably lost.
            # JAX names it once its heartbeats are missed, and aborts this process;
            # the watching parent turns that into one line.
            logging.warning(
                "a collective failed (%s); waiting for JAX to name the lost process",
                str(error).splitlines()[0][:200],
            )
            time.sleep(_LAUNCH.heartbeat_timeout.value + 20)
        raise
    if jax.process_index() == 0:
        if summary["preempted"]:
            print(f"pre-empted: step {summary['final_step']} is saved; rerun to resume")
        else:
            print("training finished:")
        for key, value in summary.items():
            print(f"  {key}: {value}")
    sys.stdout.flush()
    if summary["preempted"]:
        # Not 0: a job runner must not take a pre-empted run for a finished one.
        sys.exit(PREEMPTED_EXIT_CODE)


def parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing; a bad flag or `--config` override is one line, not a traceback.

    A value of the wrong type (`--config.data.global_batch_size=abc`, `=12.5`)
    or out of a flag's bounds (`--cpu_devices=0`) raises absl's flag error.
    """
    return parse_or_exit(flags.FLAGS, argv)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
