"""Vigil's wire contract: message schemas, the metric catalog, topic names, config.

Standard library only: every other package (including the light node agent)
imports this one.
"""

SAMPLE_SCHEMA = "vigil.sample/1"
DETECTION_SCHEMA = "vigil.detection/1"
STEP_SCHEMA = "vigil.step/1"
SUMMARY_SCHEMA = "vigil.summary/2"
SUMMARY_SCHEMA_V1 = "vigil.summary/1"  # still read: a rolling upgrade
JOBCLOCK_SCHEMA = "vigil.jobclock/1"
