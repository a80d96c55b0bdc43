"""Moved keys: old spellings on the command line and in stored configs read with the new names."""

from __future__ import annotations

import logging

from pipeline.run_record import upgrade_config, upgrade_overrides


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
