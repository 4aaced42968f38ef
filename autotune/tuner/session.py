"""The tuner's hooks into a study: guide, seeds, no repeated launches, confirmation, crown.

``autotune.study`` creates one ``Tuner`` per run. Its ``wrap`` puts a
``ScheduledSampler`` around the study's sampler, through which the tuner
chooses the warm-start seeds (right after the baseline) and the re-measurements
(the last ``confirm`` trials of the budget, and any earlier trial where a
re-measurement is worth more than a new config: ``confirm.race``), and in the
tail the measured leaders' neighbours off the lattice (``local``), without
enqueueing anything; ``twin`` (before launching) and ``record`` (after) keep the index of
measured launches; ``store_crown`` crowns (after every measured trial, so the live
display and a killed study quote the crown the run would end with). Each technique has its switch in
``TunerSettings`` (``tuner.settings``, docs/tuner.md).
"""

from __future__ import annotations

import math
import time
import warnings
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.config.space import SearchSpace
from autotune.trial.record import TrialRecord
from autotune.trial.run import MemoryEstimate, Prescreen
from autotune.tuner.acceptance import Recalibration
from autotune.tuner.backoff import MemoryBackoff
from autotune.tuner.confirm import (
    NEIGHBOUR_SD,
    Belief,
    beliefs,
    confirmation_targets,
    crown,
    disputed,
    duel,
    exploration_gain,
    race,
    tie_group,
)
from autotune.tuner.drift import fit
from autotune.tuner.edge import EdgeSearch
from autotune.tuner.guide import Guide, PredictionCache, build_guide
from autotune.tuner.lattice import Candidate
from autotune.tuner.local import LocalSearch
from autotune.tuner.measured import Measured, MeasuredIndex
from autotune.tuner.predictor import SimOracle
from autotune.tuner.record import TunerStudyRecord, WarmStartSummary, Winner
from autotune.tuner.refine import Refiner
from autotune.tuner.sampler import GuidedSampler
from autotune.tuner.schedule import Role, ScheduledSampler
from autotune.tuner.settings import TunerSettings

PENDING_POLL_S = 1.0  # how often a worker looks whether another's measurement has landed
TIMED_CONFIRM = 3  # re-measurements after a timed run's time is up (it raced before)
SEARCHED = 2  # guided configs launched after the seeds before the racing tail may begin
PARALLEL_TARGETS = 3  # workers in the tail together re-measure among this many top configs
# After a recalibration, a seed not launched yet predicted this far below the best is
# replaced (a seed within it is still a contender: the simulator's MTP predictions spread
# by 2-4% between nearby acceptances).
RESEED_MARGIN = 0.05


