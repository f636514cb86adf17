"""A downstream task that cannot fit eval.downstream_sequence_length is refused before the run
writes anything (it used to surface inside the Trainer's build, after config.yaml was recorded)."""

import pytest

from olmo_patches.config import ConfigError
from olmo_patches.launch.layout import load_and_resolve
from olmo_patches.train import train

from .conftest import REPO, tiny_overrides

BASELINE = REPO / "configs" / "demo" / "baseline.yaml"


def test_a_task_that_cannot_fit_is_refused_in_one_line_with_nothing_written(tmp_path, demo_corpus):
    folder = tmp_path / "run"
    # every COPA answer is a sentence: longer than 3 tokens of the demo tokenizer, so no document
    # can be scored
    spec = load_and_resolve(
        BASELINE,
        tiny_overrides(
            folder,
            "train.max_steps=2",
            "eval.downstream_tasks=[copa]",
            "eval.downstream_sequence_length=3",
        ),
    )
    with pytest.raises(ConfigError) as e:
        train(spec)
    assert "\n" not in str(e.value)
    assert str(e.value).startswith(
        "eval.downstream_sequence_length=3: no 'copa' document fits (the shortest needs "
    )
    assert not folder.exists()
