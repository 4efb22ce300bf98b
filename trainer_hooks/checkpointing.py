"""Saving and restoring the model and the data position as one orbax step.

A resumed run must continue on exactly the next batch with exactly the saved
model, so both go into the same `CheckpointManager` step: written together
(asynchronously), committed together, pruned together by `max_to_keep`.
`CheckpointHook` saves periodically from the loop; `restore_or_initialize`
picks up the latest step at start-up, and refuses a model-only checkpoint
unless the caller deliberately starts the data stream over.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from trainer_hooks.periodic import StepAnchoredAction
from xlstm_data.checkpoint import (
    DataCheckpointHandler,
    DataCheckpointRestore,
    DataCheckpointSave,
)
from xlstm_data.errors import DataCheckpointError

State = TypeVar("State")

MODEL_ITEM = "model"
DATA_ITEM = "data"
#: Beside the items in a step directory: the SHA-256 of every file of the model item.
MODEL_DIGESTS_FILE = "model.sha256.json"


def _sha256(path: epath.Path) -> str:
    """The file's SHA-256, read in 8 MiB pieces (local or cloud storage)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while piece := f.read(8 << 20):
            digest.update(piece)
    return digest.hexdigest()


def _file_digests(directory: epath.Path) -> dict[str, str]:
    """SHA-256 of every file under `directory`, by path relative to it."""
    digests, folders = {}, [directory]
    while folders:  # epath has no rglob on cloud storage
        for path in sorted(folders.pop().iterdir()):
            if path.is_dir():
                folders.append(path)
            else:
                digests[str(path.relative_to(directory))] = _sha256(path)
    return dict(sorted(digests.items()))


def write_model_digests(step_dir: epath.Path) -> None:
    """Records the SHA-256 of every file of a committed step's model item beside it.

    orbax checks that a step was committed, and TensorStore checksums OCDBT's
    tree nodes and the zarr3 shard index, but not the array chunks themselves:
    64 garbled bytes in a chunk restored silently and the loss diverged. The
    digests are taken once the step is committed (the files no longer
    change) and checked before it is restored (`check_model_digests`). Costs
    one read of the model item per checkpoint, on process 0 only; written to
    a temporary name and renamed, so a killed run leaves none or a whole one.
    """
    model = step_dir / MODEL_ITEM
    if not model.is_dir():
        return
    target = step_dir / MODEL_DIGESTS_FILE
    partial = step_dir / f"{MODEL_DIGESTS_FILE}.partial"
    partial.write_text(json.dumps({"sha256": _file_digests(model)}, indent=1))
    partial.rename(target)


def check_model_digests(manager: ocp.CheckpointManager, step: int) -> None:
    """Refuses a step whose model files differ from the digests taken when it was saved.

    A step without digests (saved before they existed, or killed between its
    commit and the digests) is restored with a warning: it cannot be checked.

    Raises:
      DataCheckpointError: Naming the step, the first file that is missing or
        differs, and the earlier step to restore instead.
    """
    step_dir = epath.Path(manager.directory) / str(step)
    record = step_dir / MODEL_DIGESTS_FILE
    if not record.exists():
        logging.warning(
            "checkpoint step %d has no %s: its model files are restored unchecked",
            step,
            MODEL_DIGESTS_FILE,
        )
        return
    try:
        expected = json.loads(record.read_text())["sha256"]
    except (ValueError, KeyError, TypeError) as error:
        raise DataCheckpointError(
            f"checkpoint step {step}: {record} is damaged ({error})"
            f"{_earlier_steps_hint(manager, step)}"
        ) from error
    model = step_dir / MODEL_ITEM
    for name, digest in expected.items():
        path = model / name
        if not path.is_file():
            found = "is missing"
        elif _sha256(path) == digest:
            continue
        else:
            found = "has changed since it was saved (its SHA-256 differs)"
        raise DataCheckpointError(
            f"checkpoint step {step} is damaged: model file {path} {found}"
            f"{_earlier_steps_hint(manager, step)}"
        )


