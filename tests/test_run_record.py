"""Moved keys: old spellings on the command line and in stored configs read with the new names; what a
resume compares with the stored config."""

from __future__ import annotations

import logging

import pytest

from pipeline.config.plugins import ConfigError
from pipeline.run.run_record import check_resume_config, upgrade_config, upgrade_overrides


def test_old_override_spellings_are_rewritten_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="pipeline.run.run_record"):
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


def overrides_of(stored: list[str], new: list[str], groups=("engine", "trainer", "experiment", "hydra/launcher")):
    from pipeline.run.run_record import SessionOverrides

    return SessionOverrides(stored=stored, command=[*stored, *new, "resume=/r"], groups=frozenset(groups))


STORED = {"resume_safe_keys": ["num_rollout"], "allow_config_change": False, "num_rollout": 2,
          "rollout_temperature": 1.0, "trainer": {"lr": 1e-6}}


def test_keys_the_project_added_or_whose_default_it_changed_are_upgrades_not_refusals(tmp_path):
    from pipeline.run.run_record import project_upgrades

    current = {**STORED, "num_rollout": 3, "resume_safe_keys": ["num_rollout", "trainer.num_workers"],
               "trainer": {"lr": 1e-6, "seed": 0, "num_workers": 1}, "rollout_temperature": 0.9}
    overrides = overrides_of(["trainer=policy_gradient", "num_rollout=2"], ["num_rollout=3"])
    changes = check_resume_config(STORED, current, str(tmp_path), overrides)
    assert changes == {"num_rollout": (2, 3), "resume_safe_keys": (["num_rollout"], ["num_rollout", "trainer.num_workers"]),
                       "rollout_temperature": (1.0, 0.9), "trainer.num_workers": ("<absent>", 1),
                       "trainer.seed": ("<absent>", 0)}
    assert project_upgrades(changes, overrides) == set(changes) - {"num_rollout"}
    # without the overrides (a run(cfg) outside Hydra) every change is the user's: refused
    with pytest.raises(ConfigError, match=r"rollout_temperature: 1.0 -> 0.9") as refused:
        check_resume_config(STORED, current, str(tmp_path))
    assert "trainer.seed: '<absent>' -> 0" in str(refused.value)


def test_the_users_own_changes_are_still_guarded(tmp_path):
    current = {**STORED, "rollout_temperature": 0.5, "trainer": {"lr": 1e-5}}
    for new in (["rollout_temperature=0.5", "trainer.lr=1e-5"], ["+rollout_temperature=0.5", "++trainer.lr=1e-5"]):
        with pytest.raises(ConfigError, match=r"rollout_temperature: 1.0 -> 0.5\n  trainer.lr: 1e-06 -> 1e-05"):
            check_resume_config(STORED, current, str(tmp_path), overrides_of(["trainer.lr=1e-6"], new))
    # a config group picked anew may change any key: nothing counts as an upgrade
    with pytest.raises(ConfigError, match=r"rollout_temperature: 1.0 -> 0.5"):
        check_resume_config(STORED, current, str(tmp_path), overrides_of([], ["engine=hf"]))
    with pytest.raises(ConfigError, match=r"rollout_temperature"):
        check_resume_config(STORED, current, str(tmp_path), overrides_of([], ["hydra/launcher=ray"], groups=()))


def test_the_safe_keys_are_the_stored_list_merged_with_the_projects_unless_the_command_sets_them(tmp_path):
    from pipeline.run.run_record import resume_safe_list

    current = {**STORED, "resume_safe_keys": ["num_rollout", "rollout_temperature"], "rollout_temperature": 0.5}
    merged = overrides_of([], ["rollout_temperature=0.5"])
    assert resume_safe_list(STORED, current, merged) == ["num_rollout", "rollout_temperature"]
    assert check_resume_config(STORED, current, str(tmp_path), merged) == {
        "resume_safe_keys": (["num_rollout"], ["num_rollout", "rollout_temperature"]), "rollout_temperature": (1.0, 0.5)}
    widened = overrides_of([], ["resume_safe_keys=[num_rollout,rollout_temperature]", "rollout_temperature=0.5"])
    assert resume_safe_list(STORED, current, widened) == ["num_rollout"]
    with pytest.raises(ConfigError, match=r"resume_safe_keys: \['num_rollout'\] -> \['num_rollout', 'rollout_temperature'\]"
                                          r"\n  rollout_temperature: 1.0 -> 0.5"):
        check_resume_config(STORED, current, str(tmp_path), widened)
    assert resume_safe_list(STORED, current, None) == ["num_rollout"]
    assert resume_safe_list({}, current, None) == ["num_rollout", "rollout_temperature"]  # a record without the key
