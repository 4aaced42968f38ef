"""The tuner benchmark's pure helpers: paired noise, sampler seeds, the merged table."""

from __future__ import annotations

import importlib.util
import itertools
import json
import statistics
import sys
from pathlib import Path

import pytest

from autotune.replay.records import Percentiles

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_tuner.py"
_spec = importlib.util.spec_from_file_location("bench_tuner", SCRIPT)
assert _spec is not None and _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
sys.modules["bench_tuner"] = bench  # its dataclasses resolve their annotations there
_spec.loader.exec_module(bench)


def test_noise_is_keyed_by_truth_seed_config_and_measurement_not_by_strategy():
    first = bench.noise_factor("readme", 3, "config-a", 0)
    assert bench.noise_factor("readme", 3, "config-a", 0) == first  # any strategy, same draw
    others = {
        bench.noise_factor("readme", 3, "config-a", 1),  # its second measurement
        bench.noise_factor("readme", 3, "config-b", 0),
        bench.noise_factor("readme", 4, "config-a", 0),
        bench.noise_factor("readme (adverse)", 3, "config-a", 0),
    }
    assert first not in others and len(others) == 4


def test_noise_spread_is_the_stated_three_percent():
    draws = [bench.noise_factor("t", 0, f"c{i}", 0) for i in range(4000)]
    assert abs(statistics.fmean(draws) - 1.0) < 0.003
    assert abs(statistics.stdev(draws) - bench.NOISE) < 0.003


def test_sampler_seeds_differ_between_samplers_and_repeat_within_one():
    seeds = {bench.sampler_seed(name, 0) for name in ("random", "tpe", "gp", "guided")}
    assert len(seeds) == 4
    assert bench.sampler_seed("guided", 0) == bench.sampler_seed("guided", 0)
    assert bench.sampler_seed("guided", 0) != bench.sampler_seed("guided", 1)


def _prescreened(spec) -> list:
    """The lattice's configs that the study's memory pre-screen passes."""
    from autotune.tuner.lattice import enumerate_effective

    return [
        c
        for c in enumerate_effective(
            spec.space,
            model=spec.model,
            engine_version=spec.engine.version(),
            prescreen=spec.prescreen,
        )
        if c.memory is not None and c.memory.fits
    ]


def _record(strategy: str, seed: int, curve: list[float], launched_best: float) -> dict:
    log = bench.StudyLog(launches=len(curve), handed_over=curve, launched_best=launched_best)
    return bench.study_record("readme", strategy, seed, 100.0, log)


def test_table_reads_against_the_best_launched_config_when_it_beats_the_lattice(tmp_path):
    raw = tmp_path / "raw.jsonl"
    records = [
        _record("random", 0, [90.0, 100.0, 100.0], 100.0),
        _record("guided", 0, [102.0, 102.0, 102.0], 102.0),  # off the lattice, truly better
    ]
    raw.write_text("".join(json.dumps(r) + "\n" for r in records))
    rows = {row["strategy"]: row for row in bench.table([raw], budget=3)}
    assert rows["random"]["optimum_tok_s"] == 102.0
    assert rows["random"]["median_launches_to_99"] is None  # 100/102 < 0.99
    assert rows["random"]["median_launches_to_95"] == 2
    assert rows["guided"]["median_launches_to_99"] == 1
    assert rows["guided"]["winner_within_1pct_rate"] == 1.0


def test_the_within_1pct_rate_comes_with_its_count_and_a_95pct_interval(tmp_path):
    """17 of 20 and 9 of 10 are one seed apart: the table says how sure each rate is."""
    raw = tmp_path / "raw.jsonl"
    finals = [100.0] * 17 + [95.0] * 3
    records = [_record("guided", seed, [final], 100.0) for seed, final in enumerate(finals)]
    raw.write_text("".join(json.dumps(r) + "\n" for r in records))
    (row,) = bench.table([raw], budget=1)
    assert row["winners_within_1pct"] == 17 and row["seeds"] == 20
    low, high = row["winner_within_1pct_interval"]
    assert low < 0.7 and 0.9 < high < 1.0  # Wilson: 0.64-0.95, the goal's 0.9 inside it
    assert "within1% 85% (17/20, 95% CI 64%-95%; launched 20/20, oracle crown" in bench.format_row(
        row
    )