class _InOrderPreemptionManager(ocp.CheckpointManager):
    """A `CheckpointManager` that asks JAX's preemption sync point in step order only,
    and records the model item's file digests once a step is committed.

    JAX's sync protocol takes the last step a process reported, adds one, and
    then waits for exactly that step (an equality test). orbax also asks from
    its async finalize thread, for the step being finalized, which is older
    than the loop's: when a notice arrived right after such a call, the sync
    step was one the loop had already passed, and the run trained on without
    ever saving (seen in 1 of ~6 SIGTERM test runs). Older steps are answered
    here from what the loop was told, without reporting them to JAX.

    The digests (`write_model_digests`) are written by process 0 after a
    save is finished: at the next save, `wait_until_finished`, `close`, or
    `write_finished_digests` (which `CheckpointHook` calls every step).
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._preemption_lock = threading.Lock()
        self._latest_asked = -1
        self._sync_step: int | None = None

        self._undigested: list[int] = []

    def save(self, step: int, *args: Any, **kwargs: Any) -> bool:
        saved = super().save(step, *args, **kwargs)
        if saved:
            self._undigested.append(step)
        return saved

    def wait_until_finished(self) -> None:
        super().wait_until_finished()
        self.write_finished_digests()

    def write_finished_digests(self) -> None:
        """Writes the model digests of the steps saved since, once no save is in flight.

        Cheap to call every step: without a finished step it returns at once.
        """
        if not self._undigested or self.is_saving_in_progress():
            return
        steps, self._undigested = self._undigested, []
        if jax.process_index() != 0:
            return
        for step in steps:
            if step in self.all_steps():  # not pruned by max_to_keep meanwhile
                write_model_digests(self.directory / str(step))

    def reached_preemption(self, step: int) -> bool:
        with self._preemption_lock:
            if step < self._latest_asked:
                return step == self._sync_step
            self._latest_asked = step
            reached = super().reached_preemption(step)
            if reached:
                self._sync_step = step
            return reached


def checkpoint_manager(
    directory: epath.PathLike,
    *,
    max_to_keep: int | None = 2,
    async_save: bool = True,
    json_items: Iterable[str] = (),
) -> ocp.CheckpointManager:
    """A manager for `{model, data}` steps under `directory` (made absolute).

    `json_items` names further items saved as JSON in the same steps (a
    hook's state, such as `AdaptiveMixtureHook`'s).
    """
    path = epath.Path(directory)
    if not path.is_absolute():
        path = epath.Path(path.resolve())
    _no_replica_slices_on_cpu()
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep, enable_async_checkpointing=async_save, create=True
    )
    handlers = {MODEL_ITEM: ocp.StandardCheckpointHandler(), DATA_ITEM: DataCheckpointHandler()}
    handlers.update({name: ocp.JsonCheckpointHandler() for name in json_items})
    return _InOrderPreemptionManager(path, options=options, item_handlers=handlers)


def _no_replica_slices_on_cpu() -> None:
    """On CPU devices, orbax saves each replicated array whole from its first replica.

    orbax's replica-parallel save (its default unless `JAX_PLATFORMS` names a
    GPU) has every replica write a slice of a replicated array, cut with one
    JAX slice per array and shape, traced and compiled in the saving thread.
    CPU devices share the host's memory, so the slices parallelise nothing:
    in a 30-step run of `tests/train_config.py` (2 CPU devices, a save every
    4 steps) the slicing was 17.5 % of the main thread, and the run took
    5.9-7.2 s instead of 8.7-9.6 s. The replacement handler keeps the default
    one's array-metadata store (where orbax records, for instance, a typed
    PRNG key's implementation); where orbax no longer exposes it, its default
    handler is left in place.
    """
    if jax.default_backend() != "cpu":
        return
    default = ocp.type_handlers.get_type_handler(jax.Array)
    store = getattr(default, "_array_metadata_store", None)
    if store is None:
        return
    handler = ocp.type_handlers.ArrayHandler(use_replica_parallel=False, array_metadata_store=store)
    ocp.type_handlers.register_type_handler(jax.Array, handler, override=True)


def save_args(
    state: Any, iterator: Any, extra: Mapping[str, Any] | None = None
) -> ocp.args.Composite:
    """The composite saving `state`, `iterator`'s position and `extra` JSON items in one step."""
    items = {MODEL_ITEM: ocp.args.StandardSave(state), DATA_ITEM: DataCheckpointSave(iterator)}
    items.update({name: ocp.args.JsonSave(value) for name, value in (extra or {}).items()})
    return ocp.args.Composite(**items)


