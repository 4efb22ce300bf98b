"""The preparation as an Apache Beam pipeline, for corpora one machine cannot tokenize.

The pipeline runs the same four steps (`steps`) as the local runner (`corpus`):
tokenize every part, plan the shards from all parts' lengths, write every
shard, then write the indexes. Its elements are parts and shards, not
documents: a document-level pipeline would ship every token through Beam's
shuffle for nothing, since which shard a document lands in is already a
pure function of the parts' lengths. Beam contributes what a cluster needs:
spreading parts and shards over workers (`Reshuffle`), retrying failed
bundles (every step is idempotent, and writes go through unique temporary
names), and runners from the local DirectRunner to Dataflow, Flink and
Spark. Because both runners call the same step functions on the same plan,
their outputs are the same bytes.

On a distributed runner every worker must see the output directory (a
gs:// or s3:// URI, or a shared filesystem), since parts are written by one
worker and cut into shards by another.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

from xlstm_data.errors import DataConfigError
from xlstm_data.prepare import paths
from xlstm_data.prepare.steps import (
    Preparation,
    ShardWrite,
    tokenize_step,
    write_step,
)
from xlstm_data.sources.corpus_index import INDEX_FILE


def check_beam_installed() -> None:
    """Raises DataConfigError naming the extra to install when Beam is missing."""
    try:
        import apache_beam  # noqa: F401
    except ImportError as error:
        raise DataConfigError(
            "--runner=beam needs Apache Beam, which is not installed; install it with: "
            "pip install 'xlstm-data[beam]' (or use --runner=local)"
        ) from error


def pipeline_options(options: Sequence[str]) -> Any:
    """Beam's options from `--beam_options` words; DirectRunner unless a runner is named.

    Raises:
      DataConfigError: On a runner Beam does not know or cannot load here.
    """
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

    words = list(options)
    parsed = PipelineOptions(words)
    runner = parsed.view_as(StandardOptions).runner or "DirectRunner"
    parsed.view_as(StandardOptions).runner = runner
    try:
        from apache_beam.runners import create_runner

        create_runner(runner)
    except (ValueError, ImportError) as error:
        raise DataConfigError(
            f"--beam_options={shlex.join(words)!r}: runner {runner!r} is not available in this "
            f"Beam install ({error}); use DirectRunner here, or install the runner's extra "
            "(e.g. apache-beam[gcp] for DataflowRunner)"
        ) from error
    return parsed


def run_beam(preparation: Preparation, options: Sequence[str]) -> dict[str, Any]:
    """Runs the preparation as a Beam pipeline; returns the training index it wrote."""
    import apache_beam as beam

    parsed = pipeline_options(options)
    paths.makedirs(preparation.work_dir)

    def plan(summaries: list[dict[str, Any]]) -> list[ShardWrite]:
        return preparation.shard_writes(preparation.plan(summaries))

    def finish(written: list[dict[str, Any]], writes: list[ShardWrite]) -> None:
        preparation.finish([write.task for write in writes], written)

    with beam.Pipeline(options=parsed) as pipeline:
        summaries = (
            pipeline
            | "parts" >> beam.Create(preparation.jobs)
            | "spread parts" >> beam.Reshuffle()
            | "tokenize" >> beam.Map(tokenize_step)
        )
        writes = (
            summaries | "all parts" >> beam.combiners.ToList() | "plan shards" >> beam.FlatMap(plan)
        )
        (
            writes
            | "spread shards" >> beam.Reshuffle()
            | "write shards" >> beam.Map(write_step)
            | "all shards" >> beam.combiners.ToList()
            | "indexes" >> beam.Map(finish, writes=beam.pvalue.AsList(writes))
        )
    index = paths.read_json(paths.join(preparation.output_dir, INDEX_FILE))
    validation = paths.join(preparation.output_dir, "validation", INDEX_FILE)
    if preparation.settings.holds_out:
        index["validation"] = paths.read_json(validation)
    return index
