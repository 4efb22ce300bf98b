"""Each source's documents in a seeded order that changes every epoch.

Position p of a source's infinite sequence is document `perm_e(p mod N)` of
epoch `e = p // N`: every document appears exactly once per epoch, and each
epoch has its own permutation. The seed is derived from the run's seed and
the source's *name*, so adding, removing or reordering other sources never
changes this source's order.
"""

from __future__ import annotations

import numpy as np

from xlstm_data.plan.permutation import FeistelPermutation, derive_seed

#: Sources up to this many documents keep each epoch's permutation as a table
#: (4 bytes a document), computed from the same Feistel network: identical
#: orders, ~100x fewer numpy calls per block for small sources.
TABLE_MAX_DOCUMENTS = 1 << 20
#: Epoch permutations kept per source, the most recently used. A walker moves
#: forward and a block never spans two epochs (a concat block's last row may
#: reach into the next one), so a planner needs one or two epochs at a time.
#: Kept per byte budget (32 MB) instead, a small source's tables were never
#: dropped: every grain worker's RSS grew with each epoch it planned
#: (tracemalloc: this cache was the only growing allocation, 1 MB per 50k
#: steps of the demo, more for larger sources), a table for a source of N
#: documents every N documents, with no plateau before 32 MB per source.
EPOCHS_KEPT = 2
#: ...or as many as `SMALL_EPOCHS_POSITIONS` positions hold, more for a small
#: source: a concat row of 10-document epochs reaches across several epochs,
#: and keeping two made every block rebuild them (3,844 permutations in 3
#: steps of 64 rows, 1 s a step).
SMALL_EPOCHS_POSITIONS = 1 << 16
#: An epoch's table is built once this share of its positions, or
#: `TABLE_AFTER_POSITIONS` of them, was looked up through the network:
#: building it for 10^6 documents cost 0.1-0.5 s of the first batch (a cold
#: start), which needs 2,048 of them, while small blocks looked up one by one
#: cost ~50 numpy calls each.
TABLE_AFTER_SHARE = 8
TABLE_AFTER_POSITIONS = 1 << 14


class SourceOrder:
    """Maps positions of a source's sequence to document indices.

    Args:
      num_documents: Documents in the source (>= 1).
      seed: The run's data seed.
      name: The source's name.
      shuffle: False keeps file order in every epoch.
    """

    def __init__(self, num_documents: int, seed: int, name: str, shuffle: bool):
        self.num_documents = int(num_documents)
        self._seed = seed
        self._name = name
        self._shuffle = shuffle
        self._epochs: dict[int, FeistelPermutation | np.ndarray] = {}
        self._looked_up: dict[int, int] = {}  # per epoch, positions asked of the network
        self._epochs_kept = max(EPOCHS_KEPT, SMALL_EPOCHS_POSITIONS // self.num_documents)

    def _permutation(self, epoch: int, positions: int) -> FeistelPermutation | np.ndarray:
        """Epoch `epoch`'s permutation, about to be asked for `positions` positions."""
        permutation = self._epochs.pop(epoch, None)
        if permutation is None:
            while len(self._epochs) >= self._epochs_kept:
                oldest = next(iter(self._epochs))  # the least recently used
                del self._epochs[oldest]
                self._looked_up.pop(oldest, None)
            permutation = FeistelPermutation(
                self.num_documents, derive_seed(self._seed, "order", self._name, epoch)
            )
        self._epochs[epoch] = permutation  # now the most recently used
        if (
            isinstance(permutation, FeistelPermutation)
            and self.num_documents <= TABLE_MAX_DOCUMENTS
        ):
            looked_up = self._looked_up.get(epoch, 0) + positions
            self._looked_up[epoch] = looked_up
            if looked_up >= min(self.num_documents // TABLE_AFTER_SHARE, TABLE_AFTER_POSITIONS):
                permutation = permutation(np.arange(self.num_documents)).astype(np.int32)
                self._epochs[epoch] = permutation
        return permutation

    def without_cache(self) -> SourceOrder:
        """The same order with no cached tables (cheap to pickle)."""
        return SourceOrder(self.num_documents, self._seed, self._name, self._shuffle)

    def documents(self, positions: np.ndarray) -> np.ndarray:
        """Document index at each position (int64 array in, int64 array out)."""
        positions = np.asarray(positions, dtype=np.int64)
        within = positions % self.num_documents
        if not self._shuffle or positions.size == 0:
            return within
        epochs = positions // self.num_documents
        out = np.empty_like(within)
        for epoch in np.unique(epochs):
            chosen = epochs == epoch
            permutation = self._permutation(int(epoch), int(np.count_nonzero(chosen)))
            if isinstance(permutation, np.ndarray):
                out[chosen] = permutation[within[chosen]]
            else:
                out[chosen] = permutation(within[chosen])
        return out