class CheckpointHook(StepAnchoredAction):
    """Saves model and data position in one orbax step, periodically.

    Call it after every training step with the number of steps done. It
    also follows orbax's pre-emption policy: once JAX's preemption service
    reports a sync point (a SIGTERM, or the scheduler's notice, reached every
    process), it saves that step, waits for the write, and sets `preempted`;
    the loop should then stop. The service runs once `jax.distributed` is
    initialized (`trainer_hooks.train` initializes it on one process too).
    With `every_secs` on several processes, process 0's clock decides for all, so
    every process saves at the same step (a save is a collective); the clock
    is consulted only every `secs_check_every_steps` steps, since agreeing
    is itself a collective that would otherwise stall every step.

    Args:
      manager: The orbax `CheckpointManager`.
      get_state: Returns the model/train state to save (a pytree).
      iterator: The train iterator whose position is saved with it.
      every_steps: Save when the step is a multiple of this.
      every_secs: Save when this long has passed since the last save.
      on_steps: Also save at these steps.
      start_step: Steps already done (the restored step) when the loop starts.
      extra_items: `{item name: returns its JSON-able state}` saved in the same
        steps (register the names with `checkpoint_manager(json_items=...)`).
      secs_check_every_steps: On several processes, how often (in steps) the
        `every_secs` clock is agreed on.
    """

    def __init__(
        self,
        manager: ocp.CheckpointManager,
        get_state: Callable[[], Any],
        iterator: Any,
        *,
        every_steps: int | None = None,
        every_secs: float | None = None,
        on_steps: Iterable[int] | None = None,
        start_step: int = 0,
        extra_items: Mapping[str, Callable[[], Any]] | None = None,
        secs_check_every_steps: int = 10,
    ):
        super().__init__(
            every_steps=every_steps, every_secs=every_secs, on_steps=on_steps, start_step=start_step
        )
        self.secs_check_every_steps = secs_check_every_steps
        self.manager = manager
        self.get_state = get_state
        self.iterator = iterator
        self.extra_items = dict(extra_items or {})
        self._preempted_at: int | None = None

    @property
    def preempted(self) -> bool:
        """Whether a pre-emption was signalled and its step is saved."""
        return self._preempted_at is not None

    def _should_trigger(self, step: int, t: float) -> bool:
        if isinstance(self.manager, _InOrderPreemptionManager):
            self.manager.write_finished_digests()  # of a save finished since the last step
        # Every process asks at every step: the sync point is agreed on collectively.
        if self.manager.reached_preemption(step):
            self._preempted_at = step
            return True
        if self._every_secs is None or jax.process_count() == 1:
            return super()._should_trigger(step, t)
        if super()._should_trigger(step, self._previous_time):  # clock held: steps only
            return True
        if step % self.secs_check_every_steps:
            return False
        due = t - self._previous_time > self._every_secs
        return bool(multihost_utils.broadcast_one_to_all(np.int32(due)))

    def _apply(self, step: int, t: float) -> None:
        del t
        if self._preempted_at == step:
            logging.warning("pre-emption notice: saving step %d before exiting", step)
            self.finish(step)
        else:
            self.save(step)

    def save(self, step: int, *, force: bool = True) -> bool:
        """Starts saving step `step` now (the write finishes in the background)."""
        if self.manager.latest_step() == step:
            return False
        extra = {name: get() for name, get in self.extra_items.items()}
        saved = self.manager.save(
            step, args=save_args(self.get_state(), self.iterator, extra), force=force
        )
        if saved:
            logging.info("checkpoint step %d started (model and data)", step)
        return saved

    def finish(self, step: int) -> None:
        """Saves `step` if it is not saved yet and waits for all writes to land."""
        self.save(step)
        self.manager.wait_until_finished()


def saved_items(manager: ocp.CheckpointManager, step: int) -> set[str]:
    """Names of the items stored in checkpoint step `step`."""
    return set(manager.item_metadata(step).keys())


