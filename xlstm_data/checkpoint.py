"""The data position as an orbax checkpoint item, saved in the model's step.

Keeping the iterator state inside the same orbax step as the model makes the
two one unit: they are written together (asynchronously, with the model),
become visible together when orbax commits the step, and are pruned together
by `max_to_keep`. Use it inside a composite::

    manager.save(step, args=ocp.args.Composite(
        model=ocp.args.StandardSave(state), data=DataCheckpointSave(iterator)))
    manager.restore(step, args=ocp.args.Composite(
        model=ocp.args.StandardRestore(abstract_state), data=DataCheckpointRestore(iterator)))

Each process writes `process_<i>-of-<n>.json`: a header (our format version,
grain's version, the process index and count, the data step, the orbax step
it was saved in and a fingerprint of the data config), its iterator state,
and a SHA-256 checksum over both. A file edited by hand (still valid JSON) or
damaged is refused by its checksum, naming it, and the steps of header, state
and orbax step directory must agree. A planned iterator's state (the
config path) is the step and the plan's cursor, the same in every file, so a
restore on another process count reads the saving processes' files and checks
that they agree. A restore refuses what would silently resume the wrong data: a
changed data config (or factory arguments) unless the change is explicitly
allowed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

from xlstm_data.config.factory_settings import FactorySettings
from xlstm_data.config.fingerprint import (
    allowed_by,
    allowed_patterns,
    config_changes,
    disallowed_changes,
    fingerprint,
    flat_data_config,
    identity_keys_of_unbound_sources,
    is_identity_key,
)
from xlstm_data.config.resume_changes import future_only_changes, is_mixture_key
from xlstm_data.errors import DataCheckpointError
from xlstm_data.multihost.plan_state import (
    is_plan_state,
    merge_plan_states,
    saved_data_step,
)
from xlstm_data.sources.identity import describe_changes

#: Version of the per-process file layout below; bump on format changes.
#: 2: a checksum over header and state, and the orbax step in the header.
CHECKPOINT_FORMAT_VERSION = 2

STATE_FILE = re.compile(r"process_(\d+)-of-(\d+)\.json")


def state_file_name(process_index: int, process_count: int) -> str:
    """Name of one process's data-state file inside the checkpoint item."""
    return f"process_{process_index}-of-{process_count}.json"


def _grain_version() -> str:
    return importlib.metadata.version("grain")


def _flat_config(iterator: Any, data_config: Any) -> dict[str, Any] | None:
    config = data_config if data_config is not None else iterator.data_config
    if config is None:
        return None
    if isinstance(config, FactorySettings):
        return config.flat(iterator.source_documents, iterator.source_identities)
    return flat_data_config(config, iterator.source_documents, iterator.source_identities)


