"""The run's callbacks beside OLMo-core's own (olmo_core/train/callbacks/), each adding what
OLMo-core's lacks, which its module's docstring says (with the line of OLMo-core's source):

- ``checkpointer``: OLMo-core's checkpointer that never re-saves a loaded step, never saves
  non-finite weights, records each checkpoint's CRCs, keeps the last ``run.ephemeral_keep``
  ephemeral checkpoints (and, set so, every permanent one), and ends a full disk in one line;
- ``nonfinite``: the first non-finite loss or gradient norm stops the run before it is saved;
- ``stop``: SIGTERM and SIGUSR1 from the process's start to its end save and exit 0;
- ``metrics_file``: ``metrics.jsonl``, every step's metrics;
- ``console``: one progress line per log interval, the rest in ``train.log``;
- ``wandb``: OLMo-core's WandBCallback offline and resumed.
"""