def test_the_table_splits_the_misses_between_the_search_and_the_crown(tmp_path):
    """A study that launched a config within 1% and crowned one below it missed by the
    crown; one that never launched one missed by the search."""
    raw = tmp_path / "raw.jsonl"
    records = [
        _record("guided", 0, [100.0], 100.0),  # crowned within 1%
        _record("guided", 1, [97.0], 99.5),  # launched 99.5, crowned 97: the crown's miss
        _record("guided", 2, [97.0], 97.0),  # never launched within 1%: the search's miss
    ]
    raw.write_text("".join(json.dumps(r) + "\n" for r in records))
    (row,) = bench.table([raw], budget=1)
    assert row["winners_within_1pct"] == 1 and row["launched_within_1pct"] == 2
    assert "(1/3, 95% CI" in bench.format_row(row) and "launched 2/3," in bench.format_row(row)


def test_the_oracle_crown_knows_the_drift_the_tails_and_what_is_feasible():
    """The oracle crown reads each launch through the bench's drift and noise law: a config
    measured late is not behind for the drift, one odd run does not bury a config measured
    often, and a config infeasible in truth is never handed over."""

    def log(launches: list[tuple[str, float, float]], *, drift: bool = True) -> bench.StudyLog:
        """Launches as (config, true value, measured before the drift), the drift applied."""
        return bench.StudyLog(
            launches=len(launches),
            launched=[digest for digest, _, _ in launches],
            launched_true=[true for _, true, _ in launches],
            launched_seen=[
                seen * (1.0 - bench.DRIFT_PER_LAUNCH * i if drift else 1.0)
                for i, (_, _, seen) in enumerate(launches)
            ],
        )

    late = log([("b", 98.0, 98.0), *[("x", 90.0, 90.0)] * 19, ("a", 100.0, 100.0)])
    assert bench.oracle_crown(late, harsh=True) == 100.0  # 96 at launch 20 is 100 at 0
    assert bench.oracle_crown(late, harsh=False) == 98.0  # the gentle bench has no drift
    odd = log([("a", 100.0, 100.0), ("b", 97.0, 97.0), ("a", 100.0, 75.0), ("a", 100.0, 100.0)])
    assert bench.oracle_crown(odd, harsh=True) == 100.0  # the mean of a's runs is 91.7
    infeasible = log([("a", 0.0, 120.0), ("b", 97.0, 97.0), ("c", 0.0, 0.0)], drift=False)
    assert bench.oracle_crown(infeasible, harsh=False) == 97.0
    assert bench.oracle_crown(log([("c", 0.0, 0.0)]), harsh=True) == 0.0


def test_the_handed_plateau_is_a_yardstick_the_noise_holds_below_certainty():
    """Handed configs all within 1%, any crown is; handed a plateau where a few configs
    stand 1% above many (l40s-cc's shape), measuring helps (the crown beats a pick at
    random) but the night's launches do not tell them apart nine times in ten; configs
    further than 2% from the best are not handed over."""
    level = bench.handed_plateau([100.0, 99.5, 99.2] * 4, 100.0, 30, harsh=True, nights=40)
    assert level["rate"] == 1.0 and level["configs"] == 12
    shape = [99.6] * 12 + [98.6] * 30 + [90.0] * 50
    plateau = bench.handed_plateau(shape, 99.6, 30, harsh=True, nights=120)
    assert (plateau["configs"], plateau["within_1pct"]) == (42, 12)
    assert 12 / 42 < plateau["rate"] < 0.9
    assert plateau["allocation"] in [list(s) for s in bench.plateau_schedules(29)]
    gentle = bench.handed_plateau(shape, 99.6, 30, harsh=False, nights=120)
    assert gentle["rate"] > 12 / 42  # the gentle bench's normal noise, read by its mean
    clear = bench.handed_plateau([100.0] + [98.1] * 5, 100.0, 30, harsh=True, nights=120)
    assert clear["rate"] > plateau["rate"]  # 1.9% apart is told apart more often than 1%


