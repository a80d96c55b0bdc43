"""Every option of every config group, discovered from disk, composes, resolves and builds.

Engines are built but not started (the hf engine loads its model lazily on start(), so no model
is loaded here); the wandb logger is built but not started.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from pipeline.loop.parts import build_parts
from pipeline.engines.scripted import ByteTokenizer
from pipeline.config.args import ConfigError, SlimeArgs, to_plain, validate
from pipeline.config.plugins import TargetNotAllowedError, allowed_targets, build
from pipeline.samples.sample import Sample
from pipeline.sinks.files import write_samples

CONF = Path(__file__).resolve().parents[1] / "conf"
# groups whose options replace a whole run (not a swappable role)
SKIP_DIRS = {"hydra"}


def discover() -> list[tuple[str, str]]:
    """(group, option) for every conf/<group>/<option>.yaml."""
    out = []
    for group_dir in sorted(p for p in CONF.iterdir() if p.is_dir() and p.name not in SKIP_DIRS):
        out += [(group_dir.name, f.stem) for f in sorted(group_dir.glob("*.yaml"))]
    return out


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("conf")
    rows = [{"input": f"What is {i} + {i + 1}?", "label": str(2 * i + 1)} for i in range(12)]
    (d / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:4]))
    chat = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}] * 4
    (d / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in chat))
    write_samples(d / "prev" / "samples" / "rollout_0.jsonl",
                  [Sample(group_index=0, index=i, reward=1.0, tokens=[1, 2], response_length=1) for i in range(2)])
    return d


def base_overrides(d: Path) -> list[str]:
    return [f"paths.output_dir={d}/out", f"data_source.prompt_data={d}/train.jsonl", f"paths.data_dir={d}",
            f"paths.cache_dir={d}/cache", "engine=scripted", "logger=jsonl"]


def option_overrides(group: str, option: str, d: Path) -> list[str]:
    """What an option needs from the user (documented in its YAML) to be runnable."""
    plugins = ["allowed_targets_extra=[tests.]"]
    need = {
        ("rollout", "function"): ["rollout.path=tests.plugins.slime_plugins.generate_rollout"] + plugins,
        ("rollout", "replay"): [f"rollout.source_dir={d}/prev"],
        ("rollout", "sft"): [f"data_source.prompt_data={d}/chat.jsonl", "data_source.input_key=messages",
                             "data_source.apply_chat_template=false",
                             "data_source.label_key=null", "n_samples_per_prompt=1", "advantage=none"],
        ("eval", "function"): ["eval.path=tests.plugins.slime_plugins.generate_rollout", "eval_interval=1"] + plugins,
        ("eval", "engine"): ["eval_interval=1", f"eval.datasets.0.prompt_data={d}/eval.jsonl"],
        ("experiment", "learn"): [f"eval.datasets.0.prompt_data={d}/eval.jsonl"],
        ("experiment", "tools"): [f"eval.datasets.0.prompt_data={d}/eval.jsonl"],
        ("experiment", "tools_direct"): [f"eval.datasets.0.prompt_data={d}/eval.jsonl"],
        ("experiment", "sft"): [f"data_source.prompt_data={d}/chat.jsonl"],
        ("filter", "reward_topk"): ["data_source=buffered"],
        ("filter", "oldest_first"): ["data_source=buffered"],
        ("advantage", "rloo"): ["n_samples_per_prompt=2"],
        ("trainer", "function"): ["trainer.train_function_path=tests.plugins.trainer_hooks.count_train_data"] + plugins,
        ("reward", "custom"): ["reward.custom_rm_path=examples.reward.brevity_math", "allowed_targets_extra=[examples.]"],
        ("reward", "dapo"): ["reward_key=score"],
        # built from args alone (slime's names): the prompt file is the top-level prompt_data
        ("data_source", "slime"): [f"+prompt_data={d}/train.jsonl"],
    }
    if group == "engine" and option != "scripted":
        # model engines are built lazily; only their tokenizer (for the chat template) would load
        # (convert) the bundled model here, so the data source renders no template in this test
        return ["data_source.apply_chat_template=false"]
    return need.get((group, option), [])


def compose_cfg(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("group,option", discover())
def test_every_option_composes_resolves_and_builds(group, option, workdir):
    overrides = base_overrides(workdir) + [f"{group}={option}"] + option_overrides(group, option, workdir)
    if (group, option) == ("data_source", "slime"):  # its node has no keyword settings
        overrides = [o for o in overrides if not o.startswith("data_source.")]
    cfg = compose_cfg(overrides)
    plain = to_plain(cfg)  # resolves every interpolation; raises on ??? (missing) values
    validate(cfg)
    allowed = allowed_targets(plain)
    # parts the app builds outside build_parts (logger) or only when a consumer needs them
    for extra in ("logger", "reward", "engine"):
        built = build(plain[extra], allowed=allowed, where=extra)
        assert built is not None, f"{extra} built nothing with {group}={option}"
        getattr(built, "close", lambda: None)()
    closers: list = []
    try:
        parts, eval_fn, schedule = build_parts(plain, SlimeArgs.from_config(plain), allowed, str(workdir / "out"), closers)
    finally:
        for c in closers:
            getattr(c, "close", lambda: None)()
    assert parts.rollout_fn is not None and parts.data_source is not None
    assert (eval_fn is not None) == (plain["eval_interval"] is not None)
    assert schedule.num_rollout == plain["num_rollout"]


def test_discovery_finds_the_documented_groups():
    found = {}
    for g, o in discover():
        found.setdefault(g, set()).add(o)
    assert {"plain", "buffered"} <= found["data_source"]
    assert {"pop_first", "reward_topk", "oldest_first"} <= found["filter"]
    assert {"none", "nonzero_std", "nonzero_std_fallback"} <= found["dynamic_filter"]
    assert {"sft", "replay"} <= found["rollout"]
    assert {"grpo", "gspo", "cispo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "rloo", "dr_grpo",
            "none"} <= found["advantage"]
    assert {"wandb", "jsonl"} <= found["logger"]
    assert found["experiment"]


@pytest.mark.parametrize("ds", ["plain", "buffered"])
@pytest.mark.parametrize("filt", ["pop_first", "reward_topk", "oldest_first"])
def test_data_source_filter_product(ds, filt, workdir):
    cfg = compose_cfg(base_overrides(workdir) + [f"data_source={ds}", f"filter={filt}"])
    if ds == "plain" and filt != "pop_first":
        with pytest.raises(ConfigError, match="filter: .*needs a buffer.*data_source=buffered"):
            validate(cfg)
        return
    validate(cfg)
    plain = to_plain(cfg)
    allowed = allowed_targets(plain)
    f = build(plain["filter"], allowed=allowed)
    source = build(dict(plain["data_source"], save_dir=str(workdir / "ck")), allowed=allowed,
                   args=SlimeArgs.from_config(plain), buffer_filter=f, tokenizer=ByteTokenizer())
    groups = source.get_samples(2)
    assert groups[0][0].prompt.startswith("user: What is")  # chat template of the tokenizer given
    assert len(groups) == 2 and all(len(g) == plain["n_samples_per_prompt"] for g in groups)
    if ds == "buffered":
        assert source.buffer_filter is f
        source.add_samples(groups)
        assert source.get_buffer_length() == 2
        assert len(source.get_samples(1)) == 1


@pytest.mark.parametrize("override,message", [
    ("over_sampling_batch_size=2", r"over_sampling_batch_size: 2 must be >= rollout_batch_size \(4\)"),
    ("rollout_batch_size=0", "rollout_batch_size: expected a positive integer, got 0"),
    ("n_samples_per_prompt=two", "n_samples_per_prompt: expected a positive integer, got 'two'"),
    ("partial_rollout=true", "partial_rollout: true needs data_source=buffered"),
    ("partial_rollout=maybe", "partial_rollout: expected true or false"),
    ("eval_interval=0", "eval_interval: expected a positive integer or null, got 0"),
    ("eval_interval=2", "eval_interval: 2 is set but eval=none"),
    ("eval_before_train=true", "eval_before_train: true but eval=none"),
    ("save_interval=-1", "save_interval: expected a positive integer or null"),
    ("train_async=true", "train_async: true overlaps generation with training, but trainer=none trains nothing"),
    ("max_weight_staleness=0", r"max_weight_staleness: expected an integer >= 1 \(how many weight versions"),
    ("omp_spin_count=-1", r"omp_spin_count: expected an integer >= 0 \(0: OpenMP threads sleep as soon as an op "
                          r"ends\), got -1"),
    ("omp_spin_count=lots", "omp_spin_count: expected an integer >= 0 .*got 'lots'"),
    ("keep_freed_memory=sometimes", "keep_freed_memory: expected true or false, got 'sometimes'"),
    ("start_rollout_id=5", r"start_rollout_id: 5 must be < num_rollout \(3\)"),
    ("data_source.prompt_data='/nonexistent/x.jsonl@[1:]'", "data_source.prompt_data: '/nonexistent/x.jsonl' does not exist"),
    ("rollout_top_p=1.5", r"rollout_top_p: expected a number in \(0, 1\]"),
    ("resume=/nonexistent/run", "resume: '/nonexistent/run' is not a directory"),
    ("custom_reward_post_process_path=nodots", "custom_reward_post_process_path: expected a dotted path"),
    ("allowed_targets_extra=mypkg", "allowed_targets_extra: expected a list"),
    ("rollout=function", "rollout: the node has no _target_ or path"),
    ("advantage.estimator=ppo", r"advantage.estimator: expected one of \[.*'grpo'.*\], got 'ppo'"),
    ("advantage.group_mode=prompt", "advantage.group_mode: expected one of"),
    ("advantage=rloo", None),
    ("logger=wandb logger.mode=cloud", "logger.mode: expected offline, online or disabled, got 'cloud'"),
    ("data_source.seed=abc", "data_source.seed: expected an integer, got 'abc'"),
    ("data_source.shuffle=3", "data_source.shuffle: expected true or false, got 3"),
    ("data_source.prompt_data=null", "data_source.prompt_data: null, but the plain source needs a prompt file; for a buffer-only"),
    ("data_source=buffered data_source.prompt_data=null", r"no prompt file \(buffer-only, slime's --disable-rollout-global-"
                                                   r"dataset\), so EngineRollout would get empty prompts"),
    ("data_source=buffered data_source.prompt_data=null rollout=function rollout.path=tests.plugins.slime_plugins.generate_rollout"
     " allowed_targets_extra=[tests.]", None),
    ("dynamic_filter=nonzero_std over_sampling_factor=0.5",
     "over_sampling_factor: expected a number >= 1, got 0.5"),
    ("dynamic_filter=nonzero_std over_sampling_factor=x",
     r"over_sampling_batch_size: expected a positive integer, got \"4 x 'x' \(not numbers\)\""),
    ("data_source.n_samples_per_prompt=8",
     r"data_source.n_samples_per_prompt: 8 differs from n_samples_per_prompt \(4\); set n_samples_per_prompt"),
    ("data_source.max_prompt_len=64",
     r"data_source.max_prompt_len: 64 differs from rollout_max_prompt_len \(None\); set rollout_max_prompt_len"),
    ("rollout_max_prompt_len=64", None),
    ("data_source=buffered over_sampling_factor=0",
     "over_sampling_factor: expected a number >= 1, got 0"),
])
def test_validate_names_key_and_expectation(override, message, workdir):
    extra = override.split()
    groups = {x.split("=")[0] for x in extra}
    cfg = compose_cfg([b for b in base_overrides(workdir) if b.split("=")[0] not in groups] + extra)
    if message is None:  # valid on its own
        validate(cfg)
        return
    with pytest.raises(ConfigError, match=message):
        validate(cfg)


@pytest.mark.parametrize("overrides,expected", [
    ([], 4), (["dynamic_filter=nonzero_std"], 16), (["dynamic_filter=nonzero_std_fallback", "rollout_batch_size=3"], 12),
    (["dynamic_filter=nonzero_std", "over_sampling_factor=1.5", "rollout_batch_size=3"], 5),
    (["dynamic_filter=nonzero_std", "over_sampling_batch_size=7"], 7),
])
def test_over_sampling_batch_size_follows_the_dynamic_filter(overrides, expected, workdir):
    extra = {x.split("=")[0] for x in overrides}
    cfg = compose_cfg([b for b in base_overrides(workdir) if b.split("=")[0] not in extra] + overrides)
    assert cfg.over_sampling_batch_size == expected


def test_validate_rloo_needs_two_samples_and_eval_paths(workdir):
    cfg = compose_cfg(base_overrides(workdir) + ["advantage=rloo", "n_samples_per_prompt=1"])
    with pytest.raises(ConfigError, match="advantage=rloo needs n_samples_per_prompt >= 2"):
        validate(cfg)
    cfg = compose_cfg(base_overrides(workdir) + ["eval=engine", "eval_interval=1", "eval.datasets.0.prompt_data=/no/e.jsonl"])
    with pytest.raises(ConfigError, match=r"eval.datasets\[0\].prompt_data: '/no/e.jsonl' does not exist"):
        validate(cfg)


def test_validate_reports_every_problem_at_once(workdir):
    cfg = compose_cfg(base_overrides(workdir) + ["rollout_batch_size=0", "num_rollout=0"])
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert "rollout_batch_size" in str(err.value) and "num_rollout" in str(err.value)


def test_disallowed_target_from_config_refused(workdir):
    cfg = compose_cfg(base_overrides(workdir) + ["rollout=function", "rollout.path=os.system"])
    plain = to_plain(cfg)
    with pytest.raises(TargetNotAllowedError, match="'os.system' is not allowed"):
        build(plain["rollout"], allowed=allowed_targets(plain), where="rollout")
    cfg = compose_cfg(base_overrides(workdir) + ["rollout=function", "rollout.path=tests.plugins.slime_plugins.generate_rollout"])
    with pytest.raises(TargetNotAllowedError, match=r"allowed_targets_extra=\[tests.\]"):
        build(to_plain(cfg)["rollout"], allowed=allowed_targets(to_plain(cfg)), where="rollout")


def test_the_bundled_data_named_from_another_folder_says_where_the_project_is(tmp_path, monkeypatch):
    """`python /path/to/run.py` from another folder: the data paths are relative to the project
    folder (paths.root_dir is `.`), and the message says so."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PROJECT_ROOT", raising=False)
    cfg = compose_cfg(["paths.output_dir=out", "engine=scripted", "logger=jsonl", "eval=engine", "eval_interval=1"])
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    root = CONF.parent
    hint = f"it is in the project folder {root}: run from there (cd {root}) or set PROJECT_ROOT={root}"
    assert f"data_source.prompt_data: './data/math_train.jsonl' does not exist (cwd {tmp_path}); " in str(err.value)
    assert f"eval.datasets[0].prompt_data: './data/math_eval.jsonl' does not exist; expected an eval prompt " \
           f"file; {hint}" in str(err.value)
    assert str(err.value).count(hint) == 2
    monkeypatch.setenv("PROJECT_ROOT", str(root))
    validate(compose_cfg(["paths.output_dir=out", "engine=scripted", "logger=jsonl", "eval=engine", "eval_interval=1"]))


