"""What the reference factories were asked for, fingerprinted in checkpoints like a config.

A run built with `make_grain_llm_iterator` has no config file, but its
checkpointed position means something only for the same documents, seed,
row settings and mixture. The factories record their data-relevant arguments
here; a checkpoint stores them flattened (`factory.<argument>`), and a restore
names every argument that changed, exactly as it names changed config keys.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from xlstm_data.config.fingerprint import flatten


@dataclasses.dataclass(frozen=True)
class FactorySettings:
    """The data-relevant arguments of a factory-built iterator.

    Attributes:
      arguments: `{argument: JSON value}` shared by the run (row length,
        packing, seed, batch schedule, ...).
      datasets: `{dataset name: {argument: JSON value}}` (weight, operations).
    """

    arguments: Mapping[str, Any]
    datasets: Mapping[str, Mapping[str, Any]]

    def flat(
        self,
        source_documents: Mapping[str, int] | None = None,
        source_identities: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """`{"factory.<argument>": value, "factory.datasets.<name>.<key>": value}`.

        Each dataset also records its document count and identity (files,
        lengths checksum, tokenizer), so other data behind the same arguments
        is a change.
        """
        datasets = {
            name: {
                **values,
                **({"documents": int(source_documents[name])} if source_documents else {}),
                **dict((source_identities or {}).get(name, {})),
            }
            for name, values in self.datasets.items()
        }
        nested = json.loads(json.dumps({**self.arguments, "datasets": datasets}))
        return dict(flatten("factory", nested))