def test_the_plateau_is_drawn_from_every_config_known_feasible_in_truth(tmp_path):
    """The lattice's configs that fit in truth, the ones valued off it, and the ones the
    studies launched, each once; a lattice config that runs out of memory in truth is not
    among them whatever value was kept for it."""
    from autotune.tuner.lattice import config_key

    landscape = bench.LANDSCAPES["readme"]
    spec = bench.prepare(landscape, tmp_path, harsh=True)["spec"]
    oracle = bench.truth_of(landscape, spec, bench.truth_constants("readme", False))
    longest = max(r.prompt_tokens for r in spec.plan.requests)
    truth = bench.Truth(oracle, memory=bench.truth_memory("readme"), max_prompt_tokens=longest)
    passed = _prescreened(spec)
    surprise = next(c for c in passed if truth.oom(c.config) is not None)
    fits = [c for c in passed if truth.oom(c.config) is None][:3]
    assert all(c.key == config_key(c.config) for c in fits)
    truth.values.update({c.key: 50.0 + i for i, c in enumerate(fits)})
    truth.values[surprise.key] = 99.0  # valued, but it does not start in truth
    truth.values["off the lattice"] = 60.0
    launched = bench.StudyLog(
        launched=[bench.digest_of(fits[0].key), "refined", "failed"],
        launched_true=[50.0, 70.0, 0.0],
    )
    setup = {"candidates": [*fits, surprise]}
    assert sorted(bench.known_values(setup, truth, [launched])) == [50.0, 51.0, 52.0, 60.0, 70.0]


def test_a_table_reads_each_truth_back_from_its_label_or_says_why_it_cannot(tmp_path, monkeypatch):
    """``--table --plateau`` prepares each truth again from the label its studies were
    kept under: every landscape's, adverse or not, harsh or not, reads back the same; one
    whose data is absent says so under its rows."""
    for name, adverse, harsh in itertools.product(bench.LANDSCAPES, (False, True), (False, True)):
        label = bench.label_of(name, adverse=adverse, harsh=harsh)
        assert bench.parse_label(label) == (name, adverse, harsh)
    monkeypatch.setattr(bench, "SHARED_DATA", tmp_path / "nowhere")
    raw = tmp_path / "raw.jsonl"
    record = _record("default", 0, [30.0], 30.0) | {"landscape": "cc-traces-24g [harsh]"}
    raw.write_text(json.dumps(record) + "\n")
    (plateau,) = bench.table_plateaus([raw], 30, {}).values()
    assert "nowhere/claude-code-traces absent" in bench.format_plateau(plateau)


def test_a_variant_s_studies_stand_beside_the_default_s_against_one_optimum(tmp_path):
    default, variant = tmp_path / "default.jsonl", tmp_path / "variant.jsonl"
    log = bench.StudyLog(launches=2, handed_over=[95.0, 99.5], launched_best=99.5)
    better = bench.StudyLog(launches=2, handed_over=[101.0, 101.0], launched_best=101.0)
    default.write_text(json.dumps(bench.study_record("readme", "default", 0, 100.0, log)) + "\n")
    record = bench.study_record("readme", "default", 0, 100.0, better, variant="threshold 3%")
    variant.write_text(json.dumps(record) + "\n")
    rows = {row["strategy"]: row for row in bench.table([default, variant], budget=2)}
    assert set(rows) == {"default", "default [threshold 3%]"}
    assert rows["default"]["optimum_tok_s"] == 101.0  # the variant's launch sets the optimum
    assert rows["default"]["winner_within_1pct_rate"] == 0.0  # 99.5 / 101 < 0.99
    assert rows["default [threshold 3%]"]["winner_within_1pct_rate"] == 1.0


