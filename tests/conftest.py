"""Shared pytest setup.

grain's mp_prefetch reads absl flags, which raise unless parsed; tests never go
through absl.app, so the flags are marked parsed once here.
"""

from absl import flags

flags.FLAGS.mark_as_parsed()
