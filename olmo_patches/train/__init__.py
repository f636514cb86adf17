"""Running an experiment on OLMo-core's Trainer: a spec's data sources (sources), optimizer
(optimizer) and OLMo-core configs (experiment), the run's course (run) and how it ends: stop
signals, disk space, its exit line (life); resume and checkpoint safety, progress, metrics, the
batch trace. Imports config and the layers below it."""

from .experiment import Experiment, OrderedDataLoaderConfig, build_experiment, device_for
from .life import exit_line
from .run import train
from .sources import DataSources, resolve_data

__all__ = [
    "DataSources",
    "Experiment",
    "OrderedDataLoaderConfig",
    "build_experiment",
    "device_for",
    "exit_line",
    "resolve_data",
    "train",
]
