"""What depends on the machine and the job, decided at launch: the ranks and the device (``layout``:
``resolve``), the GPU cards (``cards``), the memory model (``memory``) and the preset for a card
(``presets``), the run folder's lock and records
(``run_folder``), the shared-folder check (``shared_fs``), a failure on one rank ending all
(``peers``), and sweeps of runs (``sweep``)."""
