"""A worker's start before its first batch: its steps and their clock, the device warm-up, the demo data set."""
