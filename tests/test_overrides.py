"""Override values on the command line (`pipeline.run.overrides`): any run dir name, quoted for Hydra
and the shell, reads back as itself."""

from __future__ import annotations

import shlex

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from pipeline.run.overrides import command_arg, hydra_quoted, is_sweep_override, override_value, unique_dir_arg

ODD = ["runs/plain_dir-1.x", "/tmp/odd dir é", "/tmp/x'y", '/tmp/a"b', "/a/b'c\"d", "C:\\runs\\x", "/tmp/a\\",
       '/tmp/a\\"b\\', "/tmp/a,b=c[d]{e}(f)", "/tmp/\\\\x", "/x/\\\\'", "é", "日本語/ラン", "/tmp/tab\there"]


@pytest.mark.parametrize("value", ODD)
def test_a_quoted_value_reads_back_as_itself_in_hydra_omegaconf_and_the_shell(value):
    parser = OverridesParser.create()
    assert parser.parse_override(f"hydra.run.dir={hydra_quoted(value)}").value() == value
    assert override_value(f"resume={hydra_quoted(value)}") == value
    (word,) = shlex.split(command_arg("resume", value))  # one shell word
    assert parser.parse_override(word).value() == value
    if not OmegaConf.has_resolver("echo_arg"):
        OmegaConf.register_new_resolver("echo_arg", lambda x: x)
    (word,) = shlex.split(unique_dir_arg("hydra.run.dir", value))
    interpolation = parser.parse_override(word).value()  # what Hydra hands OmegaConf
    assert interpolation.startswith("${unique_dir:")
    assert OmegaConf.create({"k": interpolation.replace("unique_dir", "echo_arg", 1)}).k == value


def test_plain_values_stay_as_they_are_and_unparsable_ones_as_typed():
    assert hydra_quoted("outputs/runs/2026-11-29_10-00-00") == "outputs/runs/2026-11-29_10-00-00"
    assert command_arg("resume", "outputs/runs/x_2") == "resume=outputs/runs/x_2"
    assert command_arg("resume", "/tmp/my runs/é") == "'resume=\"/tmp/my runs/é\"'"
    assert unique_dir_arg("hydra.run.dir", "outputs/r") == "'hydra.run.dir=${unique_dir:outputs/r}'"
    # what Hydra's grammar refuses (typed in a shell as "resume=/tmp/é") or reads as a sweep: as typed
    assert override_value("resume=/tmp/é") == "/tmp/é"
    assert override_value("resume=/tmp/a,b") == "/tmp/a,b"
    assert override_value("resume=null") == "null"


@pytest.mark.parametrize("value", ['/tmp/a"b', 'runs/say "hi"', 'runs/"x" y'])
def test_a_value_holding_a_double_quote_is_kept_verbatim_in_single_quotes(value):
    # single quotes let a `"` stand unescaped: the stored and printed override shows the path as it is
    assert hydra_quoted(value) == f"'{value}'"
    assert OverridesParser.create().parse_override(f"resume={hydra_quoted(value)}").value() == value


@pytest.mark.parametrize("arg", ["resume=runs/lr=1e-5", "resume=runs/lr=1e-5,bs=8", "resume=/tmp/é=a=b"])
def test_a_refused_value_holding_an_equals_sign_is_all_the_text_after_the_first_one(arg):
    from hydra.errors import HydraException

    with pytest.raises(HydraException):  # Hydra's grammar refuses a bare `=` (and `é`) in a value
        OverridesParser.create().parse_override(arg)
    assert override_value(arg) == arg.split("resume=", 1)[1]


@pytest.mark.parametrize("arg, sweep", [
    ("seed=1,2", True), ("+x=a,b", True), ("seed=range(0,3)", True), ("data=glob(*)", True),
    ("seed=1", False), ("lr=[1,2]", False), ('resume="a,b"', False),  # one value, a list, a quoted comma
    ("seed=(1", False), ("seed=1,[", False), ("resume=runs/lr=1e-5", False),  # refused by Hydra: no sweep
])
def test_a_sweep_is_recognised_and_a_malformed_override_is_none(arg, sweep):
    assert is_sweep_override(arg) is sweep


