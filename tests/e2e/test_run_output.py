"""What `autotune run` prints when nobody watches: stdout to a file, the log beside the
study, the resume banner, and the latency of the crowned config against the baseline."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import (
    REPO,
    SAMPLE_WORKLOAD,
    autotune_argv,
    output,
    tuner_args,
    wait_for,
)

FITS_SPACE = REPO / "tests" / "e2e" / "data" / "fits.yaml"
SEQS_SPACE = REPO / "tests" / "e2e" / "data" / "seqs.yaml"
DEDUP_SPACE = REPO / "tests" / "e2e" / "data" / "tuner-dedup.yaml"
FAST = {"load": {"max_requests": 8}, "seed": 1, "confirm": 0}
TRIAL_LINE = re.compile(
    r"^\d\d:\d\d:\d\d trial (?P<n>\d+) \[(?P<pos>\d+)/3\] (?P<outcome>[\w-]+): "
    r"(?P<value>[\d,.]+) output_tok_s; kv_cache_memory_gib=(?P<kv>[\d.]+); \d+s; "
    r"elapsed \d+:\d\d(, ETA \d+:\d\d)?; best [\d,.]+ output_tok_s \(#\d+\)$",
    re.M,
)


def run_args(
    tmp_path: Path,
    *extra: str,
    space: Path = FITS_SPACE,
    time_scale: int = 200,
    settings: dict | None = None,
) -> list[str]:
    """Time scale 200 where only what is printed counts; 50 where a latency is compared."""
    tuner = tuner_args(
        tmp_path / "settings", FAST, {"simulator": {"time_scale": time_scale}}, settings or {}
    )
    return [
        "run", "--workload", str(SAMPLE_WORKLOAD), "--engine", "sim",
        "--hardware", "rtx4080s-32g", "--model", "qwen3.6-27b-awq", "--space", str(space),
        "--storage", f"sqlite:///{tmp_path / 'studies' / 'autotune.db'}", "--study", "night",
        "--sampler", "grid", "--concurrency", "4", *tuner, *extra,
    ]  # fmt: skip


@pytest.mark.timeout(240)
def test_stdout_to_a_file_gets_a_line_per_trial_as_it_ends_and_the_full_table(
    tmp_path: Path, spawn
) -> None:
    """Before: with stdout not a terminal, nothing until the end, then the last 8 rows."""
    process = spawn(*run_args(tmp_path, "--trials", "3"), cwd=tmp_path)
    seen_early = wait_for(
        lambda: TRIAL_LINE.search(output(tmp_path)) is not None and process.poll() is None,
        timeout_s=150,
    )
    assert process.wait(timeout=200) == 0, output(tmp_path)
    assert seen_early, "the first trial's line appeared only after the run ended"
    text = output(tmp_path)
    lines = list(TRIAL_LINE.finditer(text))
    assert [m["n"] for m in lines] == ["0", "1", "2"], text
    assert {m["kv"] for m in lines} == {"8", "9", "10"}
    assert "trial 0 (baseline) [1/3] starts: kv_cache_memory_gib=8" in text
    assert re.search(r"trial 1: replaying", text)
    table = text[text.index("night: 3 trials") :]
    for number in ("0", "1", "2"):
        assert re.search(rf"│\s+{number} │ ok", table), table
    log = tmp_path / "studies" / "runs" / "night" / "run.log"
    assert f"log: {log}" in text
    logged = log.read_text()
    assert [m.group(0) for m in TRIAL_LINE.finditer(logged)] == [m.group(0) for m in lines]
    assert "Pre-flight:" in logged and "Best: trial" in logged


@pytest.mark.timeout(240)
def test_the_resume_banner_agrees_with_the_final_summary(tmp_path: Path) -> None:
    """Before: `1 trials complete` and the best of this session, not of the study."""
    first = subprocess.run(autotune_argv(*run_args(tmp_path, "--trials", "1")),
                           cwd=tmp_path, capture_output=True, text=True, timeout=200)  # fmt: skip
    assert first.returncode == 0, first.stdout + first.stderr
    best0 = re.search(r"Best: trial 0: ([\d,.]+) output_tok_s", first.stdout)
    assert best0, first.stdout
    again = subprocess.run(autotune_argv(*run_args(tmp_path, "--trials", "2")),
                           cwd=tmp_path, capture_output=True, text=True, timeout=200)  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr
    out = again.stdout
    assert f"Resuming study night: 1 trial complete, best {best0[1]} output_tok_s (trial 0)." in out
    final = re.search(r"Best: trial (\d+): ([\d,.]+) output_tok_s", out)
    last_line = re.findall(r"best ([\d,.]+) output_tok_s \(#(\d+)\)$", out, re.M)[-1]
    assert final and (final[2], final[1]) == last_line


@pytest.mark.timeout(240)
def test_a_best_config_with_worse_latency_is_said_so(tmp_path: Path) -> None:
    """Sixteen sequences at once beat one on throughput and stretch every token: the
    summary says so, with the SLO that would keep the baseline's latency."""
    result = subprocess.run(
        autotune_argv(*run_args(tmp_path, "--trials", "2", "--mode", "concurrency",
                                "--concurrency", "8", space=SEQS_SPACE, time_scale=50,
                                settings={"load": {"max_requests": 16}})),
        cwd=tmp_path, capture_output=True, text=True, timeout=220,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    out = " ".join(result.stdout.split())
    found = re.search(
        r"latency vs the baseline \(trial (\d)\): p95 TTFT \S+ vs \S+ \([+-]\d+%\), "
        r"p95 TPOT (\S+) vs (\S+) \(\+(\d+)%\)",
        out,
    )
    assert found, out
    assert int(found[4]) > 5
    assert f"warning: p95 TPOT is {found[4]}% worse than the baseline's" in out
    assert f"--slo 'tpot_p95<={found[3]}'" in out


@pytest.mark.skipif(shutil.which("script") is None, reason="util-linux `script` not installed")
@pytest.mark.timeout(240)
def test_on_a_terminal_the_live_display_counts_each_trial_once_and_the_log_is_kept(
    tmp_path: Path,
) -> None:
    """The live display and the log share one tally: trial 2/2 at the end, not 4/2."""
    command = shlex.join(autotune_argv(*run_args(tmp_path, "--trials", "2")))
    result = subprocess.run(["script", "-qec", command, "/dev/null"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=220)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:]
    screen = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", result.stdout)
    assert "2/2 trials done · best" in screen
    assert "3/2" not in screen and "4/2" not in screen
    logged = (tmp_path / "studies" / "runs" / "night" / "run.log").read_text()
    assert [m["pos"] for m in TRIAL_LINE.finditer(logged.replace("/2]", "/3]"))] == ["1", "2"]


def final_screen(stream: str) -> list[str]:
    """What a terminal shows once ``stream`` is written: text, newlines, carriage returns,
    and the cursor-up and erase-line sequences rich's live display redraws itself with."""
    lines, row, col = [""], 0, 0
    for token in re.split(r"(\x1b\[[0-9;?]*[A-Za-z]|\r\n|\r|\n)", stream):
        if not token:
            continue
        if token in ("\r\n", "\n"):
            row, col = row + 1, 0
            lines += [""] * (row + 1 - len(lines))
        elif token == "\r":
            col = 0
        elif token.startswith("\x1b["):
            if token[-1] == "A":
                row = max(0, row - int(token[2:-1] or 1))
            elif token[-1] == "K":
                lines[row] = "" if token[2:-1] == "2" else lines[row][:col]
        else:
            line = lines[row].ljust(col)
            lines[row] = line[:col] + token + line[col + len(token) :]
            col += len(token)
    return [line.rstrip() for line in lines if line.strip()]


@pytest.mark.skipif(shutil.which("script") is None, reason="util-linux `script` not installed")
@pytest.mark.timeout(240)
def test_on_a_terminal_every_finished_trial_keeps_its_line_above_the_live_status(
    tmp_path: Path,
) -> None:
    """Before: a live table of the last 8 trials (the winner's row scrolled away), counting
    trials from 0 in the table and from 1 in the status line (`trial 1/10` for trial 0)."""
    args = run_args(tmp_path, "--trials", "10")
    args[args.index("--sampler") + 1] = "random"  # 3 configs: 7 trials answered as duplicates
    command = shlex.join(autotune_argv(*args))
    result = subprocess.run(["script", "-qec", command, "/dev/null"], cwd=tmp_path,
                            capture_output=True, timeout=220,
                            env={**os.environ, "COLUMNS": "300"})  # fmt: skip
    stream = result.stdout.decode(errors="replace")  # bytes: text mode would turn \r into \n
    assert result.returncode == 0, stream[-3000:]
    screen = final_screen(stream)
    ended = [line for line in screen if re.match(r"\d\d:\d\d:\d\d trial \d+ \[\d+/10\] ", line)]
    numbers = [int(re.search(r"trial (\d+)", line)[1]) for line in ended]  # type: ignore[index]
    assert numbers == list(range(10)), "\n".join(screen)
    assert [re.search(r"\[(\d+)/10\]", line)[1] for line in ended] == [  # type: ignore[index]
        str(n + 1) for n in range(10)
    ]
    status = [line for line in screen if "trials done · best" in line]
    assert len(status) == 1 and status[0].startswith("10/10 trials done"), "\n".join(screen)
    assert screen.index(status[0]) > screen.index(ended[-1])  # the live line under them
    plain = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", stream)
    assert "trial 0 [1/10] · " in plain  # the status line names the trial as the lines do
    assert not re.search(r"trial \d+/10", plain)


@pytest.mark.timeout(240)
def test_a_trial_s_start_line_names_the_values_it_launches_with(tmp_path: Path) -> None:
    """Before: the start line showed the searched max-num-batched-tokens, the end line the
    value LMCache's rule launched (2N-1), as if two configs had run."""
    args = run_args(tmp_path, "--trials", "4", space=DEDUP_SPACE, settings={"dedup": False})
    done = subprocess.run(autotune_argv(*args), cwd=tmp_path, capture_output=True, text=True,
                          timeout=200)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    starts = dict(re.findall(r"trial (\d+)(?: \(baseline\))? \[\d+/4\] starts: (.+)$",
                             done.stdout, re.M))  # fmt: skip
    ends = dict(re.findall(r"trial (\d+) \[\d+/4\] [\w-]+: [^;]+; ([^;]+);", done.stdout, re.M))
    assert len(starts) == 4 and starts == ends, done.stdout
    assert any("max_num_batched_tokens=" in text and "*" in text for text in starts.values())
