"""What the supervisor reads from the world, turned into events for the core.

``worker_process`` starts the worker and reads its heartbeats, output and exit (and kills its tree, with
``process_tree``); ``worker_spawn`` builds its environment, command line and launch record, ``standby`` keeps the
next attempt's worker imported ahead, ``read_throttle`` rests its pipes between reads, ``incident_evidence`` reads
its tree before a kill (with ``stacks``); ``kernel_log`` reads /dev/kmsg or the journal and ``kernel_messages``
classifies the lines, ``gpu_events`` watches udev's drm events, ``kernel_sources`` opens both for the agent;
``signals`` brings SIGTERM and SIGINT into the loop as a descriptor; ``gpu_metrics`` samples amdgpu sysfs or NVML
for the exporter. Every source is read when its file descriptor is ready: none of them polls.
"""
