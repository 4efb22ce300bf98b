"""What a config will do, shown before a long run is launched.

`xlstm-data inspect --config=...` prints the plan (each train source with
its documents, tokens and expected share; the ramp-up stages with per-host
batch sizes; examples and tokens per step; the epoch length and whether it
is exact), decodes one real batch with document boundaries marked, and
plots batch size, cumulative tokens and per-component token shares over the
first steps of the real pipeline. Mistakes in weights, ramp-up or packing
show up here in seconds instead of hours into a run.
"""

from __future__ import annotations

import os
from typing import Any, TextIO

import numpy as np

from xlstm_data.config.data_config import validate_data_config
from xlstm_data.config.end_of_document import resolve_eod_token_id
from xlstm_data.config.overrides import load_config
from xlstm_data.from_config import iterators_from_config
from xlstm_data.multihost.mesh import DEFAULT_AXIS_DIMS, create_mesh, parse_axis_spec
from xlstm_data.plan.schedule import BatchSizeSchedule
from xlstm_data.sources.tokenizers import Tokenizer

#: Sources with more documents than this are measured on a sample.
FULL_COUNT_LIMIT = 20_000
SAMPLE_SIZE = 2_000
SEGMENT_MARK = " ‖ "
#: Token ids shown per document when a sample row cannot be decoded to text.
SHOWN_IDS = 32


def _mesh_axis_dims(config: Any) -> Any:
    """The config's `mesh.axis_dims`, or `create_mesh`'s default."""
    return config.get("mesh", {}).get("axis_dims", DEFAULT_AXIS_DIMS)


def smallest_device_count(config: Any) -> int:
    """Devices the config's mesh needs at least (its fixed axis sizes; -1 counts as 1)."""
    dims = _mesh_axis_dims(config)
    sizes = parse_axis_spec(dims)[0] if isinstance(dims, str) else [int(d) for d in dims]
    return int(np.prod([max(size, 1) for size in sizes]))


def _source_counts(source: Any) -> tuple[int, int, bool]:
    """(documents, tokens, exact) of a source; tokens estimated on a sample if large."""
    documents = len(source)
    lengths = source.lengths() if getattr(source, "has_lengths", lambda: False)() else None
    if lengths is not None:
        return documents, int(np.sum(lengths)), True
    if documents <= FULL_COUNT_LIMIT:
        return documents, sum(len(source[i]["tokens"]) for i in range(documents)), True
    picks = np.random.default_rng(0).choice(documents, SAMPLE_SIZE, replace=False)
    mean = float(np.mean([len(source[int(i)]["tokens"]) for i in picks]))
    return documents, int(mean * documents), False


def _token_shares(
    mixture: Any, weights: Any, counts: dict[str, tuple], unit: str
) -> dict[str, float]:
    """Expected token share of each source under one stage's weights.

    Token-weighted mixtures (the default) give each source its weight's share
    of the tokens; document-weighted ones its weight times its mean document
    length, normalised.
    """
    shares = {}
    for name, weight in zip(mixture.names, weights, strict=True):
        _, documents, tokens, _ = counts[name]
        shares[name] = weight if unit == "tokens" else weight * tokens / max(documents, 1)
    total = sum(shares.values())
    return {n: (s / total if total else 0.0) for n, s in shares.items()}


def _sample_tokenizer(sources: dict[str, Any]) -> Tokenizer | None:
    """The tokenizer every train source shares and whose vocabulary covers theirs.

    None (then ids are shown) when a source has no tokenizer, the sources
    differ, or a source's vocabulary is larger than the tokenizer's: its ids
    (token arrays prepared with a larger `vocab_size`) are not that
    tokenizer's, so even those below its size would decode to wrong text.
    """
    tokenizers = [getattr(source, "tokenizer", None) for source in sources.values()]
    if not tokenizers or any(t is None for t in tokenizers):
        return None
    if len({repr(t) for t in tokenizers}) > 1:
        return None
    tokenizer = tokenizers[0]
    vocabs = [getattr(source, "vocab_size", None) for source in sources.values()]
    if any(vocab is not None and vocab > tokenizer.vocab_size for vocab in vocabs):
        return None
    return tokenizer


