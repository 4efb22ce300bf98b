"""A whole preparation run locally: `prepare_corpus`, the entry point of `xlstm-data prepare`.

`prepare_corpus` validates the request into a `steps.Preparation` and runs its
four steps in this process or a process pool, or hands them to the Beam
runner (`beam.run_beam`) with `runner="beam"`; both runners run the same
steps, so their outputs are the same bytes. The steps live in `steps`, apart
from this module, because the Beam runner needs them too and this module
needs the Beam runner: neither runner imports the other.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import multiprocessing
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from xlstm_data.checks import check_int
from xlstm_data.errors import DataConfigError
from xlstm_data.prepare import paths
from xlstm_data.prepare.settings import RUNNERS
from xlstm_data.prepare.steps import Preparation, run_steps

#: progress(step, done, total): step is "tokenize" or "write".
Progress = Callable[[str, int, int], None]


def prepare_corpus(
    inputs: Sequence[str],
    output_dir: str,
    *,
    workers: int = 1,
    runner: str = "local",
    beam_options: Sequence[str] = (),
    progress: Progress | None = None,
    **settings: Any,
) -> dict[str, Any]:
    """Tokenizes `inputs` into shards (flat, or ArrayRecord) with an index in `output_dir`.

    Args:
      inputs: Files, globs or HuggingFace dataset directories (see
        `inputs.find_inputs` for the kinds read and how they are detected).
      output_dir: Where the shards, `index.json` and `lengths.npy` go (a local
        path or a URI such as gs://...). Shards of an earlier run that this
        one does not produce are deleted.
      workers: Processes tokenizing parts and writing shards (local runner).
      runner: "local", or "beam" to run the same steps as a Beam pipeline.
      beam_options: Beam pipeline options (e.g. ["--runner=DirectRunner"]).
      progress: Called as `progress(step, done, total)`.
      **settings: `PrepareSettings.create` arguments (input_format, field,
        unit, tokenizer, eod_token, pad_token, vocab_size, skip_bad_lines,
        num_shards, shard_size_mb, validation_fraction, validation_documents,
        seed, part_mb, layout).

    Returns:
      The training index (also in `output_dir/index.json`); with a held-out
      split, its index is under "validation".

    Raises:
      DataConfigError: On a bad argument or input (before any input is read).
      DataReadError: On an input that cannot be read or holds ids outside the
        vocabulary.
    """
    check_int("--workers", workers, 1)
    if runner not in RUNNERS:
        raise DataConfigError(f"--runner={runner!r} is invalid; valid runners: {list(RUNNERS)}")
    if runner == "beam":
        from xlstm_data.prepare.beam import check_beam_installed, run_beam

        check_beam_installed()
    preparation = Preparation.create(inputs, output_dir, **settings)
    if runner == "beam":
        return run_beam(preparation, beam_options)
    paths.makedirs(preparation.work_dir)
    with _pool(workers) as pool:

        def map_(fn: Callable[[Any], Any], items: Sequence[Any], step: str) -> Iterator[Any]:
            results = pool.map(fn, items) if pool else map(fn, items)
            for done, result in enumerate(results, 1):
                if progress:
                    progress(step, done, len(items))
                yield result

        return run_steps(preparation, map_)


def _pool(workers: int) -> Any:
    """Worker processes (spawned: the caller may hold threads); none for one worker."""
    if workers == 1:
        return contextlib.nullcontext()
    context = multiprocessing.get_context("spawn")
    return concurrent.futures.ProcessPoolExecutor(workers, mp_context=context)
