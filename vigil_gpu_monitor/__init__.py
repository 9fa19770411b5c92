"""Vigil, imported as one package so that it puts a single name of its own into an
environment (`vigil_gpu_monitor`, the distribution `vigil-gpu-monitor`).

The repository keeps the layout its users know: each top-level folder (`contracts/`,
`producers/`, `simulator/`, `detectors/`, `streams/`, `alerting/`, `vigil/`) is the
subpackage of the same name here, through a symbolic link in this folder, and the wheel
carries them as real folders under this one. So `detectors/hang.py` is imported as
`vigil_gpu_monitor.detectors.hang`, wherever it runs.
"""
