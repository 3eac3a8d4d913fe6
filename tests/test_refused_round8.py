"""Issue 47, what round 7 left open: file outputs named '-', 'x.' or '.png', which became
'-.json', 'x..json' and '.png.png', and plan's --power-limits telling plain_float's reasons
apart from float()'s by the message's first character. Each is exit 2 naming the flag and
a name that works; the valid neighbours still run."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from capsim.cli.main import app
from tests.test_refused_leftovers import refused

runner = CliRunner()
PREDICT = ["predict", "--gpu", "h100-sxm", "--model", "llama-3.1-8b", "-c", "1"]
PREDICT += ["--requests", "2", "--output-tokens", "8"]
PROBE = ["probe", "--url", "http://127.0.0.1:9", "--model", "m"]
PLAN = ["plan", "--model", "llama-3.1-8b", "--agents", "1", "--gpus", "h100-sxm"]


@pytest.mark.parametrize(
    "command, flag, says",
    [
        (PREDICT, "--plot", "--plot names a file to write (e.g. --plot plot.png)"),
        (PROBE, "--out", "--out names a file to write (e.g. --out run.json)"),
        (["calibrate"], "--out", "--out names a file to write (e.g. --out profile.yaml)"),
        (["validate"], "--write-bands", "(e.g. --write-bands bands.yaml)"),
    ],
)
def test_a_dash_is_not_standard_output(command, flag, says, tmp_path, monkeypatch):
    """'--out -' wrote a file named '-.json' in the current folder (and '--plot -' one
    named '-.png'): many tools read '-' as standard output, capsim writes files only."""
    monkeypatch.chdir(tmp_path)
    refused([*command, flag, "-"], "'-' is not standard output here", says)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "command, flag, name, suggested",
    [
        (PREDICT, "--plot", "y.", "--plot y.png"),
        (PROBE, "--out", "runs/x.", "--out runs/x.json"),
        (["calibrate"], "--out", "a/b.", "--out a/b.yaml"),
        (["validate"], "--write-bands", "bands.", "--write-bands bands.yaml"),
    ],
)
def test_a_name_ending_in_a_dot_is_refused_with_a_suffix_offered(
    command, flag, name, suggested, tmp_path, monkeypatch
):
    """'--out x.' wrote 'x..json' and '--plot y.' 'y..png': a trailing '.' is a suffix
    left empty, never part of the name the user meant."""
    monkeypatch.chdir(tmp_path)
    refused([*command, flag, name], f"'{name}' ends in '.'", suggested)


@pytest.mark.parametrize(
    "command, flag, name",
    [
        (PREDICT, "--plot", ".png"),
        (PREDICT, "--plot", "out/.PNG"),
        (PROBE, "--out", ".json"),
        (["validate"], "--write-bands", ".yaml"),
    ],
)
def test_a_suffix_alone_is_not_a_file_name(command, flag, name, tmp_path, monkeypatch):
    """'--plot .png' wrote '.png.png': Path('.png') has no suffix (a hidden file's name)."""
    monkeypatch.chdir(tmp_path)
    refused([*command, flag, name], f"'{name}' is a file type without a name")


def test_the_neighbours_of_those_names_are_written(tmp_path, monkeypatch):
    """A hidden file with a type ('.x.png'), a name with dots inside ('a.b.png') and a
    name without a type (the .png added, as matplotlib adds it) are plots as before."""
    monkeypatch.chdir(tmp_path)
    for name, written in [(".x.png", ".x.png"), ("a.b.png", "a.b.png"), ("plain", "plain.png")]:
        r = runner.invoke(app, [*PREDICT, "--plot", name])
        assert r.exit_code == 0, r.output
        assert (tmp_path / written).is_file(), (name, r.output)


def test_import_hf_out_is_a_folder_and_keeps_its_names(tmp_path):
    """models import-hf's --out names a folder: the file-name rules do not apply to it
    (a folder named '-' is odd but a folder)."""
    from capsim.cli.main import output_name_without_a_stem

    class Param:
        opts = ("--out",)

    class Command:
        name = "import-hf"

    class Ctx:
        command = Command()

    assert output_name_without_a_stem("-", Param(), Ctx()) is None
    Command.name = "probe"
    assert "standard output" in output_name_without_a_stem("-", Param(), Ctx())


@pytest.mark.parametrize(
    "value, says, unsaid",
    [
        ("0_8", "malformed --power-limits '0_8' ('0_8' is not a number (an '_' in it))", None),
        ("1,0.8e-400", "too small to be read", None),
        ("'0.8'", "malformed --power-limits ''0.8''", "could not convert"),
        ("x", "malformed --power-limits 'x'", "could not convert"),
    ],
)
def test_power_limits_say_plain_floats_reasons_and_hide_floats(value, says, unsaid):
    """plain_float's own reasons (NotPlainNumber) are added to the message; float()'s
    ("could not convert string to float") are not, whatever the value's first character:
    a value that began with a quote was taken for one of plain_float's."""
    flat = refused([*PLAN, "--counts", "1", "--power-limits", value], says)
    if unsaid:
        assert unsaid not in flat


def test_not_plain_number_is_what_plain_float_raises_for_its_own_reasons():
    from capsim.errors import NotPlainNumber, TooSmallToRead, plain_float

    for text in ("1_0", "１０", "1e-400"):
        with pytest.raises(NotPlainNumber, match=text):
            plain_float(text)
    with pytest.raises(TooSmallToRead):
        plain_float("1e-320")
    with pytest.raises(ValueError) as caught:
        plain_float("x")
    assert not isinstance(caught.value, NotPlainNumber)
    assert plain_float(" 0.8 ") == 0.8
