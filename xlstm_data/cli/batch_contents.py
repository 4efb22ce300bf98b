"""`xlstm-data batch`: the documents in the rows of given steps, from a config or a run.

With `--workdir` the run's own data config comes from its latest checkpoint
(the data section every checkpoint records), so what is listed is what that
run trained on, whatever the config file says today; the checkpoint's cursor
starts the planner when the asked steps lie after it, and its online mixture
updates (`set_mixture`) are replayed. The files behind the
datasets are compared with the ones the checkpoint recorded, and each changed
file is named in a warning: the listing would describe other documents.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from etils import epath

from xlstm_data.checkpoint import STATE_FILE, read_record
from xlstm_data.config.fingerprint import (
    config_changes,
    flat_data_config,
    identity_keys_of_unbound_sources,
    is_identity_key,
)
from xlstm_data.errors import DataCheckpointError, DataConfigError
from xlstm_data.from_config import TrainPlan, open_train_plan
from xlstm_data.multihost.plan_state import (
    check_state_format,
    cursor_by_name,
    merge_plan_states,
    saved_data_step,
)
from xlstm_data.plan.contents import RowContents, step_rows
from xlstm_data.plan.global_plan import Cursor, GlobalPlan
from xlstm_data.plan.mixture import updates_from_pairs, with_updates
from xlstm_data.sources.identity import (
    IDENTITY_KEYS,
    dataset_files,
    dataset_identities,
    describe_changes,
)


@dataclasses.dataclass(frozen=True)
class SavedRun:
    """The latest checkpoint of a run directory, as far as its data goes.

    Attributes:
      step: The checkpoint's training step.
      data_step: The data step its cursor continues at.
      flat_config: The flattened data config it recorded.
      states: Every process's saved iterator state.
      files: The datasets' file tables (process 0 records them).
    """

    step: int
    data_step: int
    flat_config: dict[str, Any]
    states: list[dict[str, Any]]
    files: dict[str, Any] | None = None

    def data_config(self) -> dict[str, Any]:
        """The data section, rebuilt from the recorded keys (data identities left out)."""
        nested: dict[str, Any] = {}
        for key, value in self.flat_config.items():
            parts = key.split(".")[1:]
            if parts[0] == "train" and len(parts) > 2 and parts[2] in (*IDENTITY_KEYS, "documents"):
                continue
            target = nested
            for part in parts[:-1]:
                target = target.setdefault(part, {})
            target[parts[-1]] = value
        return nested

    def cursor(self, plan: GlobalPlan) -> Cursor:
        """The plan's cursor, checked against all processes' files."""
        merged = merge_plan_states(self.states, 0)
        check_state_format(merged, plan.spec.packing)
        return Cursor.from_list(cursor_by_name(merged, plan.spec.names))

    def with_mixture_updates(self, plan: GlobalPlan) -> GlobalPlan:
        """`plan` with the run's online mixture updates (`set_mixture`) laid over its stages."""
        pairs = merge_plan_states(self.states, 0).get("mixture_updates")
        updates = updates_from_pairs(pairs, plan.spec.names, "the saved mixture_updates")
        return plan.with_mixture(with_updates(plan.spec.mixture, updates)) if updates else plan


def read_saved_run(workdir: str) -> SavedRun:
    """The latest checkpoint of `workdir` (its `checkpoints/` folder, or itself)."""
    root = epath.Path(workdir)
    if not root.exists():
        raise DataConfigError(f"--workdir={workdir!r} does not exist")
    directory = root / "checkpoints" if (root / "checkpoints").exists() else root
    # orbax names a committed step's directory by the step alone (in-flight ones carry a suffix).
    steps = [int(p.name) for p in directory.iterdir() if p.name.isdigit() and p.is_dir()]
    step = max(steps, default=None)
    if step is None:
        raise DataConfigError(
            f"--workdir={workdir!r} has no checkpoint (looked in {directory}); pass --config "
            "to list a run's steps from its config instead"
        )
    data = directory / str(step) / "data"
    files = sorted(p for p in data.glob("process_*-of-*.json") if STATE_FILE.fullmatch(p.name))
    if not files:
        raise DataCheckpointError(
            f"--workdir={workdir!r}: its latest checkpoint {directory / str(step)} holds no "
            "data state (no data/process_*-of-*.json); pass a run saved with its data position "
            "(trainer_hooks.train, or DataCheckpointSave), or --config"
        )
    records = [read_record(p) for p in files]
    header, state = records[0]
    if header.get("data_config") is None or state.get("kind") != "plan":
        raise DataCheckpointError(
            f"--workdir={workdir!r}: checkpoint {directory / str(step)} was not saved by a "
            "planned iterator with its data config (iterators_from_config); pass --config"
        )
    return SavedRun(
        step=int(state["step"]),
        data_step=saved_data_step(state),
        flat_config=dict(header["data_config"]),
        states=[state for _, state in records],
        files=header.get("data_files"),
    )


def changed_data(
    saved: SavedRun,
    identities: Mapping[str, Mapping[str, Any]],
    files: Mapping[str, Any] | None = None,
) -> list[str]:
    """One line per change of the data behind a run since its checkpoint.

    Args:
      saved: The run's latest checkpoint.
      identities: Today's `source_identity` of each train dataset.
      files: Today's file table of each train dataset with files.
    """
    before = {k: v for k, v in saved.flat_config.items() if is_identity_key(k)}
    known = {n: v for n, v in identities.items() if f"data.train.{n}.kind" in saved.flat_config}
    current = flat_data_config(saved.data_config(), None, known)
    unbound = set(identity_keys_of_unbound_sources(saved.flat_config, current))
    now = {k: v for k, v in current.items() if is_identity_key(k) and k not in unbound}
    return describe_changes(config_changes(before, now), saved.files, dict(files or {}))