class DataCheckpointHandler(ocp.AsyncCheckpointHandler):
    """Writes and reads one JSON file per process in the `data` item."""

    def _record(
        self, directory: epath.Path, args: DataCheckpointSave
    ) -> tuple[str, dict[str, Any]]:
        layout = args.iterator.layout
        state = args.iterator.get_state()
        flat = _flat_config(args.iterator, args.data_config)
        header = {
            "format_version": CHECKPOINT_FORMAT_VERSION,
            "grain_version": _grain_version(),
            "process_index": layout.process_index,
            "process_count": layout.process_count,
            "step": state.get("step"),
            "orbax_step": orbax_step_of(directory),
            "data_config_fingerprint": None if flat is None else fingerprint(flat),
            "data_config": flat,
        }
        if layout.process_index == 0:  # the file tables once, to name changed files
            header["data_files"] = args.iterator.source_files
        name = state_file_name(layout.process_index, layout.process_count)
        return name, {"header": header, "state": state, "checksum": checksum(header, state)}

    async def async_save(
        self, directory: epath.Path, args: DataCheckpointSave
    ) -> list[ocp.future.Future]:
        # The state is taken now, synchronously; only the write is deferred.
        name, record = self._record(directory, args)
        text = json.dumps(record)

        async def write() -> None:
            (directory / name).write_text(text)

        return [ocp.future.CommitFutureAwaitingContractedSignals(write(), name="data_save")]

    def save(self, directory: epath.Path, args: DataCheckpointSave) -> None:
        name, record = self._record(epath.Path(directory), args)
        (epath.Path(directory) / name).write_text(json.dumps(record))

    def restore(self, directory: epath.Path, args: DataCheckpointRestore) -> dict[str, Any]:
        """Sets the iterator to the saved position; returns the saved header.

        On several processes, all of them agree before returning: if any
        process fails (a refusal, or any other exception: an unreadable file,
        a bug), every process raises, instead of the others waiting at
        orbax's next barrier until it times out.
        """
        directory = epath.Path(directory)
        layout = args.iterator.layout
        error: Exception | None = None
        header: dict[str, Any] = {}
        try:
            header = self._restore_here(directory, args)
        except Exception as failure:  # agreed on below, then re-raised
            error = failure
        if layout.process_count > 1:
            failed = multihost_utils.process_allgather(np.int32(error is not None))
            failing = [int(i) for i in np.flatnonzero(np.asarray(failed))]
            if failing and error is None:
                error = DataCheckpointError(
                    f"process(es) {failing} failed to restore the data position from "
                    f"{directory} (this process's state was fine); see their error"
                )
        if error is not None:
            raise error
        return header

    def _restore_here(self, directory: epath.Path, args: DataCheckpointRestore) -> dict[str, Any]:
        layout = args.iterator.layout
        path = directory / state_file_name(layout.process_index, layout.process_count)
        path, header, state = _planned_record(directory, path, layout)
        _check_steps(directory, path, header, state)
        current = _flat_config(args.iterator, args.data_config)
        data_step = saved_data_step(state)
        changed, _ = _check_config(
            path,
            header.get("data_config"),
            current,
            args.allow_config_change,
            data_step,
            files=(_recorded_files(directory), args.iterator.source_files),
        )
        if header.get("grain_version") != _grain_version():
            logging.warning(
                "data state in %s was written with grain %s; this run has grain %s",
                path,
                header.get("grain_version"),
                _grain_version(),
            )
        try:
            args.iterator.set_state(state)
        except Exception as error:
            hint = ""
            if changed:
                hint = (
                    f"; the allowed config changes ({', '.join(changed)}) may change the "
                    "pipeline's structure, which a streaming pipeline's saved position cannot "
                    "carry over"
                )
            raise DataCheckpointError(
                f"the data state in {path} (data step {header.get('step')}, grain "
                f"{header.get('grain_version')}) could not be applied to this run's pipeline "
                f"(grain {_grain_version()}): {type(error).__name__}: {error}{hint}"
            ) from error
        logging.info(
            "restored data position at step %s (data step %d) from %s",
            header.get("step"),
            data_step,
            path,
        )
        return header

    def metadata(self, directory: epath.Path) -> dict[str, Any] | None:
        """The per-process state files present (not parsed, so it never fails on them)."""
        names = sorted(p.name for p in epath.Path(directory).glob("process_*-of-*.json"))
        return {"state_files": names} if names else None

    def finalize(self, directory: epath.Path) -> None:
        del directory

    def close(self) -> None:
        pass


@ocp.args.register_with_handler(DataCheckpointHandler, for_save=True)
@dataclasses.dataclass
class DataCheckpointSave(ocp.args.CheckpointArgs):
    """Saves `iterator`'s position (its state when the save starts).

    Attributes:
      iterator: The data iterator (`PlannedDataIterator`).
      data_config: The data config to fingerprint; defaults to
        `iterator.data_config`, which `iterators_from_config` sets.
    """

    iterator: Any
    data_config: Any = None