def _segment_text(tokens: np.ndarray, tokenizer: Tokenizer | None) -> str:
    """A document's text, or its ids when the tokenizer does not cover them.

    Ids beyond the tokenizer's vocabulary are legitimate in a source whose
    vocabulary is larger (token arrays prepared with `vocab_size`); reading
    already refused ids beyond the source's own vocabulary, naming the record.
    """
    if tokenizer is not None and (tokens.size == 0 or int(tokens.max()) < tokenizer.vocab_size):
        return tokenizer.decode(tokens.tolist()).replace("\n", "⏎")
    shown = " ".join(map(str, tokens[:SHOWN_IDS].tolist()))
    return f"[ids {shown}{' ...' if tokens.size > SHOWN_IDS else ''}]"


def _decoded_row(batch: Any, tokenizer: Tokenizer | None) -> str:
    inputs = np.asarray(batch.inputs)[0]
    segments = np.asarray(batch.inputs_segmentation)[0]
    parts = []
    for segment in [s for s in dict.fromkeys(segments.tolist()) if s != 0]:
        parts.append(_segment_text(inputs[segments == segment], tokenizer))
    padding = int(np.count_nonzero(segments == 0))
    return SEGMENT_MARK.join(parts) + (f"{SEGMENT_MARK}<{padding} padding>" if padding else "")