def restore_or_initialize(
    manager: ocp.CheckpointManager,
    iterator: Any,
    initial_state: State,
    *,
    step: int | None = None,
    start_data_fresh: bool = False,
    allow_data_config_change: bool | Iterable[str] = False,
    mesh: Mesh | None = None,
    extra_items: Mapping[str, Callable[[Any], None]] | None = None,
) -> tuple[State, int]:
    """Restores model and data position from a checkpoint, or starts fresh.

    Args:
      manager: The orbax `CheckpointManager`.
      iterator: The freshly built train iterator; moved to the saved position
        on restore. Either way it starts prefetching before this returns, so
        the first batches are ready while the train step compiles.
      initial_state: The freshly initialised state; its structure and dtypes
        are the restore target, and it is returned when there is no
        checkpoint. Arrays already laid out over the whole mesh keep their
        sharding; any other `jax.Array` (a plain `jnp.zeros`, an array on
        one device) is restored replicated over the mesh, so it meets the
        global batches in the train step. numpy leaves stay numpy.
      step: The step to restore; default the latest.
      start_data_fresh: Restore the model only and start the data stream from
        its beginning. Needed for a model-only checkpoint (otherwise refused,
        since the data position is unknown); use deliberately.
      allow_data_config_change: Data-config keys allowed to differ from the
        checkpoint (True, or glob patterns like `"data.train.*.weight"`).
      mesh: The mesh the state lives on; default the iterator's.
      extra_items: `{item name: takes its saved JSON state}` for the JSON
        items `CheckpointHook(extra_items=...)` saves; an item the step lacks
        (saved before it existed) is skipped with a warning.

    Returns:
      `(state, step)`: the state and the number of steps already done.
    """
    if step is None:
        step = manager.latest_step()
    if step is None:
        logging.info("no checkpoint in %s; starting from step 0", manager.directory)
        iterator.start_prefetch()
        return initial_state, 0
    items = saved_items(manager, step)
    if MODEL_ITEM not in items:
        raise DataCheckpointError(
            f"checkpoint step {step} in {manager.directory} has no {MODEL_ITEM!r} item "
            f"(found {sorted(items)}); it was not written by CheckpointHook"
        )
    target = restore_target(initial_state, _iterator_mesh(iterator, mesh))
    args = {MODEL_ITEM: ocp.args.StandardRestore(target)}
    if start_data_fresh:
        logging.warning(
            "start_data_fresh: restoring the model from step %d but starting the data stream "
            "from its beginning, as asked",
            step,
        )
    elif DATA_ITEM not in items:
        raise DataCheckpointError(
            f"checkpoint step {step} in {manager.directory} holds the model but no data "
            f"position (items: {sorted(items)}), so the next batch is unknown. Pass "
            "start_data_fresh=True (train.py: --start_data_fresh) to start the data stream "
            "over deliberately, or restore a step saved with the data"
        )
    else:
        args[DATA_ITEM] = DataCheckpointRestore(
            iterator, allow_config_change=allow_data_config_change
        )
    check_model_digests(manager, step)
    for name in extra_items or {}:
        if name in items:
            args[name] = ocp.args.JsonRestore()
        else:
            logging.warning("checkpoint step %d has no %r item; it starts empty", step, name)
    try:
        restored = manager.restore(step, args=ocp.args.Composite(**args))
    except DataCheckpointError as error:
        raise DataCheckpointError(f"{error}{_earlier_steps_hint(manager, step)}") from error
    except Exception as error:  # orbax's own: a damaged or incomplete step
        summary = str(error).strip().splitlines()[0][:300] if str(error).strip() else ""
        raise DataCheckpointError(
            f"checkpoint step {step} in {manager.directory} could not be restored "
            f"({type(error).__name__}: {summary}); it is damaged or incomplete"
            f"{_earlier_steps_hint(manager, step)}"
        ) from error
    for name, set_state in (extra_items or {}).items():
        if name in args:
            set_state(restored[name])
    logging.info("restored step %d from %s (items %s)", step, manager.directory, sorted(args))
    iterator.start_prefetch()
    return restored[MODEL_ITEM], step


def _earlier_steps_hint(manager: ocp.CheckpointManager, step: int) -> str:
    earlier = sorted(s for s in manager.all_steps() if s < step)
    if not earlier:
        return "; no earlier step is kept"
    return (
        f"; restore an earlier step: trainer_hooks.train --restore_step={earlier[-1]} "
        f"(restore_or_initialize(step=...); steps kept: {earlier})"
    )


def _iterator_mesh(iterator: Any, mesh: Mesh | None) -> Mesh | None:
    return mesh if mesh is not None else iterator.global_mesh


def restore_target(state: Any, mesh: Mesh | None) -> Any:
    """The abstract restore target of `state`: its shapes, dtypes and shardings.

    orbax restores each array with the sharding of its target. A `jax.Array`
    that is not laid out over the mesh would come back committed to one device
    (the one it was saved from, or the first), and the first train step
    would then mix it with batches sharded over all devices: "incompatible
    devices". Such leaves are restored replicated over the mesh instead.
    """
    if mesh is None:
        return state
    mesh_devices = set(mesh.devices.flat)
    replicated = NamedSharding(mesh, PartitionSpec())

    def leaf_target(leaf: Any) -> Any:
        if not isinstance(leaf, jax.Array):
            return leaf  # numpy and Python values come back as they are
        sharding = leaf.sharding
        if sharding.device_set != mesh_devices:
            sharding = replicated
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)

    return jax.tree.map(leaf_target, state)
