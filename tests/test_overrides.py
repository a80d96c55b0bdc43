"""Override values on the command line (`pipeline.overrides`): any run dir name, quoted for Hydra
and the shell, reads back as itself."""

from __future__ import annotations

import shlex

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from pipeline.overrides import command_arg, hydra_quoted, override_value, unique_dir_arg

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