class Tuner:
    """See the module docstring."""

    def __init__(
        self,
        settings: TunerSettings,
        *,
        space: SearchSpace,
        model: str,
        engine_version: str | None,
        prescreen: Prescreen | None,
        oracle: SimOracle | None,
        maximize: bool,
        guided: bool,
        n_trials: int | None = None,
        seed: int | None = None,
        cache: PredictionCache | None = None,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.settings = settings
        self.maximize = maximize
        self.n_trials = n_trials
        self.closing = False  # a timed run's confirmation phase (no trial budget)
        self.index = MeasuredIndex()
        self._key_of: Callable[[dict[str, Any]], str] | None = None
        self.guide: Guide | None = None
        self.sampler: GuidedSampler | None = None
        self.distributions = space.distributions(engine_version)
        self.scheduled: ScheduledSampler | None = None
        self._seeds: list[Candidate] = []
        self._proposed: set[str] = set()  # seed keys handed to a trial by this process
        self.refiner: Refiner | None = None
        self.local: LocalSearch | None = None
        self.edges: EdgeSearch | None = None  # retreats of the memory edges after an OOM
        self._refined_at = 0  # measured configs when the guide was last refined
        self.recalibration: Recalibration | None = None
        self.backoff = MemoryBackoff()  # learned from OOM launches (``tuner.backoff``)
        self._say = say or (lambda _: None)
        cache = {} if cache is None else cache
        if guided and oracle is not None:
            self.guide = build_guide(
                space,
                model=model,
                engine_version=engine_version,
                prescreen=prescreen,
                oracle=oracle,
                maximize=maximize,
                cache=cache,
                budget_s=settings.warm_start_budget_s,
                shortlist=settings.warm_start_configs,
                say=say,
            )
            self.guide.backoff = self.backoff
            self.sampler = GuidedSampler(
                self.guide,
                self.index,
                self.distributions,
                maximize=maximize,
                learn=settings.learn,
                seed=seed,
            )
            if settings.refine or settings.local_search > 0 or settings.edge_search:
                self.refiner = Refiner(
                    space,
                    model=model,
                    engine_version=engine_version,
                    prescreen=prescreen,
                    oracle=oracle,
                    maximize=maximize,
                    cache=cache,
                    backoff=self.backoff,
                )
            if settings.warm_start > 0:
                self._seeds = self.guide.diverse_top(settings.warm_start)
            # Racing keeps at least three quarters of the tail.
            share = min(settings.local_search, self.confirm_slots // 4)
            if share > 0 and self.refiner is not None:
                self.local = LocalSearch(self.refiner, share)
            if settings.edge_search and settings.backoff and self.refiner is not None:
                self.edges = EdgeSearch(self.refiner)
            if settings.recalibrate:
                self.recalibration = Recalibration(oracle, cache, speed=settings.recalibrate_speed)

    def recalibrate(self) -> bool:
        """Re-predict the guide's MTP configs when the acceptance measured so far moved
        (``tuner.acceptance``), every config when the card's speed was fitted anew
        (``tuner.speed``); the refiner predicts with the recalibrated simulator too.
        Seeds already chosen stay; what the sampler picks next uses the new ranking."""
        found, guide = self.recalibration, self.guide
        if found is None or guide is None or not found.update(guide, self.maximize):
            return False
        # The learned residual compares each measurement with its config's prediction: a
        # launched config the update left to the screen is replayed (the screen ranks; its
        # error on one config, off the lattice, reached a factor of 3 on cc-traces-24g).
        guide.settle([guide.by_key[key] for key in self.index.by_key if key in guide.by_key])
        if self.refiner is not None:
            self.refiner.use(found.oracle, found.cache)
        if self.settings.reseed:
            self._reseed()
        self._say(found.describe())
        return True

    def _reseed(self) -> None:
        """Seeds not proposed yet that the recalibrated simulator now predicts more than
        ``RESEED_MARGIN`` below its best are replaced by the best configs of its ranking."""
        guide = self.guide
        assert guide is not None
        taken = self.index.by_key.keys() | self.index.pending | self._proposed
        floor = float(np.nanmax(guide.utility)) + math.log(1.0 - RESEED_MARGIN)
        stale = {
            seed.key
            for seed in self._seeds
            if seed.key not in taken and not guide.utility[guide.by_key[seed.key]] >= floor
        }
        if not stale:
            return
        kept = [seed for seed in self._seeds if seed.key not in stale]
        tried = guide.ruled_out(set(taken) | {seed.key for seed in kept})
        exclude = {c.key for c, known in zip(guide.candidates, tried, strict=True) if known}
        self._seeds = kept + guide.diverse_top(len(stale), exclude=exclude)

    def refine(self) -> int:
        """Add off-lattice configs near the best estimates by the simulator and the
        residual learned so far (``tuner.refine``); how many were added."""
        refiner, guide, sampler = self.refiner, self.guide, self.sampler
        if not self.settings.refine or refiner is None or guide is None or sampler is None:
            return 0
        residual = sampler.residual_model()
        return 0 if residual is None else refiner.refine(guide, residual).added

    def wrap(self, base: optuna.samplers.BaseSampler) -> ScheduledSampler:
        """The study's sampler: ``base``, with the tuner choosing seeds and confirmations."""
        self.scheduled = ScheduledSampler(base, self, self.distributions)
        return self.scheduled

    @property
    def confirm_slots(self) -> int:
        """Trials at the end of the budget kept for re-measurements: at most half of it, or
        with the guide's warm start, all but the baseline, the seeds and ``SEARCHED`` more."""
        if self.n_trials is None:
            return min(self.settings.confirm, TIMED_CONFIRM)
        most = (self.n_trials - 1) // 2
        if self.sampler is not None and self._seeds:
            most = max(most, self.n_trials - 1 - len(self._seeds) - SEARCHED)
        return max(0, min(self.settings.confirm, most))

    def next_role(self, study: optuna.Study, trial: FrozenTrial) -> Role | None:
        """What the new ``trial`` launches, if the tuner decides it (see the module docstring)."""
        self.sync(study)  # what other workers measured or are launching
        self.recalibrate()
        if self.settings.learn and len(self.index.by_key) > self._refined_at:
            self._refined_at = len(self.index.by_key)
            self.refine()
        if self._in_tail(study) and not self._promising():
            role = self._neighbour()
            if role is not None:
                return role
            running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            role = self._confirmation(sum(t.number < trial.number for t in running))
            if role is not None:
                return role
        return (
            self._overtaking()
            or self._next_seed()
            or self._recheck()
            or self._race_early(study, trial)
        )

    def _overtaking(self) -> Role | None:
        """Once a seed is measured, a config not launched yet (often one refinement added
        off the lattice) whose corrected estimate is above every seed left goes before
        them; the seeds keep their order (launching the best-estimated seed first instead
        lost crowns on the README landscape: docs/measurements/history.md)."""
        sampler = self.sampler
        if not self.settings.overtake or sampler is None or not self._seeds:
            return None
        taken = self.index.by_key.keys() | self.index.pending | self._proposed
        waiting = [seed for seed in self._seeds if seed.key not in taken]
        if not waiting or not any(seed.key in self.index.by_key for seed in self._seeds):
            return None
        guide = sampler.guide
        while True:  # a config the screen alone scored is replayed before it overtakes
            mean, _ = sampler.estimates()
            tried = guide.ruled_out(set(taken))
            masked = np.where(tried | ~np.isfinite(mean), -np.inf, mean)
            best = int(np.argmax(masked))
            if not masked[best] > max(mean[guide.by_key[seed.key]] for seed in waiting):
                return None
            if not guide.settle([best]):
                break
        candidate = guide.candidates[best]
        self._proposed.add(candidate.key)
        return Role(dict(candidate.params))

    def _promising(self) -> bool:
        """Whether the simulator plus the learned residual expects an unmeasured config to
        beat the leader (then the tail still explores; ``explore_tail``)."""
        if not self.settings.explore_tail or self.sampler is None:
            return False
        leader = self.crowned()
        if leader is None:
            return False
        mean, _ = self.sampler.estimates()
        tried = self.sampler.guide.ruled_out(set(self.index.by_key) | self.index.pending)
        best = np.where(tried | ~np.isfinite(mean), -np.inf, mean).max(initial=-np.inf)
        return bool(best > fit(self.index, maximize=self.maximize).level[leader.key])

    def _neighbour(self) -> Role | None:
        """An untried neighbour of the measured leaders off the lattice (``tuner.local``),
        when its launch is worth more to the crown than the best re-measurement."""
        if self.local is None:
            return None
        found = beliefs(self.index, maximize=self.maximize, prior=False)
        leaders = sorted(
            (self.index.by_key[key] for key in found), key=lambda e: -found[e.key].mean
        )
        proposal = self.local.propose(self.index, self.crowned(), leaders)
        if proposal is None:
            return None
        point, centre = proposal
        home = found[centre.key]
        shift, shift_var = self.local.prior(point, centre)
        guess = Belief(home.mean + shift, home.var + NEIGHBOUR_SD**2 + shift_var)
        order = [found[entry.key] for entry in leaders]
        launch = guess.gain(order[0].mean, crownable=False)
        if len(order) > 1 and launch <= max(
            b.gain(order[1].mean if b is order[0] else order[0].mean) for b in order
        ):
            return None  # re-measuring is worth more
        return Role(self.local.take(point, centre), neighbour_of=centre.first_trial)

    def _race_early(self, study: optuna.Study, trial: FrozenTrial) -> Role | None:
        """A re-measurement before the tail, when the crown's expected gain from it beats
        that of the guided sampler's best unmeasured config (see ``confirm``)."""
        settings = self.settings
        if not (settings.race and settings.race_early and settings.confirm) or self.sampler is None:
            return None
        running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if [t.number for t in running] != [trial.number]:
            return None  # other workers are launching: leave re-measuring to the tail
        found = beliefs(
            self.index,
            maximize=self.maximize,
            sampler=self.sampler,
            prior=self.settings.crown_prior,
        )
        pick = race(
            self.index,
            maximize=self.maximize,
            sampler=self.sampler,
            prior=self.settings.crown_prior,
        )
        settled = disputed(self.index, maximize=self.maximize)
        if settled is not None:
            return Role(dict(settled.params), confirms=settled.first_trial)
        if pick is None or len(found) < 2:
            return None
        order = sorted(found.values(), key=lambda b: -b.mean)
        leader = order[0].mean
        best_other = order[1].mean if found[pick.key] is order[0] else leader
        if found[pick.key].gain(best_other) <= exploration_gain(
            self.index, self.sampler, leader, maximize=self.maximize
        ):
            return None
        return Role(dict(pick.params), confirms=pick.first_trial)

    def _recheck(self) -> Role | None:
        """A re-measurement of the leader when it was measured once (one lucky run is
        not enough to lead the search or be handed over)."""
        if not self.settings.recheck:
            return None
        leader = self.crowned()
        if leader is None or len(leader.samples) > 1:
            return None
        return Role(dict(leader.params), confirms=leader.first_trial)

    def nothing_to_propose(self, study: optuna.Study) -> bool:
        """Whether the guided sampler has nothing left to propose outside the tail: the
        next trial is its random fallback's draw, most often answered without a launch (a
        duplicate, a predicted OOM). The budget then waits for other workers' trials
        rather than spend a slot while they measure (``study/budget.py``)."""
        if self.sampler is None or self.closing:
            return False
        self.sync(study)
        return not self._in_tail(study, asking=False) and self.sampler.exhausted()

    def _in_tail(self, study: optuna.Study, *, asking: bool = True) -> bool:
        """Whether the budget left is the re-measurements' (``asking``: from a trial that
        is running itself, else before one is created)."""
        if self.closing:
            return True
        if self.n_trials is None or self.confirm_slots == 0:
            return False
        done_states = (TrialState.COMPLETE, TrialState.PRUNED)  # what --trials counts
        trials = study.get_trials(deepcopy=False, states=(*done_states, TrialState.RUNNING))
        complete = sum(t.state in done_states for t in trials)
        others_running = max(0, len(trials) - complete - (1 if asking else 0))
        return self.n_trials - complete - others_running <= self.confirm_slots

    def _confirmation(self, ahead: int = 0) -> Role | None:
        """The leader or its closest challenger (``duel``) when no other worker is ahead in
        the tail, else the top candidate measured least often (best first among equals;
        with ``ahead`` trials of other workers started before this one, the next among
        equals, so that workers reaching the tail together re-measure different configs)."""
        settled = disputed(self.index, maximize=self.maximize)
        if settled is not None:
            return Role(dict(settled.params), confirms=settled.first_trial)
        pick = race if self.settings.race else duel
        contested = pick(
            self.index,
            maximize=self.maximize,
            sampler=self.sampler,
            prior=self.settings.crown_prior,
        )
        if (
            ahead == 0
            and contested is not None
            and not self.index.confirming[contested.first_trial]
        ):
            return Role(dict(contested.params), confirms=contested.first_trial)
        targets = confirmation_targets(
            self.index,
            min(self.settings.confirm, PARALLEL_TARGETS),
            maximize=self.maximize,
            sampler=self.sampler,
            prior=self.settings.crown_prior,
        )
        if not targets:
            return None
        counts = [len(e.samples) + self.index.confirming[e.first_trial] for e in targets]
        least = [entry for entry, n in zip(targets, counts, strict=True) if n == min(counts)]
        entry = least[ahead % len(least)]
        return Role(dict(entry.params), confirms=entry.first_trial)

    def _next_seed(self) -> Role | None:
        """The next warm-start seed not launched yet, nor alike a launched or proposed
        config (an overtaking config, say, a twin of a seed one categorical apart: fp8
        e4m3 beside e5m2 would measure the same behaviour twice)."""
        for rank, candidate in enumerate(self._seeds, start=1):
            taken = self.index.by_key.keys() | self.index.pending | self._proposed
            if candidate.key in taken or self.backoff.presumes_oom(candidate.memory):
                continue
            if self._alike_any(candidate, taken):
                continue
            self._proposed.add(candidate.key)
            return Role(dict(candidate.params), warm_start=rank)
        return None

    def _alike_any(self, candidate: Candidate, keys: set[str]) -> bool:
        """Whether the guide predicts ``candidate`` to behave like one of ``keys``."""
        guide = self.guide
        if guide is None or candidate.key not in guide.by_key:
            return False
        return bool(guide.equivalent_to(keys)[guide.by_key[candidate.key]])

    def role_of(self, number: int) -> Role | None:
        """The role the tuner gave trial ``number`` (None: enqueued or the sampler's pick)."""
        return self.scheduled.roles.get(number) if self.scheduled is not None else None

    def describe_warm_start(self, study: optuna.Study) -> None:
        """Store what the warm start knows and what this run predicted of it (a study attr),
        when there is one."""
        guide = self.guide
        if guide is None or not self._seeds:
            return
        summary = WarmStartSummary(
            effective_configs=len(guide.candidates),
            predicted_feasible=guide.predicted,
            seconds=round(guide.seconds, 1),
            seeds=len(self._seeds),
            predicted_configs=len(guide.candidates),
            predicted_now=guide.replayed_now,
            replayed_configs=guide.replayed,
            safety_stop_s=guide.budget_s if guide.stopped else None,
        )
        TunerStudyRecord(warm_start=summary).write(study)

    def rebuild(self, study: optuna.Study, key_of: Callable[[dict[str, Any]], str]) -> None:
        """Fill the index from a resumed study's COMPLETE trials."""
        self._key_of = key_of
        self.sync(study)

    def sync(self, study: optuna.Study, *, current: int | None = None) -> None:
        """Add COMPLETE trials not indexed yet (other workers' too); the configs of RUNNING
        ones are pending, so two workers never launch one config at once. With ``current``
        only earlier trials count: of two trials of one config, the earlier one launches."""
        if self._key_of is None:
            return
        states = (TrialState.COMPLETE, TrialState.RUNNING)
        pending, confirming = set(), Counter()
        for trial in study.get_trials(deepcopy=False, states=states):
            if trial.state == TrialState.COMPLETE:
                duplicate = TrialRecord.read(trial.user_attrs).duplicate_of is not None
                if trial.number not in self.index.seen and not duplicate:
                    self.record(trial, self._key_of(trial.params), trial.values, trial.constraints)
                continue
            # An enqueued trial's params are known before it suggests them.
            params = trial.params or trial.system_attrs.get("fixed_params")
            later = current is not None and trial.number >= current
            if "confirms" in trial.user_attrs:
                confirming[trial.user_attrs["confirms"]] += 1
            if later or not params or "confirms" in trial.user_attrs:
                continue
            try:
                pending.add(self._key_of(params))
            except Exception:  # its params are still being suggested: not a config yet
                continue
        self.index.pending = pending
        self.index.confirming = confirming

    def twin(self, key: str, role: Role | None, trial: optuna.Trial) -> Measured | None:
        """The earlier measurement of this launch, unless dedup is off or this re-measures.

        When another worker is measuring it now, wait for its answer rather than launch it
        twice (it takes as long); a dead worker's trial stops being pending once stale.
        """
        if not self.settings.dedup or (role is not None and role.confirms is not None):
            return None
        self.sync(trial.study, current=trial.number)
        while key in self.index.pending and key not in self.index.by_key:
            time.sleep(PENDING_POLL_S)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                optuna.storages.fail_stale_trials(trial.study)
            self.sync(trial.study, current=trial.number)
        return self.index.get(key)

    def record(
        self,
        trial: FrozenTrial | optuna.Trial,
        key: str,
        values: list[float] | None,
        constraints: dict[str, float],
    ) -> None:
        measured = bool(trial.user_attrs.get("measured")) and values is not None
        stored = TrialRecord.read(trial.user_attrs)
        ran = measured and stored.failure is None and not _stopped_early(stored)
        if measured and self.recalibration is not None:
            self.recalibration.observe(
                trial.number,
                stored.server_stats,
                stored.config if ran else None,
                stored.replay if ran else None,
            )
        oom = stored.failure is not None and stored.failure.failure_class.is_oom
        if oom and self.settings.backoff:
            self._back_off(key, dict(trial.params))
        memory = self._memory_of(key, dict(trial.params)) if ran and self.settings.backoff else None
        if memory is not None:
            self.backoff.learn_ran(memory)
        self.index.add(
            key,
            params=dict(trial.params),
            trial=trial.number,
            values=values,
            constraints=constraints,
            measured=measured,
            centre=stored.neighbour_of,
        )

    def _back_off(self, key: str, params: dict[str, Any]) -> None:
        """A launch of ``key`` ran out of memory: configs predicted to leave less headroom
        than it (and ``backoff.BACKOFF``) are not proposed from now on."""
        memory = self._memory_of(key, params)
        if memory is not None and self.backoff.learn(memory.margin):
            self._say(self.backoff.describe())
            self._retreat_edges()

    def _memory_of(self, key: str, params: dict[str, Any]) -> MemoryEstimate | None:
        """The memory model's estimate for a launched config (None without a guide)."""
        if self.guide is None:
            return None
        found = self.guide.by_key.get(key)
        if found is not None:
            return self.guide.candidates[found].memory
        # off the lattice: a refinement or a neighbour
        point = self.refiner.candidate(params) if self.refiner is not None else None
        return None if point is None else point.memory

    def _retreat_edges(self) -> None:
        """The best memory edges the back-off now rules out retreat to the largest chunk
        and KV pool it allows (``tuner.edge``), where the simulator rates that higher."""
        if self.edges is None or self.sampler is None or self.guide is None:
            return
        mean, _ = self.sampler.estimates()
        added = self.edges.retreat(self.guide, mean)
        if added:
            self._say(f"{added} memory edges moved below the back-off's edge")

    def crowned(self) -> Measured | None:
        """The config the tuner would hand over now."""
        return crown(
            self.index,
            maximize=self.maximize,
            sampler=self.sampler,
            prior=self.settings.crown_prior,
        )

    def store_crown(self, study: optuna.Study) -> Measured | None:
        """Crown the best estimate, or the config tied with it that needs least, and store
        it (study attr ``winner``)."""
        group = tie_group(
            self.index,
            maximize=self.maximize,
            sampler=self.sampler,
            prior=self.settings.crown_prior,
        )
        winner = group[0] if group else None
        if winner is not None:
            record = Winner(
                trial=winner.first_trial,
                trials=winner.trials,
                mean=winner.mean,
                spread=winner.spread,
                measurements=len(winner.samples),
                tied_with=len(group) - 1,
                drift_per_trial=round(self._drift(), 6),
            )
            TunerStudyRecord(winner=record).write(study)
        return winner

    def _drift(self) -> float:
        """The objective's relative change per trial the re-measurements show."""
        slope = fit(self.index, maximize=self.maximize).slope  # utility: log, or -log
        return math.expm1(slope if self.maximize else -slope)

    def describe(self) -> str | None:
        """One line on the warm start, or None without a guide."""
        guide = self.guide
        if guide is None:
            return None
        total = len(guide.candidates)
        line = (
            f"warm start: {total:,} effective configs that fit, all screened, "
            f"{guide.replayed:,} replayed"
        )
        if guide.stopped:
            line += f" ({guide.stopped:,} more left to the screen by the safety stop)"
        line += f", {guide.predicted:,} predicted feasible, in {guide.seconds:.0f} s"
        if guide.cached:
            line += f" ({guide.cached:,} of the replays from the prediction cache)"
        return line


def _stopped_early(stored: TrialRecord) -> bool:
    """Whether a trial's replay stopped before its load was through (pruned, say): it
    may not have met the load's largest transient."""
    return stored.replay is not None and stored.replay.stopped_early is not None
