"""The batch-size ramp-up schedule, where configs and callers have always imported it.

The schedule lives in `xlstm_data.plan.schedule`: the plan fixes each step's
batch from it, and the plan imports nothing from `config` (the config is
built on the plan, not the other way round). These names stay importable here.
"""

from xlstm_data.plan.schedule import BatchSizeSchedule, RampupSchedule, Stage, parse_rampup

__all__ = ["BatchSizeSchedule", "RampupSchedule", "Stage", "parse_rampup"]
