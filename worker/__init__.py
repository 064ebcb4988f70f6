"""The worker: what trains under the supervisor, by subject. Each sub-wing imports only its own modules and those of
the wings under it in this list (the top first), at a module's top, never inside a function:

    training/     the worker's main (``python -m worker``), the supervised trainer, the trainers of each task
    distributed/  DDP: a rank's supervision under torch.distributed.run, several hosts' rendezvous
    standby/      the worker started ahead of its attempt: what it builds while it waits, its ranks' server
    supervision/  what a launch record sets for one training: the link to the supervisor, the faults, the resume point
    startup/      before the first batch: the steps and their clock, the device warm-up, the demo data set
    loading/      the DataLoaders, and a loader rebuilt after its worker processes were replaced
    checkpoints/  a checkpoint written whole, in the training step or beside it
    patches/      the fallbacks patched into torch and Ultralytics before a model is built
    heartbeat.py  the heartbeat client (``from worker.heartbeat import Heartbeat``: a supervised script's own import)
    witness.py    the thread that says where the main thread waits
    wait_chain.py what that wait waits for: the chain of waits across the process's threads
    wire/         the ground: what the supervisor and the worker share (the contract, the heartbeat's protocol, the
                  command channel, the fault specs, the durable write, the GPU arch the runtime sees); torch-free

The supervisor imports ``worker.wire`` alone, and nothing here imports ``supervisor``: the two processes meet on the
wire. tests/worker/test_worker_imports.py holds this law, as tests/test_floors.py holds the supervisor's.
"""
