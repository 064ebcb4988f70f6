"""What the supervisor and the worker share, torch-free: the contract, the heartbeat's protocol, the command
channel, the fault specs, the durable write, the GPU arch the runtime sees. The supervisor imports nothing else of
the worker."""