# ----------------------------------------------------------------------------- `+key` typos at pre-flight
@pytest.fixture
def compose_run(tmp_path):
    """Compose conf/ with a run's basics plus `overrides` (a runnable scripted-engine config)."""
    from pathlib import Path

    from hydra import compose, initialize_config_dir

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"input": "1 + 1?", "label": "2"}\n')
    basics = [f"paths.output_dir={tmp_path}/out", f"paths.cache_dir={tmp_path}/cache", "engine=scripted",
              "logger=jsonl", f"data_source.prompt_data={prompts}"]

    def compose_with(overrides: list[str]):
        with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[1] / "conf"), version_base="1.3"):
            return compose(config_name="config", overrides=basics + overrides)
    return compose_with


@pytest.mark.parametrize("override, meant", [
    ("+n_sample_per_prompt=4", "n_samples_per_prompt"), ("+rollout_batch_sise=8", "rollout_batch_size"),
    ("+eval_intervall=2", "eval_interval"), ("+data_source.prompt_dat=x.jsonl", "data_source.prompt_data"),
    ("+data_source.sheuffle=false", "data_source.shuffle"), ("+rollout_shufle=true", "rollout_shuffle"),
])
def test_a_plus_key_a_small_edit_away_from_a_known_key_is_warned(override, meant, compose_run, caplog) -> None:
    from pipeline.config.args import validate

    cfg = compose_run([override])
    with caplog.at_level("WARNING", logger="pipeline.config.args"):
        validate(cfg, overrides=[override])
    hints = [r.getMessage() for r in caplog.records if "did you mean" in r.getMessage()]
    assert len(hints) == 1 and f"did you mean {meant}?" in hints[0] and override in hints[0], hints


def test_plugin_keys_far_from_every_known_key_stay_quiet(compose_run, caplog) -> None:
    from pipeline.config.args import validate

    quiet = ["+my_plugin_knob=3", "+loss_mask_type=qwen", "+sglang_speculative_algorithm=EAGLE", "+num_layers=2",
             "+moe_router_topk=2", "+rollout_shuffle=true", "+prompt_data=data/x.jsonl", "+rm_url=http://x",
             "+slime_args.custom_flag=1", "+reward.my_weight=0.5"]
    cfg = compose_run(quiet)
    with caplog.at_level("WARNING", logger="pipeline.config.args"):
        validate(cfg, overrides=quiet)
    assert not [r.getMessage() for r in caplog.records if "did you mean" in r.getMessage()]


def test_edit_distance_counts_a_swap_as_one() -> None:
    from pipeline.run.overrides import edit_distance

    assert edit_distance("n_sample_per_prompt", "n_samples_per_prompt") == 1
    assert edit_distance("eval_itnerval", "eval_interval") == 1 and edit_distance("", "abc") == 3
    assert edit_distance("seed", "stop") == 3 and edit_distance("same", "same") == 0
    assert edit_distance("abcd", "abd") == 1 and edit_distance("abc", "") == 3 and edit_distance("kitten", "sitting") == 3
    assert edit_distance("xxx", "x") == 2 and edit_distance("ab", "ba") == 1 and edit_distance("abcd", "badc") == 2 and edit_distance("ca", "abc") == 3


CFG = {"n_samples_per_prompt": 2, "seed": 1, "lr_x": 0, "eval_interval": 5, "rollout_top_k": -1, "rollout_top_p": 1.0,
       "optimum": 0, "data_source": {"shuffle": True, "prompt_data": "a.jsonl"}, "slime_args": {},
       "trainer": {"opt": {"beta": 0.9}}}


def added(overrides: list[str], extra=("rollout_shuffle",)) -> list[str]:
    """`added_key_typos` on CFG with the added keys put in, as Hydra composes them."""
    from pipeline.run.overrides import added_key_typos

    import copy

    cfg = copy.deepcopy(CFG)
    for arg in (a for a in overrides if a.startswith("+") and "=" in a):
        key = arg.lstrip("+").split("=")[0].split("@")[0]
        parent, _, leaf = key.rpartition(".")
        node = cfg
        for part in parent.split(".") if parent else ():
            node = node[part]
        node[leaf] = arg.split("=", 1)[1]
    return added_key_typos(overrides, cfg, extra)


