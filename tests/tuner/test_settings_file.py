"""The tuner's settings and the run's details from a space's ``tuner:`` section and a
``--tuner FILE``: which wins, what is refused and how, what docs/tuner.md documents."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from autotune.config.space import load_space
from autotune.errors import SettingsError
from autotune.tuner.settings import TunerSettings
from autotune.tuner.settings_file import SECTIONS, read_run_settings

REPO = Path(__file__).resolve().parents[2]
QWEN_SPACE = REPO / "search_spaces" / "qwen3.6-27b-awq.yaml"
TUNER_DOC = REPO / "docs" / "tuner.md"


def space_with(tmp_path: Path, section: str) -> Path:
    """The Qwen space with ``section`` (YAML text) appended as its tuner: section."""
    path = tmp_path / "space.yaml"
    path.write_text(QWEN_SPACE.read_text() + "tuner:\n" + section)
    return path


def test_no_section_and_no_file_are_the_defaults() -> None:
    settings = read_run_settings(QWEN_SPACE)
    assert settings.tuner == TunerSettings()
    assert settings.describe() is None


def test_the_file_wins_over_the_space_key_by_key_inside_sections_too(tmp_path: Path) -> None:
    space = space_with(
        tmp_path,
        "  confirm: 0\n  dedup: false\n  simulator:\n    time_scale: 50\n    noise: 0.02\n",
    )
    file = tmp_path / "tuner.yaml"
    file.write_text("confirm: 6\nsimulator:\n  time_scale: 200\nload:\n  max_requests: 9\n")
    settings = read_run_settings(space, file)
    assert settings.tuner.confirm == 6  # the file's
    assert settings.tuner.dedup is False  # the space's: the file is silent on it
    assert settings.simulator.time_scale == 200  # the file's
    assert settings.simulator.noise == 0.02  # the space's, beside the file's time_scale
    assert settings.load.max_requests == 9
    load = settings.load_spec(mode="concurrency", concurrency=3, duration_s=None)
    assert (load.mode, load.concurrency, load.max_requests) == ("concurrency", 3, 9)
    line = settings.describe()
    assert line is not None
    assert f"dedup=false, simulator.noise=0.02 ({space} tuner:)" in line
    assert f"confirm=6, load.max_requests=9, simulator.time_scale=200 ({file})" in line


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("seed: 1\nconfim: 0\n", ":2: confim: unknown setting (did you mean confirm?)"),
        ("load:\n  max_request: 3\n", ":2: load.max_request: unknown setting (did you mean "),
        ("simulator:\n  speed: 3\n", ":2: simulator.speed: unknown setting (known: time_scale"),
        ("confirm: -1\n", ":1: confirm: Input should be greater than or equal to 0 (got -1)"),
        ("dedup: 1\n", ":1: dedup: Input should be a valid boolean (got 1)"),
        ("engine:\n  startup_timeout_s: soon\n", ":2: engine.startup_timeout_s: Input should "),
        ("load: 8\n", ":1: load: Input should be a valid dictionary"),
    ],
)
def test_a_bad_key_in_the_file_is_one_line_naming_file_line_and_key(
    tmp_path: Path, text: str, expected: str
) -> None:
    file = tmp_path / "tuner.yaml"
    file.write_text(text)
    with pytest.raises(SettingsError) as raised:
        read_run_settings(QWEN_SPACE, file)
    message = str(raised.value)
    assert message.startswith(f"{file}{expected}"), message
    assert "\n" not in message


def test_a_bad_key_in_the_space_names_the_space_and_its_line(tmp_path: Path) -> None:
    space = space_with(tmp_path, "  confirm: 2\n  race_erly: false\n")
    line = len(QWEN_SPACE.read_text().splitlines()) + 3
    with pytest.raises(SettingsError, match=re.escape(f"{space}:{line}: tuner.race_erly: ")):
        read_run_settings(space)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, "no such settings file"),
        ("confirm: [1\n", ":2: not valid YAML"),
        ("- confirm\n", "a settings file is a YAML mapping"),
    ],
)
def test_a_file_that_is_not_a_settings_file_is_one_line(
    tmp_path: Path, text: str | None, expected: str
) -> None:
    file = tmp_path / "tuner.yaml"
    if text is not None:
        file.write_text(text)
    with pytest.raises(SettingsError, match=re.escape(expected)):
        read_run_settings(QWEN_SPACE, file)


def test_the_tuner_section_is_no_part_of_the_space_digest(tmp_path: Path) -> None:
    """A resume with edited settings is judged by the settings' own check, not refused as
    another space (and a study made before the section existed keeps its digest)."""
    with_section = load_space(space_with(tmp_path, "  confirm: 0\n"))
    assert with_section.tuner == {"confirm": 0}
    assert with_section.digest() == load_space(QWEN_SPACE).digest()


def _documented_defaults() -> dict[str, str]:
    """docs/tuner.md's key tables: `key` | `default` | ..."""
    rows = re.findall(r"^\| `([a-z_.]+)` \| `([^`]*)` \|", TUNER_DOC.read_text(), re.M)
    return dict(rows)


def _yaml_text(value: object) -> str:
    return yaml.safe_dump(value).removesuffix("\n...\n").strip()


def test_docs_tuner_documents_every_key_once_with_the_code_s_default() -> None:
    documented = _documented_defaults()
    keys = dict(TunerSettings().model_dump())
    for name, model in SECTIONS.items():
        keys |= {f"{name}.{key}": value for key, value in model().model_dump().items()}
    assert set(documented) == set(keys)
    rows = re.findall(r"^\| `([a-z_.]+)` \|", TUNER_DOC.read_text(), re.M)
    assert len(rows) == len(set(rows)), "a key documented twice"
    for key, value in keys.items():
        assert documented[key] == _yaml_text(value), key
