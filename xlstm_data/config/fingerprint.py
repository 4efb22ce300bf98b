"""A fingerprint of the data config, so a resume can tell what changed.

The data position saved in a checkpoint only means something for the data
config that produced it. Each checkpoint stores the flattened config and its
hash; a restore compares them key by key and names every changed key, so an
accidental edit is refused and an intended one can be allowed explicitly.
Keys that do not change the training stream (eval sets, prefetch, reading threads and
worker processes, which compute whole steps of the plan) are left out, so adding an eval
set or changing the worker count never blocks a resume.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from xlstm_data.config.data_config import validate_data_config
from xlstm_data.errors import DataConfigError
from xlstm_data.sources.identity import IDENTITY_KEYS

#: Data keys that do not affect the training stream's content or order.
KEYS_OUTSIDE_FINGERPRINT = (
    "eval",
    "eval_global_batch_size",
    "prefetch",
    "worker_buffer_size",
    "read_threads",
    # Workers compute whole steps of the plan: they change speed, never data.
    "worker_count",
)


def flat_data_config(
    data_config: Any,
    source_documents: Mapping[str, int] | None = None,
    source_identities: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The training-relevant data config as `{"data.<key>...": value}`.

    Args:
      data_config: The data section (anything `validate_data_config` takes).
      source_documents: Documents found per train dataset, recorded as
        `data.train.<name>.documents` so a path glob that now matches other
        files shows up as a change.
      source_identities: Per train dataset, what its documents are
        (`sources.identity.source_identity`: files, lengths checksum,
        tokenizer), recorded under `data.train.<name>.` so that changed data
        behind an unchanged config shows up as a change, file by file.
    """
    validated = validate_data_config(data_config)
    config = validated.to_json_dict()
    for key in KEYS_OUTSIDE_FINGERPRINT:
        config.pop(key, None)
    if validated.mixture_schedule is None:
        # Derived from data.train.<name>.weight, which are recorded: a weight change
        # is one changed key (allowed by "data.train.*.weight"), not two.
        config.pop("mixture_schedule", None)
    for name, count in (source_documents or {}).items():
        config["train"][name]["documents"] = int(count)
    for name, identity in (source_identities or {}).items():
        config["train"][name].update(identity)
    return dict(flatten("data", json.loads(json.dumps(config))))


def identity_keys_of_unbound_sources(
    saved: Mapping[str, Any], current: Mapping[str, Any]
) -> list[str]:
    """Current identity keys of datasets the saved config recorded no identity for.

    Checkpoints written before runs were bound to their data have none; their
    datasets are compared by config and document count only.
    """
    bound = {key.split(".")[2] for key in saved if is_identity_key(key)}
    return [k for k in current if is_identity_key(k) and k.split(".")[2] not in bound]


def is_identity_key(key: str) -> bool:
    """Whether a flat key records a train dataset's data identity (files, checksum, tokenizer)."""
    parts = key.split(".")
    return len(parts) > 3 and parts[1] == "train" and parts[3] in IDENTITY_KEYS


def fingerprint(flat_config: Mapping[str, Any]) -> str:
    """A stable hash of a flattened config."""
    text = json.dumps(dict(flat_config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def config_changes(
    saved: Mapping[str, Any], current: Mapping[str, Any]
) -> list[tuple[str, Any, Any]]:
    """`(key, saved value, current value)` for every key that differs.

    A key only in one of the two shows `<absent>` on the other side.
    """
    absent = "<absent>"
    return [
        (key, saved.get(key, absent), current.get(key, absent))
        for key in sorted(set(saved) | set(current))
        if saved.get(key, absent) != current.get(key, absent)
    ]


def disallowed_changes(
    changes: Iterable[tuple[str, Any, Any]], allowed: bool | str | Iterable[str]
) -> list[tuple[str, Any, Any]]:
    """The changes not covered by `allowed` (True, or glob patterns of keys)."""
    return [change for change in changes if not allowed_by(change[0], allowed)]


def allowed_by(key: str, allowed: bool | str | Iterable[str]) -> bool:
    """Whether `allowed` (True, or glob patterns of keys) covers a changed key."""
    return any(
        fnmatch.fnmatchcase(key, p) or key.startswith(p + ".") for p in allowed_patterns(allowed)
    )


def allowed_patterns(allowed: bool | str | Iterable[str]) -> list[str]:
    """Normalises `allow_config_change` to a list of key patterns (True: all)."""
    if allowed is True:
        return ["*"]
    if allowed is False or allowed is None:
        return []
    if isinstance(allowed, str):
        return [allowed]
    try:
        patterns = list(allowed)
    except TypeError:
        patterns = None
    if patterns is None or not all(isinstance(p, str) for p in patterns):
        raise DataConfigError(
            f"allow_config_change={allowed!r} is invalid; expected True, False, a key pattern "
            'such as "data.train.*.weight", or a list of them'
        )
    return patterns


def flatten(prefix: str, value: Any) -> Iterable[tuple[str, Any]]:
    """`(dotted key, leaf value)` pairs of a nested mapping, keys under `prefix`."""
    if isinstance(value, Mapping):
        for key, inner in value.items():
            yield from flatten(f"{prefix}.{key}", inner)
    else:
        yield prefix, value