def test_added_key_typos_says_which_key_and_how_to_set_it() -> None:
    assert added(["+n_sample_per_prompt=4"]) == [
        "+n_sample_per_prompt=4 adds a key this config does not have; did you mean n_samples_per_prompt? "
        "(n_samples_per_prompt stays 2; to set it: n_samples_per_prompt=4, without the +). A key that a plugin of "
        "your own reads can stay as it is"]
    assert added(["+data_source.shufle=false"]) == [
        "+data_source.shufle=false adds a key this config does not have; did you mean data_source.shuffle? "
        "(data_source.shuffle stays True; to set it: data_source.shuffle=false, without the +). A key that a "
        "plugin of your own reads can stay as it is"]
    # slime's names (not keys here) are suggested without a value; every nearest key is named
    assert added(["+rollout_shufle=1"]) == ["+rollout_shufle=1 adds a key this config does not have; "
                                            "did you mean rollout_shuffle?"]
    assert added(["+rollout_top_n=3"])[0].startswith("+rollout_top_n=3 adds a key this config does not have; "
                                                     "did you mean rollout_top_k or rollout_top_p? (rollout_top_k stays -1;")


@pytest.mark.parametrize("override, warned", [
    ("+sed=3", False),             # 3 letters: too short to tell a typo from a name
    ("+seex=3", True),             # 4-6 letters: one edit
    ("+sxxd=3", False),            # ... not two
    ("+eval_intervl=3", True), ("+eval_intrvl=3", True),   # 7 and more: two edits
    ("+eval_itrvl=3", False),      # ... not three
    ("+opxixum=3", True),          # 7 letters: two edits
    ("+lr_xyz=3", False),          # two letters more than a 4-letter key
])
def test_added_key_typos_limits_the_distance_by_the_length(override, warned) -> None:
    assert bool(added([override])) is warned


def test_added_key_typos_leaves_other_overrides_alone() -> None:
    assert added(["n_samples_per_prompt=3", "++n_sample_per_prompt=3", "~seed", "+n_sample_per_prompt@x=3",
                  "+nope=[unclosed", "+experiment=smoke"]) == []  # not `+key`, a package, malformed, a group
    assert added(["+nope=[unclosed", "+experiment=smoke", "+n_sample_per_prompt='a=b'"]) == [  # skipped, then one
        "+n_sample_per_prompt='a=b' adds a key this config does not have; did you mean n_samples_per_prompt? "
        "(n_samples_per_prompt stays 2; to set it: n_samples_per_prompt='a=b', without the +). A key that a plugin "
        "of your own reads can stay as it is"]
    assert added(["rollout_top_k=3"]) == []  # a change of a known key, one edit from another, is no typo
    assert added(["+trainer.opt.betta=0.8"])[0].startswith("+trainer.opt.betta=0.8 adds a key this config does not have; "
                                                         "did you mean trainer.opt.beta? (trainer.opt.beta stays 0.9;")
    from pipeline.run.overrides import added_key_typos

    with_typo = {**CFG, "n_sample_per_prompt": 4}
    assert len(added_key_typos(["+seeds=x", "+n_sample_per_prompt=4"], with_typo)) == 1  # +seeds: not in the
    assert added_key_typos(["+seed.sub.x=1"], CFG) == []  # config, a group option; +seed.sub.x: under a value
    assert added(["+rollout_seed=1"], extra=("rollout_seed", "rollout_seeds")) == []  # slime's names as they are
    assert added(["+rollout_shuffle=true", "+prompt_data=x"], extra=("rollout_shuffle", "prompt_data")) == []
    assert added(["+data_source.rollout_shufle=1"]) == []  # slime's names stand at the top level only
    # two new keys do not suggest each other; a known key still does
    assert added(["+my_knob_a=1", "+my_knob_b=2"]) == [] == added(["+data_source.my_knob_a=1", "+data_source.my_knob_b=2"])
    assert len(added(["+eval_intervals=1", "+eval_intervalz=2"])) == 2


def test_command_line_overrides_are_the_hydra_job_s_and_empty_outside_one(tmp_path) -> None:
    from pathlib import Path

    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig

    from pipeline.run.overrides import command_line_overrides

    assert command_line_overrides() == []
    task = ["+n_sample_per_prompt=4", f"paths.output_dir={tmp_path}"]
    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[1] / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=task, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    try:
        assert command_line_overrides() == task
    finally:
        HydraConfig.instance().cfg = None
    assert command_line_overrides() == []
