"""What depends on the machine and the job, decided at launch: the ranks and the device (``layout``:
``resolve``), GPU cards and the memory model (``hardware``), the run folder's lock and records
(``run_folder``), the shared-folder check (``shared_fs``), a failure on one rank ending all (``peers``),
and sweeps of runs (``sweep``)."""