def inspect_config(
    config: Any,
    *,
    name: str | None = None,
    png: str | None = None,
    plot_steps: int | None = None,
    workdir: str | None = None,
    out: TextIO,
    err: TextIO | None = None,
) -> dict[str, Any]:
    """Prints the data plan of a config, a decoded sample batch, and plots the first steps.

    Args:
      config: A run config (`ConfigDict` or dict, overrides already applied),
        or the path of a config file with `get_config()`.
      name: What the config is called in the output (default: its path, or "config").
      png: Where to write the plot (default: `<name>.inspect.png` in the
        current directory).
      plot_steps: Steps of the real pipeline to plot (default: the run's
        `num_train_steps`, at most 300).
      workdir: A run directory whose latest checkpoint's data files are
        compared with today's (a warning names each changed file).
      out: Where the plan is printed.
      err: Where warnings go (default `out`).

    Returns:
      The plan as a dict (also what was printed).
    """
    if isinstance(config, str | os.PathLike):
        name = name or os.fspath(config)
        config = load_config(os.fspath(config))
    config_path = name or "config"
    data = validate_data_config(config)
    mesh_dims = _mesh_axis_dims(config)
    mesh = create_mesh(mesh_dims)
    batch_axes = config.get("mesh", {}).get("batch_axis_names")
    train, evals = iterators_from_config(data, mesh, batch_axis_names=batch_axes)
    layout = train.layout
    if workdir:
        from xlstm_data.cli.batch_contents import read_saved_run, warn_about_changed_data

        saved = read_saved_run(workdir)
        identities, files = train.source_identities, train.source_files
        warn_about_changed_data(saved, identities, files, workdir, err or out)
    mixture = data.mixture  # data.mixture_schedule, or the static weights as one stage
    plan: dict[str, Any] = {"config": config_path, "sources": [], "stages": []}
    print(f"config {config_path}: mesh {mesh_dims} {dict(mesh.shape)}", file=out)
    print(
        f"data-loading hosts: {layout.host_count} (this is host {layout.host_index}), "
        f"data-parallel size {layout.data_parallel_size}",
        file=out,
    )
    counts = {}
    planned = dict(zip(train.plan.spec.names, train.plan.document_tokens, strict=True))
    for spec in data.train:
        if spec.name in planned:  # the plan has summed its lengths
            source = train.sources[spec.name]
            counts[spec.name] = (source, len(source), planned[spec.name], True)
        else:  # weight 0: not in the iterator, so opened here
            source = spec.build()
            counts[spec.name] = (source, *_source_counts(source))
    shares = [
        _token_shares(mixture, weights, counts, data.mixture_unit) for weights in mixture.weights
    ]
    print(
        f"\ntrain sources: expected token shares of the first mixture stage (weights are "
        f"{data.mixture_unit}-weighted):",
        file=out,
    )
    for spec in data.train:
        source, documents, tokens, exact = counts[spec.name]
        share = shares[0][spec.name]
        vocab = getattr(source, "vocab_size", None)
        plan["sources"].append(
            {
                "name": spec.name,
                "kind": spec.kind,
                "documents": documents,
                "tokens": tokens,
                "tokens_exact": exact,
                "expected_share": share,
                "vocab_size": vocab,
            }
        )
        approx = "" if exact else "~"
        print(
            f"  {spec.name:<16} {spec.kind:<14} {documents:>10,} documents "
            f"{approx}{tokens:>14,} tokens   expected share {share:6.1%}   vocab {vocab}",
            file=out,
        )
    plan["mixture_schedule"] = [
        [start, stage] for start, stage in zip(mixture.starts, shares, strict=True)
    ]
    print("mixture stages (planned token shares; steps count batches, as ramp-up does):", file=out)
    for index, (start, stage) in enumerate(plan["mixture_schedule"]):
        parts = ", ".join(f"{n} {share:.1%}" for n, share in stage.items())
        print(f"  stage {index} from step {start:>7}: {parts}", file=out)
    spec = train.plan.spec
    print(
        f"packing: {spec.packing}; block: {spec.block_documents} documents",
        file=out,
    )
    opened = {f"data.train.{name}": source for name, source in train.sources.items()}
    plan["eod_token_id"] = resolve_eod_token_id(data.eod_token_id, opened)
    print(f"end-of-document id: {plan['eod_token_id']}", file=out)
    schedule: BatchSizeSchedule = train.batch_schedule
    length = data.max_target_length
    print(f"\nramp-up (rows of {length} tokens):", file=out)
    for stage in schedule.stages():
        end = "end" if stage.end_step is None else stage.end_step
        plan["stages"].append(
            {
                "start_step": stage.start_step,
                "end_step": stage.end_step,
                "global_batch_size": stage.global_batch_size,
                "host_batch_size": stage.host_batch_size,
                "tokens_per_step": stage.global_batch_size * length,
            }
        )
        print(
            f"  steps {stage.start_step:>7} - {end!s:<7} factor {stage.factor:<5g} "
            f"global batch {stage.global_batch_size:>5} ({stage.host_batch_size} per host)  "
            f"{stage.global_batch_size:>5} examples, {stage.global_batch_size * length:>8,} "
            "token slots per step",
            file=out,
        )
    epoch = train.epoch_length
    if epoch is not None:
        kind = "exact" if epoch.exact else "estimate, the run ends at the data's end"
        print(f"\nepoch length: {epoch.steps:,} steps ({kind})", file=out)
    elif data.num_epochs is None:
        print("\nepoch length: unbounded (datasets repeat; num_train_steps ends the run)", file=out)
        passes = one_pass_steps(train.plan, {n: c[2] for n, c in counts.items()})
        plan["one_pass_steps"] = passes
        for name, steps in passes.items():
            when = f"~{steps:,} steps" if steps is not None else "never (weight 0 from some stage)"
            print(f"  one pass over {name}: {when} (at the planned token shares)", file=out)
    else:
        print(
            "\nepoch length: unknown without reading (prepare the data for an exact count)",
            file=out,
        )
    plan["epoch_length"] = None if epoch is None else {"steps": epoch.steps, "exact": epoch.exact}
    if evals:
        print(f"eval sets: {', '.join(evals)}", file=out)

    tokenizer = _sample_tokenizer(train.sources)
    steps = plot_steps or min(int(config.get("num_train_steps", 100) or 100), 300)
    history = _run_steps(train, steps)
    first = history.pop("first_batch")
    print(f"\nsample row (documents separated by '{SEGMENT_MARK.strip()}'):", file=out)
    print("  " + _decoded_row(first, tokenizer)[:2000], file=out)
    padding = 1 - history["tokens"].sum() / history["slots"].sum()
    print(
        f"\nfirst {steps} steps: padding {padding:.2%}; token shares "
        + ", ".join(f"{n} {history['component_share'][n]:.1%}" for n in history["names"]),
        file=out,
    )
    # Named after the file, not the argument after its colon (a path, a blend).
    png = (
        png or os.path.splitext(os.path.basename(config_path.split(":", 1)[0]))[0] + ".inspect.png"
    )
    _plot(history, png, config_path)
    print(f"plot: {png}", file=out)
    plan.update(
        png=png, padding_fraction=float(padding), measured_shares=history["component_share"]
    )
    train.close()
    for iterator in evals.values():
        iterator.close()
    return plan


