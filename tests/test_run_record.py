"""Moved keys: old spellings on the command line and in stored configs read with the new names; what a
resume compares with the stored config."""

from __future__ import annotations

import logging

import pytest

from pipeline.plugins import ConfigError
from pipeline.run_record import check_resume_config, upgrade_config, upgrade_overrides


def test_old_override_spellings_are_rewritten_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="pipeline.run_record"):
        got = upgrade_overrides(["data_source.path=a.jsonl", "+eval.datasets.1.path=e.jsonl", "rollout.path=m.f",
                                 "dynamic_filter.over_sampling_factor=4", "~data_source.path", "eval.datasets.x.path=y"])
    assert got == ["data_source.prompt_data=a.jsonl", "eval.datasets.1.prompt_data=e.jsonl", "rollout.path=m.f",
                   "over_sampling_factor=4", "~data_source.path", "eval.datasets.x.path=y"]
    assert "data_source.path moved to data_source.prompt_data (the old key is deprecated)" in caplog.text
    assert "eval.datasets.1.path moved to eval.datasets.1.prompt_data" in caplog.text


def test_a_stored_config_of_the_earlier_layout_is_read_with_the_new_keys():
    stored = {"data_source": {"_target_": "x.Plain", "path": "a.jsonl", "over_sampling_factor": 2},
              "dynamic_filter": {"path": None, "over_sampling_factor": 4},
              "eval": {"datasets": [{"name": "m", "path": "e.jsonl"}, {"name": "n", "prompt_data": "f.jsonl"}]},
              "rollout": {"path": "m.f"}}
    got = upgrade_config(stored)
    assert got == {"data_source": {"_target_": "x.Plain", "prompt_data": "a.jsonl"},
                   "dynamic_filter": {"path": None},
                   "eval": {"datasets": [{"name": "m", "prompt_data": "e.jsonl"}, {"name": "n", "prompt_data": "f.jsonl"}]},
                   "rollout": {"path": "m.f"}, "over_sampling_factor": 4}
    assert stored["data_source"]["path"] == "a.jsonl"  # the stored record itself is left as it was
    assert upgrade_config(got) == got  # a config of this layout is unchanged


def test_a_resume_from_another_shell_with_another_cache_folder_is_the_same_experiment(tmp_path):
    """ROLLOUT_PIPELINE_CACHE set in one shell and not in the next moves every `<part>.cache_dir`:
    where the rebuildable cache lives is not part of the experiment, a changed temperature is."""
    stored = {"resume_safe_keys": ["num_rollout", "paths"], "allow_config_change": False, "num_rollout": 2,
              "rollout_temperature": 1.0, "paths": {"cache_dir": "/work/cache"},
              "data_source": {"cache_dir": "/work/cache", "seed": 1}, "engine": {"cache_dir": "/work/cache"}}
    moved = {**stored, "num_rollout": 4, "paths": {"cache_dir": "./.cache"},
             "data_source": {"cache_dir": "./.cache", "seed": 1}, "engine": {"cache_dir": "./.cache"}}
    assert check_resume_config(stored, moved, str(tmp_path)) == {"num_rollout": (2, 4)}
    with pytest.raises(ConfigError, match=r"rollout_temperature: 1.0 -> 0.5"):
        check_resume_config(stored, {**moved, "rollout_temperature": 0.5}, str(tmp_path))
    with pytest.raises(ConfigError, match=r"data_source.seed: 1 -> 2"):
        check_resume_config(stored, {**moved, "data_source": {"cache_dir": "./.cache", "seed": 2}}, str(tmp_path))
