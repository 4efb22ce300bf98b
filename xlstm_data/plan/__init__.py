"""Step 2 of the flow: the global data plan, a pure function of (config, seed, step).

Which pieces of which documents fill row j of the global batch at step s is
computed from document lengths alone, identically on every host; each host
then reads only the documents of its own rows. The modules, in the order the
plan uses them:

- `permutation`: a keyed Feistel permutation (cycle walking), so a source's
  order of 10^8 documents needs no table; `order`: a new permutation per
  epoch of each source, seeded by the source's *name* (adding, dropping or
  reordering other datasets changes nothing).
- `mixture`: weights by mixture stage, token- or document-weighted;
  `schedule`: the batch size by step (ramp-up stages).
- `packing`: rows packed on lengths (best_fit, first_fit, concat, none).
- `pieces`: rows as compressed `(source, document, start, stop)` pieces.
- `spec`: the validated `PlanSpec` (no host or worker count in it).
- `streams`: logical streams, blocks and cursors, and a host's planner.

Design choices and why (against ../shared/PLAN.md's outline):

- *Logical streams.* The batch of every step is split into V slices (V
  divides every stage's batch); stream v plans its slice block by block from
  positions v, v + V, ... of each source. A host plans only the streams its
  rows lie in, so planning per host does not grow with the host count, and the
  saved position is V small cursors, so a restore at step 10^7 costs one block.
- *Token budgets with a credit.* Counts proportional to weight / mean length
  missed a 1 % stage-share target by 1.9 % on heavy-tailed lengths. A block
  instead takes each source's documents up to its token budget and owes the
  crossing document's overshoot to the next block, so realised token shares
  are exact to one document per stream.
- *Stages hold from their first step.* Blocks near a stage boundary shrink so
  their rows end on it; a single document that still crosses it is cut there,
  its rest carried in the cursor to the next block that reads its source.
"""