def one_pass_steps(plan: Any, tokens: dict[str, int]) -> dict[str, int | None]:
    """Steps until each dataset's tokens have all been planned once, at the planned shares.

    Walks the ramp-up and mixture stages: a dataset gets its stage's token
    share of each step's rows. An estimate (padding and the documents cut at
    block ends are left out); a finite run's epoch length is exact instead.
    """
    spec = plan.spec
    starts = sorted({0, *spec.mixture.starts, *(s.start_step for s in spec.batch.stages())})
    out: dict[str, int | None] = {}
    for index, name in enumerate(spec.names):
        left, result = float(tokens[name]), None
        for i, start in enumerate(starts):
            end = starts[i + 1] if i + 1 < len(starts) else None
            share = float(plan.token_shares(spec.mixture.stage_at(start))[index])
            rate = share * spec.batch.global_batch_size_at(start) * spec.row_length
            if rate <= 0:
                continue
            steps = left / rate
            if end is None or steps <= end - start:
                result = start + int(np.ceil(steps))
                break
            left -= rate * (end - start)
        out[name] = result
    return out


def _run_steps(train: Any, steps: int) -> dict[str, Any]:
    names = train.component_names or ("all",)
    batch_sizes, tokens, slots, per_component, planned = [], [], [], [], []
    first = None
    for _ in range(steps):
        try:
            batch = next(train)
        except StopIteration:
            break
        first = first if first is not None else batch
        counters = train.data_counters
        batch_sizes.append(int(batch.inputs.shape[0]))
        tokens.append(counters.tokens)
        slots.append(counters.slots)
        per_component.append(counters.component_tokens.copy())
        planned.append(list(train.mixture_stage_at(train.step_counter - 1)[1].values()))
    tokens_arr = np.diff([0, *tokens])
    slots_arr = np.diff([0, *slots])
    cumulative = np.asarray(per_component, dtype=float)
    total = cumulative[-1].sum() if len(cumulative) else 0.0
    return {
        "first_batch": first,
        "names": names,
        "batch_size": np.asarray(batch_sizes),
        "tokens": tokens_arr,
        "slots": slots_arr,
        "cumulative_component_tokens": cumulative,
        "planned_share": np.asarray(planned) if planned else None,
        "component_share": {
            n: float(cumulative[-1][i] / total) if total else 0.0 for i, n in enumerate(names)
        },
    }


def _plot(history: dict[str, Any], png: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    steps = np.arange(1, len(history["batch_size"]) + 1)
    figure, axes = plt.subplots(3, 1, figsize=(8, 9), sharex=True)
    axes[0].step(steps, history["batch_size"], where="post")
    axes[0].set_ylabel("global batch size")
    axes[1].plot(steps, np.cumsum(history["tokens"]), label="tokens")
    axes[1].plot(steps, np.cumsum(history["slots"]), "--", label="token slots (with padding)")
    axes[1].set_ylabel("cumulative tokens")
    axes[1].legend()
    cumulative = history["cumulative_component_tokens"]
    totals = np.maximum(cumulative.sum(axis=1, keepdims=True), 1)
    per_step = np.diff(np.vstack([np.zeros((1, cumulative.shape[1])), cumulative]), axis=0)
    per_step_totals = np.maximum(per_step.sum(axis=1), 1)
    planned = history.get("planned_share")
    for i, name in enumerate(history["names"]):
        (line,) = axes[2].plot(steps, cumulative[:, i] / totals[:, 0], label=f"{name} (cumulative)")
        axes[2].plot(steps, per_step[:, i] / per_step_totals, ":", color=line.get_color(), lw=0.8)
        if planned is not None:
            axes[2].step(
                steps,
                planned[:, i],
                "--",
                where="post",
                color=line.get_color(),
                label=f"{name} planned",
            )
    axes[2].set_ylabel("token share (dotted: per step)")
    axes[2].set_xlabel("step")
    axes[2].legend()
    figure.suptitle(f"xlstm-data inspect: {title}")
    figure.tight_layout()
    figure.savefig(png, dpi=80)
    plt.close(figure)
