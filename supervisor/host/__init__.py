"""Floor 3, this machine: the worker's process tree in /proc (walk, CPU time, kill), the stacks of a hung tree
(py-spy and /proc), GPU readings (amdgpu sysfs, NVML), the torch build, the environment a child starts with, and the
signals sent to the supervisor. Each module reads or acts on the machine and returns records; none decides.
May import: the standard library, psutil, the ground floor, the configuration and ``supervisor.decision`` (its
records and pure readings).
"""
