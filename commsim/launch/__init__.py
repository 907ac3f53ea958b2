"""Running a program as the ranks of a simulated machine: the run's config, its modes (inproc, procs),
the start-up of each process, the verdict, `sweep --exec` and the pytest plugin.

An application-level package: it may import `scenario/`; `hosting/` never imports it."""
