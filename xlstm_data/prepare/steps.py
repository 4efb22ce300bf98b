"""The steps of a preparation, which every runner runs: inputs to shards plus the indexes.

A `Preparation` holds what was asked (validated settings, the input parts,
the output directory) and the four steps every runner runs in this order:

1. `tokenize` each part (in parallel; a part already tokenized is kept);
2. `plan` the shards from all parts' lengths (one call; a pure function);
3. `write` each shard (in parallel; a shard already written is kept);
4. `finish`: write the indexes and remove what this run does not produce.

The runners live apart and import this module: `corpus.prepare_corpus` runs
the steps in this process or a process pool (`run_steps`), `beam.run_beam`
as an Apache Beam pipeline, so the two runners' outputs are the same bytes.
Output layout: the training shards, `index.json` and `lengths.npy` in the
output directory (a config reads them with `kind="array_record",
path="OUT"`), the held-out split the same way in `OUT/validation/`, and the
per-step bookkeeping in `OUT/.prepare`. Shards are flat by default
(`shard-K-of-N.tokens.npy` with `.offsets.npy`, read through memory maps by
`FlatTokenSource`), or ArrayRecord with `layout="array_record"`
(`shard-K-of-N.array_record`).
"""

from __future__ import annotations

import collections
import dataclasses
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
from absl import logging

from xlstm_data.errors import DataConfigError
from xlstm_data.prepare import paths
from xlstm_data.prepare.inputs import find_inputs
from xlstm_data.prepare.settings import PrepareSettings
from xlstm_data.prepare.shards import (
    SHARD_FILE,
    SHARDS_DIR,
    TRAIN,
    VALIDATION,
    ShardTask,
    TokenizedPart,
    finished_shard,
    plan_shards,
    shard_lengths,
    split_directory,
    write_shard,
)
from xlstm_data.prepare.tokenize import PARTS_DIR, PartJob, part_jobs, part_lengths, tokenize_part
from xlstm_data.sources.corpus_index import INDEX_FILE, LENGTHS_FILE

#: Per-step bookkeeping lives apart, so `OUT/*` globs match shards only.
WORK_DIR = ".prepare"
_WORK_FILE = re.compile(
    r"(part-[0-9a-f]{24}\.(tokens|lengths\.npy|done\.json)"
    r"|(train|validation)-shard-\d{5,}-of-\d{5,}\.(array_record|tokens\.npy)\.(lengths\.npy|done\.json))"
    r"(\.[0-9a-f]{12}\.partial)?"
)


@dataclasses.dataclass(frozen=True)
class Preparation:
    """A validated preparation and the steps that carry it out.

    Attributes:
      settings: What to do.
      output_dir: Where the shards and indexes go.
      files: The input files, in order.
      jobs: Their parts, in order.
    """

    settings: PrepareSettings
    output_dir: str
    files: tuple[str, ...]
    jobs: tuple[PartJob, ...]

    @classmethod
    def create(cls, inputs: Sequence[str], output_dir: str, **settings: Any) -> Preparation:
        """Validates everything and finds the inputs, before any document is read.

        Raises:
          DataConfigError: On a bad argument or input (named).
        """
        if isinstance(inputs, str) or not inputs:
            raise DataConfigError(
                f"inputs={inputs!r}: pass a list of input files or globs, e.g. ['raw/*.jsonl']"
            )
        if not isinstance(output_dir, str) or not output_dir:
            raise DataConfigError(
                f"--output={output_dir!r} is invalid; pass the directory to write shards to"
            )
        checked = PrepareSettings.create(**settings)
        parts = find_inputs(
            list(inputs), checked.input_format, unit=checked.unit, part_bytes=checked.part_mb << 20
        )
        work_dir = paths.join(output_dir, WORK_DIR)
        files = tuple(dict.fromkeys(part.path for part in parts))
        return cls(checked, output_dir, files, tuple(part_jobs(parts, checked, work_dir)))

    @property
    def work_dir(self) -> str:
        return paths.join(self.output_dir, WORK_DIR)

    def plan(self, summaries: Iterable[dict[str, Any]]) -> list[ShardTask]:
        """Step 2: every shard, from all parts' summaries (in any order)."""
        by_name = {summary["name"]: summary for summary in summaries}
        missing = [job.name for job in self.jobs if job.name not in by_name]
        if missing:
            raise RuntimeError(f"prepare: parts {missing[:3]} were never tokenized")
        file_numbers = {path: number for number, path in enumerate(self.files)}
        parts, first = [], 0
        for job in self.jobs:
            documents = int(by_name[job.name]["documents"])
            parts.append(
                TokenizedPart(
                    job.name, job.part.path, file_numbers[job.part.path], first, documents
                )
            )
            first += documents
        jobs = {job.name: job for job in self.jobs}
        return plan_shards(
            parts, lambda part: part_lengths(jobs[part.name]), self.settings, len(self.files)
        )

    def shard_writes(self, tasks: Sequence[ShardTask]) -> list[ShardWrite]:
        """Step 3's work items: each shard with the parts it reads (and nothing more to ship)."""
        jobs = {job.name: job for job in self.jobs}
        return [
            ShardWrite(
                task,
                tuple(jobs[name] for name in dict.fromkeys(p.part for p in task.pieces)),
                self.output_dir,
            )
            for task in tasks
        ]

    def finish(
        self, tasks: Sequence[ShardTask], summaries: Iterable[dict[str, Any]]
    ) -> dict[str, Any]:
        """Step 4: writes each split's index, deletes part tokens and what this run does not make.

        Returns:
          The training split's index (the held-out split's under "validation").
        """
        written = {(s["split"], s["file"]): s for s in summaries}
        skipped = self._skipped_lines()
        indexes = {}
        for split in (TRAIN, VALIDATION):
            split_tasks = [task for task in tasks if task.split == split]
            directory = split_directory(self.output_dir, split)
            _remove_stale(directory, SHARD_FILE, {f for task in split_tasks for f in task.files})
            if not split_tasks:
                paths.remove(paths.join(directory, INDEX_FILE))
                paths.remove(paths.join(directory, LENGTHS_FILE))
                continue
            shards = [written[(split, task.file)] for task in split_tasks]
            indexes[split] = self._write_index(split, split_tasks, shards, skipped)
        for job in self.jobs:  # the bulk; lengths and markers stay for reruns
            paths.remove(job.path(".tokens"))
        current = {
            job.name + suffix for job in self.jobs for suffix in (".lengths.npy", ".done.json")
        }
        _remove_stale(paths.join(self.work_dir, PARTS_DIR), _WORK_FILE, current)
        _remove_stale(
            paths.join(self.work_dir, SHARDS_DIR),
            _WORK_FILE,
            {
                f"{task.split}-{task.file}{suffix}"
                for task in tasks
                for suffix in (".lengths.npy", ".done.json")
            },
        )
        index = dict(indexes[TRAIN])
        if VALIDATION in indexes:
            index["validation"] = indexes[VALIDATION]
        logging.info(
            "prepared %d documents, %d tokens in %d shards under %s",
            index["documents"],
            index["tokens"],
            len(index["shards"]),
            self.output_dir,
        )
        return index

    def _skipped_lines(self) -> dict[str, int]:
        """Bad lines skipped, per input file (under --skip_bad_lines)."""
        counts: dict[str, int] = collections.Counter()
        for job in self.jobs:
            summary = paths.read_json(job.path(".done.json"))
            if summary["skipped_lines"]:
                counts[job.signature["source"]] += summary["skipped_lines"]
        return dict(counts)

    def _write_index(
        self,
        split: str,
        tasks: Sequence[ShardTask],
        shards: Sequence[dict[str, Any]],
        skipped: dict[str, int],
    ) -> dict[str, Any]:
        directory = split_directory(self.output_dir, split)
        documents = sum(task.documents for task in tasks)
        paths.write_npy_in_pieces(
            paths.join(directory, LENGTHS_FILE),
            (shard_lengths(task, self.work_dir) for task in tasks),
            documents,
            np.int32,
        )
        settings = self.settings
        index = settings.index_header(documents, sum(task.tokens for task in tasks))
        if settings.token_dtype is not None:  # absent: ArrayRecord, as in older indexes
            index["layout"] = "flat"
            index["token_dtype"] = settings.token_dtype
        index["split"] = split
        index["shards"] = [
            _shard_entry(task, shard) for task, shard in zip(tasks, shards, strict=True)
        ]
        held = tasks[0].held_out
        if held.count:
            index["held_out"] = {
                "documents": held.count,
                "of": held.documents,
                "seed": settings.seed,
                "validation_fraction": settings.validation_fraction,
                "validation_documents": settings.validation_documents,
            }
        if skipped:
            index["skipped_lines"] = skipped
        paths.write_json_atomically(paths.join(directory, INDEX_FILE), index)
        return index


