"""``tilegen bench``: kernels and prepared calls timed on the CPU they run on.

:mod:`.stats` (the stopping rule) and :mod:`.clock` (cycle counter, wall clock, timer and core
frequency, emulation) and :mod:`.harness` (the timed jobs) run on the Arm CPU -- the guest
Python under qemu on x86-64 hosts; :mod:`.report` runs on the host: it builds the clock
routines, starts the harness, joins its timings with the llvm-mca model and prints them."""
