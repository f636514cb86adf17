"""Running an experiment on OLMo-core's Trainer: a spec's data sources (sources), optimizer (optimizer)
and OLMo-core configs (experiment), the run's life and its exit line (run); resume and
checkpoint safety, stop signals, progress, metrics, the batch trace. Imports config and the layers below it."""

from .experiment import Experiment, OrderedDataLoaderConfig, build_experiment, device_for
from .run import exit_line, train
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