def warn_about_changed_data(
    saved: SavedRun, identities: Any, files: Any, workdir: str, err: TextIO
) -> None:
    """Prints a warning naming each changed file behind the run (nothing if none changed)."""
    changes = changed_data(saved, identities, files)
    if changes:
        print(
            f"warning: the data behind {workdir} changed since its checkpoint at step "
            f"{saved.step}; what follows is planned on today's data:",
            file=err,
        )
        for line in changes:
            print(f"warning:   {line}", file=err)


def parse_steps(step: int | None, steps: str | None) -> range:
    """`--step=N` or `--steps=A:B` (B excluded) as a range."""
    if (step is None) == (steps is None):
        raise DataConfigError("give exactly one of --step=N and --steps=A:B")
    if step is not None:
        if step < 0:
            raise DataConfigError(f"--step={step} must be >= 0")
        return range(step, step + 1)
    match = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", steps)
    if not match or int(match.group(1)) >= int(match.group(2)):
        raise DataConfigError(f"--steps={steps!r} is invalid; expected A:B with 0 <= A < B")
    return range(int(match.group(1)), int(match.group(2)))


def list_rows(
    opened: TrainPlan,
    steps: range,
    *,
    processes: int,
    saved: SavedRun | None = None,
) -> list[RowContents]:
    """The rows of `steps`, planned from the checkpoint's cursor when it comes first."""
    skips = opened.config.skip_steps
    cursor = None
    plan = opened.plan
    same = saved is not None and _same_plan(saved, opened)
    if same:
        plan = saved.with_mixture_updates(plan)
        if skips.data_step(steps.start) >= saved.data_step:
            cursor = saved.cursor(plan)
    return list(step_rows(plan, steps, skips=skips, hosts=processes, cursor=cursor))


def _same_plan(saved: SavedRun, opened: TrainPlan) -> bool:
    """Whether the run's plan is this config's (skipped steps aside: they plan nothing)."""
    recorded = flat_data_config(saved.data_config())
    current = flat_data_config(opened.config)
    for flat in (recorded, current):
        flat.pop("data.skip_steps", None)
    return recorded == current


def print_rows(
    rows: Sequence[RowContents],
    out: TextIO,
    *,
    tokenizers: Mapping[str, Any] | None = None,
    sources: Mapping[str, Any] | None = None,
    chars: int = 200,
) -> None:
    """Human-readable rows; with `tokenizers`, each piece's text (decoded, cut at `chars`)."""
    previous = None
    for row in rows:
        if row.step != previous:
            previous = row.step
            count = sum(1 for r in rows if r.step == row.step)
            behind = "" if row.data_step == row.step else f", data step {row.data_step}"
            print(
                f"step {row.step} (trained by update {row.step + 1}{behind}): {count} rows",
                file=out,
            )
        parts = []
        for piece in row.pieces:
            first, last = piece.token_range
            bos = "EOD+" if piece.start < piece.offset else ""
            eod = "+EOD" if piece.stop - piece.offset > piece.tokens else ""
            parts.append(
                f"{piece.source}#{piece.document}[{bos}{first}:{last}{eod} of {piece.tokens}]"
            )
        print(f"  row {row.row:>4} host {row.data_host:>3}  " + "  ".join(parts), file=out)
        if tokenizers is not None and sources is not None:
            for piece in row.pieces:
                text = _text(piece, sources, tokenizers, chars)
                print(f"      {piece.source}#{piece.document}: {text}", file=out)


def piece_text(piece: Any, sources: Mapping[str, Any], tokenizers: Mapping[str, Any]) -> str:
    """The decoded text of a piece's tokens (end-of-document positions left out)."""
    first, last = piece.token_range
    ids = sources[piece.source][piece.document]["tokens"][first:last]
    tokenizer = tokenizers.get(piece.source)
    return tokenizer.decode(ids) if tokenizer is not None else " ".join(map(str, ids.tolist()))


def _text(piece: Any, sources: Any, tokenizers: Any, chars: int) -> str:
    text = piece_text(piece, sources, tokenizers)
    text = text if not chars or len(text) <= chars else text[:chars] + "…"
    return json.dumps(text, ensure_ascii=False)


def run_batch(
    config: Any,
    workdir: str | None,
    steps: range,
    *,
    processes: int = 1,
    decode: bool = False,
    jsonl: str | None = None,
    chars: int = 200,
    out: TextIO,
    err: TextIO,
) -> list[RowContents]:
    """What `xlstm-data batch` does; returns the rows it listed."""
    saved = read_saved_run(workdir) if workdir else None
    if config is None and saved is None:
        raise DataConfigError("give --config=FILE or --workdir=DIR (a run with a checkpoint)")
    opened = open_train_plan(config.data if config is not None else saved.data_config())
    if saved is not None:
        plan = opened.plan
        identities = dataset_identities(opened.sources, plan.spec.names, plan.lengths)
        warn_about_changed_data(saved, identities, dataset_files(opened.sources), workdir, err)
    rows = list_rows(opened, steps, processes=processes, saved=saved)
    tokenizers = None
    if decode:
        tokenizers = {name: source.tokenizer for name, source in opened.sources.items()}
    if jsonl:
        with epath.Path(jsonl).open("w") as file:
            for row in rows:
                record = row.to_json()
                if tokenizers is not None:
                    for entry, piece in zip(record["documents"], row.pieces, strict=True):
                        entry["text"] = piece_text(piece, opened.sources, tokenizers)
                file.write(json.dumps(record, ensure_ascii=False) + "\n")
    print_rows(rows, out, tokenizers=tokenizers, sources=opened.sources, chars=chars)
    return rows