@pytest.mark.parametrize("overrides,expected", [
    (["rollout_batch_size=0"], ["rollout_batch_size: expected a positive integer, got 0"]),
    (["rollout_batch_size=-2", "dynamic_filter=nonzero_std", "over_sampling_factor=1.5"],
     ["rollout_batch_size: expected a positive integer, got -2"]),
    (["rollout_batch_size=abc"], ["rollout_batch_size: expected a positive integer, got 'abc'"]),
    (["over_sampling_batch_size=0"], ["over_sampling_batch_size: expected a positive integer, got 0"]),
    (["rollout_batch_size=0", "over_sampling_batch_size=3"],  # set apart: its own key, checked on its own
     ["rollout_batch_size: expected a positive integer, got 0"]),
    (["rollout_batch_size=0", "over_sampling_batch_size=-1"],
     ["rollout_batch_size: expected a positive integer, got 0",
      "over_sampling_batch_size: expected a positive integer, got -1"]),
])
def test_a_bad_batch_size_is_one_error_not_a_follow_on_of_the_derived_one(overrides, expected, workdir):
    extra = {x.split("=")[0] for x in overrides}
    cfg = compose_cfg([b for b in base_overrides(workdir) if b.split("=")[0] not in extra] + overrides)
    with pytest.raises(ConfigError) as refused:
        validate(cfg)
    sizes = [line.strip()[2:] for line in str(refused.value).splitlines()
             if line.strip().startswith(("- rollout_batch_size", "- over_sampling_batch_size"))]
    assert sizes == expected
