"""What a launch record sets for one training: the link to the supervisor, the faults to inject, the resume point."""
