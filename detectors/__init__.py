"""Pure detection over window arrays: no I/O, no Faust, no clock.

The stream worker and `vigil replay` both drive ``detectors.engine.JobEngine``,
so a trace that reproduces an incident reproduces the detection.
"""