def tokenize_step(job: PartJob) -> dict[str, Any]:
    """Step 1: a part's summary, tokenizing it if it never was."""
    return tokenize_part(job, with_tokens=False)


@dataclasses.dataclass(frozen=True)
class ShardWrite:
    """Step 3's unit of work: a shard and the parts it is cut from."""

    task: ShardTask
    jobs: tuple[PartJob, ...]
    output_dir: str


def write_step(item: ShardWrite) -> dict[str, Any]:
    """Step 3: writes a shard unless written; re-tokenizes its parts if their tokens are gone."""
    work_dir = paths.join(item.output_dir, WORK_DIR)
    if finished_shard(item.task, item.output_dir, work_dir) is None:
        for job in item.jobs:
            tokenize_part(job, with_tokens=True)
    return write_shard(
        item.task,
        item.output_dir,
        work_dir,
        lambda name, suffix: paths.join(work_dir, PARTS_DIR, name + suffix),
    )


def _shard_entry(task: ShardTask, shard: dict[str, Any]) -> dict[str, Any]:
    keys = ("file", "documents", "tokens", "bytes", "offsets", "offsets_bytes")
    entry = {key: shard[key] for key in keys if key in shard}
    inputs = [paths.absolute(path) for path in task.inputs]
    if len(inputs) == 1:
        entry["source"] = inputs[0]
    entry["inputs"] = inputs
    return entry


def _remove_stale(directory: str, pattern: re.Pattern[str], keep: set[str]) -> None:
    """Deletes files named like this tool's own in `directory` that are not in `keep`.

    Only names `prepare` itself writes are touched, so other files a user keeps
    in the output directory survive, and half-written files never outlive a run.
    """
    for name in paths.listdir(directory):
        match = pattern.fullmatch(name)
        if match is None or (name in keep or match.group(1) in keep) and ".partial" not in name:
            continue
        path = paths.join(directory, name)
        logging.info("prepare: removing %s, which this run does not produce", path)
        paths.remove(path)


def run_steps(
    preparation: Preparation,
    map_: Callable[[Callable[[Any], Any], Sequence[Any], str], Iterator[Any]],
) -> dict[str, Any]:
    """Runs the four steps, mapping steps 1 and 3 with `map_(fn, items, step)`."""
    summaries = list(map_(tokenize_step, preparation.jobs, "tokenize"))
    tasks = preparation.plan(summaries)
    written = list(map_(write_step, preparation.shard_writes(tasks), "write"))
    return preparation.finish(tasks, written)