@ocp.args.register_with_handler(DataCheckpointHandler, for_restore=True)
@dataclasses.dataclass
class DataCheckpointRestore(ocp.args.CheckpointArgs):
    """Moves `iterator` to the saved position and starts prefetching from there.

    Attributes:
      iterator: The freshly built iterator of the resumed run.
      allow_config_change: Data-config keys allowed to differ from the saved
        run: True for any, or glob patterns such as `"data.train.*.weight"`
        (new mixture weights are the usual intended change). Any other change
        is refused with the list of changed keys.
      data_config: The current data config; defaults to `iterator.data_config`.
    """

    iterator: Any
    allow_config_change: bool | str | Iterable[str] = False
    data_config: Any = None

    def __post_init__(self):
        allowed_patterns(self.allow_config_change)  # refuses a bad value up front


def _planned_record(
    directory: epath.Path, own: epath.Path, layout: Any
) -> tuple[epath.Path, dict[str, Any], dict[str, Any]]:
    """The planned position for this process, from any process layout.

    On the saving layout this process's own file holds the position; on
    another layout every file of the saving run is read, and they must agree.
    """
    if own.exists():  # the saving layout: set_state refuses a position of an older format
        header, state = read_record(own)
        _check_version(own, header)
        return own, header, state
    saved = sorted(
        (int(m.group(2)), int(m.group(1)), p)
        for p in directory.glob("process_*-of-*.json")
        if (m := STATE_FILE.fullmatch(p.name))
    )
    counts = sorted({count for count, _, _ in saved})
    if not saved:
        raise DataCheckpointError(f"the checkpoint item {directory} holds no data-state file")
    if len(counts) > 1:
        raise DataCheckpointError(
            f"the checkpoint item {directory} mixes files of process counts {counts}; it is "
            "corrupted"
        )
    records = [read_record(p) for _, _, p in saved]
    present = sorted(index for _, index, _ in saved)
    if present != list(range(counts[0])):
        raise DataCheckpointError(
            f"the checkpoint item {directory} has the files of processes {present} of "
            f"{counts[0]}; every saving process's file is needed to resume on another layout"
        )
    for (_, _, p), (header, _) in zip(saved, records, strict=True):
        _check_version(p, header)
    states = [state for _, state in records]
    if not all(is_plan_state(state) for state in states):
        raise DataCheckpointError(
            f"the data position in {directory} was saved by process_count={counts[0]} processes "
            f"with the streaming pipeline of an older version, which cannot be carried over; "
            "restore the model only and restart the data deliberately (--start_data_fresh)"
        )
    logging.info(
        "resuming the planned data position of %d processes on %d",
        counts[0],
        layout.process_count,
    )
    merged = merge_plan_states(states, layout.process_index)
    return saved[0][2], records[0][0], merged


def _check_version(path: epath.Path, header: Mapping[str, Any]) -> None:
    version = header.get("format_version")
    if version != CHECKPOINT_FORMAT_VERSION:
        raise DataCheckpointError(
            f"data-state file {path} has format_version={version!r}; this version of "
            f"xlstm-data reads format_version={CHECKPOINT_FORMAT_VERSION}"
        )


