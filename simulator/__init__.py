"""The cluster simulator: synthetic training jobs and injected faults as
``vigil.sample/1`` messages, for tests, the scenario suite, benchmarks and the demo.
It ships with Vigil but never runs on a GPU node, and may import only ``contracts``."""