def test_the_misled_landscape_s_optimum_is_not_where_the_tuner_s_simulator_puts_it(tmp_path):
    """readme-misled: on a slice of its lattice (every MTP depth, LMCache on and off, four KV
    sizes, fp16 KV, one batch limit), the truth's best is not in the simulator's top 5 and
    has fewer draft tokens; what the simulator picks is 5% or more below it in truth."""
    landscape = bench.LANDSCAPES["readme-misled"]
    spec = bench.prepare(landscape, tmp_path)["spec"]
    truth = bench.truth_of(landscape, spec, bench.truth_constants("readme-misled", False))
    space = spec.space
    points = [
        {"mtp_k": k, "lmcache": lmcache, "kv_cache_memory_gib": kv}
        for k in range(4)
        for lmcache in (False, True)
        for kv in (6.0, 7.0, 8.0, 9.0)
    ]
    fixed = {"kv_cache_dtype": "auto", "max_num_seqs": 16, "max_num_batched_tokens": 1024}
    configs = [
        bench.derive_config(
            space,
            space.baseline_params() | fixed | point,
            model=spec.model,
            engine_version=spec.engine.version(),
            prescreen=spec.prescreen,
        )
        for point in points
    ]

    def value(oracle, config) -> float:
        scored = oracle.score(config)
        return scored.values[0] if scored is not None and scored.feasible else 0.0

    predicted = [value(spec.oracle, c) for c in configs]
    true = [value(truth, c) for c in configs]
    ranking = sorted(range(len(configs)), key=lambda i: -predicted[i])
    best = max(range(len(configs)), key=lambda i: true[i])
    assert ranking.index(best) >= 5
    assert 0 < points[best]["mtp_k"] < points[ranking[0]]["mtp_k"]
    assert true[ranking[0]] < 0.95 * true[best]


def test_studies_run_in_parallel_log_what_the_serial_run_logs(tmp_path):
    """--jobs: the forked studies are the serial ones (seeded sampler, paired noise), in
    seed order, so a parallel benchmark's figures are the serial benchmark's."""
    landscape = bench.LANDSCAPES["readme"]
    setup = bench.prepare(landscape, tmp_path)
    spec = setup["spec"]
    truth = bench.Truth(bench.truth_of(landscape, spec, bench.truth_constants("readme", False)))
    job = ("readme", setup, truth, 80.0, "random", 4, True)
    serial = list(bench.studies(job, range(3), 1))
    parallel = list(bench.studies(job, range(3), 2))
    assert [log.launches for log in serial] == [4, 4, 4]
    assert len({json.dumps(log.measured, sort_keys=True) for log in serial}) == 3
    assert parallel == serial


def test_the_trace_shows_each_launch_s_flags_true_value_and_measurement(tmp_path):
    """--trace: why a crown fell back, launch by launch, from the --raw file alone."""
    landscape = bench.LANDSCAPES["readme"]
    setup = bench.prepare(landscape, tmp_path)
    truth = bench.Truth(
        bench.truth_of(landscape, setup["spec"], bench.truth_constants("readme", False))
    )
    (log,) = bench.studies(("readme", setup, truth, 80.0, "random", 3, True), range(1), 1)
    raw = tmp_path / "raw.jsonl"
    raw.write_text(json.dumps(bench.study_record("readme", "random", 4, 80.0, log)) + "\n")
    header, *launches = bench.trace([raw])
    best = max(80.0, log.launched_best)
    assert header.startswith("readme random seed 4: crowned ")
    assert f"best launched {log.launched_best / best:.3f}" in header
    assert len(launches) == log.launches == 3
    shared = set.intersection(*map(bench._flag_items, log.flags.values()))
    assert ("language-model-only", "true") in shared and len(log.flags) > 1
    for line, digest, true in zip(launches, log.launched, log.launched_true, strict=True):
        assert f"true {true / best:.3f}" in line
        own = {k: v for k, v in log.flags[digest].items() if bench._flag_item(k, v) not in shared}
        argv = bench.TrialConfig(model="", flags=own).vllm_args()[1:]
        assert argv and line.endswith(" ".join(argv))  # what sets it apart, not what all share
        assert "--language-model-only" not in line
    assert bench.trace([raw], seeds=[5]) == []  # another study's seed: nothing
    old = {k: v for k, v in json.loads(raw.read_text()).items() if k != "flags"}
    raw.write_text(json.dumps(old) + "\n")  # a raw written before flags were kept
    assert bench.trace([raw])[1].endswith(log.launched[0])
    argv_kept = {**old, "flags": {d: ["--max-num-seqs", "8"] for d in log.launched}}
    raw.write_text(json.dumps(argv_kept) + "\n")  # flags kept as argv lists, for a while
    assert bench.trace([raw])[1].endswith(log.launched[0])


def test_the_harsh_noise_has_heavy_tails_of_the_same_spread():
    """Student-t and outliers: far more draws past 4 spreads than a normal's 6 in 100,000."""
    draws = [bench.noise_factor("t", 0, f"c{i}", 0, harsh=True) for i in range(4000)]
    assert abs(statistics.median(draws) - 1.0) < 0.003
    assert sum(abs(d - 1.0) > 4 * bench.NOISE for d in draws) >= 20