def checksum(header: Mapping[str, Any], state: Mapping[str, Any]) -> str:
    """SHA-256 of header and state in a canonical JSON form (sorted keys)."""
    text = json.dumps({"header": header, "state": state}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def orbax_step_of(directory: epath.Path) -> int | None:
    """The step of the orbax step directory an item directory is in (also while in flight)."""
    match = re.match(r"(\d+)", epath.Path(directory).parent.name)
    return int(match.group(1)) if match else None


_RESTORE_ELSEWHERE = (
    "restore an earlier checkpoint step, or pass start_data_fresh=True (trainer_hooks.train: "
    "--start_data_fresh) to start the data stream over deliberately"
)


def read_record(path: epath.Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Header and state of a data-state file, whose checksum must hold."""
    try:
        record = json.loads(path.read_text())
        header, state = record["header"], record["state"]
        if not isinstance(header, Mapping) or not isinstance(state, Mapping):
            raise TypeError("header and state must be JSON objects")
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as error:
        raise DataCheckpointError(
            f"data-state file {path} is corrupted or truncated ({type(error).__name__}: "
            f"{error}); {_RESTORE_ELSEWHERE}"
        ) from error
    if header.get("format_version") == CHECKPOINT_FORMAT_VERSION and record.get(
        "checksum"
    ) != checksum(header, state):
        raise DataCheckpointError(
            f"data-state file {path} fails its checksum: it was edited or damaged after it was "
            f"saved, so the position it holds cannot be trusted; {_RESTORE_ELSEWHERE}"
        )
    return dict(header), dict(state)


def _check_steps(
    directory: epath.Path, path: epath.Path, header: Mapping[str, Any], state: Mapping[str, Any]
) -> None:
    """The header's step, the state's and the orbax step directory's must agree."""
    if header.get("step") != state.get("step"):
        raise DataCheckpointError(
            f"data-state file {path} records step {header.get('step')} in its header but "
            f"{state.get('step')} in its state; it is corrupted. {_RESTORE_ELSEWHERE}"
        )
    saved_in, found_in = header.get("orbax_step"), orbax_step_of(directory)
    if saved_in is not None and found_in is not None and saved_in != found_in:
        raise DataCheckpointError(
            f"data-state file {path} was saved in checkpoint step {saved_in} but lies in step "
            f"{found_in}; a data item moved between steps would resume the wrong data. "
            f"{_RESTORE_ELSEWHERE}"
        )


def _check_config(
    path: epath.Path,
    saved: Mapping[str, Any] | None,
    current: Mapping[str, Any] | None,
    allowed: bool | str | Iterable[str],
    data_step: int,
    files: tuple[Any, Any] = (None, None),
) -> tuple[list[str], list[str]]:
    """Refuses disallowed changes.

    Changes that only concern steps from `data_step` on (new mixture stages,
    new skip ranges) are accepted without being allowed (`resume_changes`).

    `files` holds the recorded and the current file tables, which name the
    changed files when a dataset's file digest changed.

    Returns:
      `(keys of every accepted change, keys accepted without being allowed)`.
    """
    if saved is None or current is None:
        if saved != current:
            logging.warning(
                "cannot compare data configs for %s: only the %s run recorded one",
                path,
                "saved" if saved is not None else "current",
            )
        return [], []
    unbound = set(identity_keys_of_unbound_sources(saved, current))
    if unbound:
        logging.warning(
            "the checkpoint in %s predates binding runs to their data files; the files behind "
            "the datasets are not compared",
            path,
        )
        current = {k: v for k, v in current.items() if k not in unbound}
    changes = config_changes(saved, current)
    future, mixture_reason = future_only_changes(changes, saved, current, data_step)
    refused = disallowed_changes([c for c in changes if c not in future], allowed)
    if refused:
        listed = "; ".join(describe_changes(refused, *files))
        why = ""
        if mixture_reason and any(is_mixture_key(key) for key, _, _ in refused):
            why = f" ({mixture_reason})"
        patterns = sorted({_allow_pattern(key) for key, _, _ in refused})
        raise DataCheckpointError(
            f"the data config changed since the checkpoint in {path} was saved: {listed}{why}. "
            "Resuming would not continue the same data stream. Restore the old values, or "
            f"allow the change explicitly (trainer_hooks.train: --allow_data_config_change="
            f"{','.join(patterns)}; DataCheckpointRestore(iterator, allow_config_change="
            f"{patterns!r}))"
        )
    for key, old, new in changes:
        logging.warning("resuming with an allowed data config change: %s: %r -> %r", key, old, new)
    unasked = [key for key, _, _ in future if not allowed_by(key, allowed)]
    return [key for key, _, _ in changes], unasked


def _recorded_files(directory: epath.Path) -> dict[str, Any] | None:
    """The file tables process 0 recorded in the checkpoint (None if it recorded none)."""
    for path in directory.glob("process_0-of-*.json"):
        try:
            return json.loads(path.read_text())["header"].get("data_files")
        except (OSError, ValueError, KeyError, TypeError):
            return None
    return None


def _allow_pattern(key: str) -> str:
    """The pattern that allows a change: a data identity's dataset, else the key itself."""
    if is_identity_key(key):
        return ".".join(key.split(".")[:3])
    return key
