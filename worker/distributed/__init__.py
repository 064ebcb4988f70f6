"""DDP: a rank's supervision under torch.distributed.run, and the rendezvous of several hosts."""