def test_the_harsh_bench_noises_every_figure_each_with_its_own_draw():
    latency = Percentiles(mean=1.0, p50=1.0, p90=2.0, p95=3.0, p99=4.0)
    stats = bench.ReplayStats(
        duration_s=60.0,
        completed=10,
        failed=0,
        total_input_tokens=1000,
        total_output_tokens=500,
        request_throughput_rps=1.0,
        output_throughput_tok_s=50.0,
        total_token_throughput_tok_s=150.0,
        goodput_rps=1.0,
        **{name: latency for name in ("ttft", "tpot", "itl", "e2e")},
    )
    server = bench.ServerStats(
        spec_decode_drafts=100, spec_decode_draft_tokens=300, spec_decode_accepted_tokens=200
    )

    def draw(figure: str) -> float:
        return bench.noise_factor("readme", 0, "config-a", 0, figure=figure, harsh=True)

    noised = bench.noised_stats(stats, draw, 0.0)
    factors = {
        "throughput": noised.output_throughput_tok_s / stats.output_throughput_tok_s,
        **{name: getattr(noised, name).p95 / 3.0 for name in ("ttft", "tpot", "itl", "e2e")},
    }
    assert all(factor != 1.0 for factor in factors.values())
    assert len(set(factors.values())) == len(factors)
    assert noised.goodput_rps != stats.goodput_rps
    accepted = bench.noised_server_stats(server, draw).spec_decode_accepted_tokens
    assert accepted is not None and accepted != 200
    drifted = bench.noised_stats(stats, draw, 0.1)
    assert drifted.output_throughput_tok_s < noised.output_throughput_tok_s
    assert drifted.ttft.p95 > noised.ttft.p95


def test_the_harsh_bench_noises_each_draft_position_s_acceptance():
    """Recalibration learns from the per-position counters: they draw their own noise
    (before, one MTP launch handed over the truth's acceptance exactly), deeper positions
    never above shallower ones, and the totals follow them."""
    truth = (0.9, 0.7, 0.4)
    server = bench.ServerStats(
        spec_decode_drafts=1000,
        spec_decode_draft_tokens=3000,
        spec_decode_accepted_tokens=2000,
        spec_decode_acceptance_per_position=truth,
    )
    for seed in range(20):

        def draw(figure: str, seed: int = seed) -> float:
            return bench.noise_factor("readme", seed, "mtp", 0, figure=figure, harsh=True)

        noised = bench.noised_server_stats(server, draw)
        shares = noised.spec_decode_acceptance_per_position
        assert shares is not None and len(shares) == 3
        assert all(a != b for a, b in zip(shares, truth, strict=True))
        assert all(deeper <= shallower for shallower, deeper in itertools.pairwise(shares))
        assert noised.spec_decode_accepted_tokens == round(sum(shares) * 1000)
        assert abs(noised.spec_decode_mean_acceptance_length - 1 - sum(shares)) < 1e-3


def test_the_harsh_truth_ooms_where_the_pre_screen_said_the_config_fits(tmp_path):
    """The truth's memory is a few percent off the model's: some configs the pre-screen
    passes do not start (or die on the load's longest prefill) in truth, and none do
    without the perturbation."""
    landscape = bench.LANDSCAPES["readme"]
    spec = bench.prepare(landscape, tmp_path, harsh=True)["spec"]
    oracle = bench.truth_of(landscape, spec, bench.truth_constants("readme", False))
    longest = max(r.prompt_tokens for r in spec.plan.requests)
    harsh = bench.Truth(oracle, memory=bench.truth_memory("readme"), max_prompt_tokens=longest)
    gentle = bench.Truth(oracle, max_prompt_tokens=longest)
    passed = [c.config for c in _prescreened(spec)]
    surprises = [config for config in passed if harsh.oom(config) is not None]
    assert surprises and len(surprises) < len(passed) / 2
    assert all(gentle.oom(config) is None for config in passed[:50])
    assert harsh.value(surprises[0]) is None  # infeasible in truth: never the optimum


def test_the_default_memory_plan_is_the_unperturbed_one():
    from autotune.sim.model.config import SimConfig
    from autotune.sim.model.memory import MemoryPerturbation, plan_memory

    config = SimConfig(model="qwen3.6-27b-awq", hardware="rtx4080s-32g")
    assert plan_memory(config) == plan_memory(config, perturbation=MemoryPerturbation())
    bigger = plan_memory(config, perturbation=MemoryPerturbation(activation=1.05, cudagraph=1.1))
    assert bigger.peak_activation_bytes > plan_memory(config).peak_activation_bytes
    assert bigger.cudagraph_bytes > plan_memory(config).cudagraph_bytes


def test_a_study_s_guide_holds_what_its_warm_start_replays(tmp_path):
    """The bench hands a study the replays `autotune run`'s warm start makes (the two tiers'
    short list and climb, the same on any machine), taken from the lattice's, and keeps
    off-lattice entries; the study's own warm start screens the rest."""
    from autotune.tuner.lattice import enumerate_effective
    from autotune.tuner.two_tier import predict_two_tier

    spec = bench.prepare(bench.LANDSCAPES["readme"], tmp_path)["spec"]
    version = spec.engine.version()
    lattice = [
        c
        for c in enumerate_effective(
            spec.space, model=spec.model, engine_version=version, prescreen=spec.prescreen
        )
        if c.memory is None or c.memory.fits
    ][:300]
    settings = bench.STRATEGIES["default"][1]
    cache = {c.key: f"prediction of {c.key}" for c in lattice} | {"off-lattice": "refined"}
    setup = {"cache": cache, "candidates": lattice, "spec": spec}
    held = bench.warm_started(setup, settings)
    replays: dict = {}
    predict_two_tier(spec.oracle, lattice, replays, maximize=True)
    assert set(held) == set(replays) | {"off-lattice"}
    assert 0 < len(replays) < len(lattice)
    assert all(held[key] == cache[key] for key in replays)  # the lattice's own replays


def test_the_memory_edge_landscape_reads_the_real_traces_or_says_where_they_are_not(
    tmp_path, monkeypatch
):
    """Eight real Claude Code sessions up to 32k tokens, read where the data lives (never
    copied into the repo); absent, a ``MissingData`` naming the folder and the variable,
    which the bench prints as a skipped landscape."""
    from autotune.workload.io import read_workload
    from autotune.workload.slice import measure
    from autotune.workload.tokenizer import WordTokenizer

    write = bench.LANDSCAPES["cc-traces-24g"].workload
    if (bench.SHARED_DATA / "claude-code-traces").is_dir():
        workload = read_workload(write(tmp_path))
        sessions = {r.session for r in workload.requests}
        sizes = measure(workload, WordTokenizer())
        assert len(sessions) == 8
        assert max(sizes[r.id].prompt_tokens + r.output.tokens for r in workload.requests) <= 32_000
    monkeypatch.setattr(bench, "SHARED_DATA", tmp_path / "nowhere")
    with pytest.raises(bench.MissingData, match=r"nowhere/claude-code-traces absent.*AUTOTUNE"):
        write(tmp_path)


def test_a_shifted_truth_is_the_catalog_s_constants_moved_in_its_directions_alone():
    """The memory-edge truth: compute slower, MTP accepted more often, memory dearer by
    one factor, every other constant the simulator's own (no seeded draw)."""
    from autotune.catalog.models import get_model
    from autotune.sim.model.speed_constants import DEFAULT_CONSTANTS

    shift = bench.LANDSCAPES["cc-traces-24g"].shift
    truth = bench.truth_constants("cc-traces-24g", False)
    for name, value in DEFAULT_CONSTANTS.model_dump().items():
        if name in ("compute_efficiency", "prefill_compute_efficiency"):
            assert getattr(truth, name) == pytest.approx(value * shift.compute)
            assert shift.compute < 1
        elif name != "mtp_acceptance":
            assert getattr(truth, name) == value
    catalog = get_model("qwen3.6-27b-awq").default_mtp_acceptance
    assert all(t > c or t == 0.98 for t, c in zip(truth.mtp_acceptance, catalog, strict=True))
    memory = bench.truth_memory("cc-traces-24g")
    assert {memory.activation, memory.cudagraph, memory.non_torch, memory.per_seq} == {1.04}
