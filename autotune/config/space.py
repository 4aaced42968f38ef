"""Search spaces: the YAML schema, its mapping to Optuna, and TrialConfig derivation.

A space file (``search_spaces/*.yaml``) declares:

- ``parameters``: what the sampler searches (int, float, categorical, bool),
  each optionally mapped onto one vLLM flag (``flag:``, with ``unit: GiB`` to
  render GiB as bytes);
- ``fixed``: flags every trial passes as they are;
- ``derived``: flags computed from the parameters by named rules
  (``autotune.config.derive``), e.g. CUDA-graph capture sizes from max-num-seqs x (k+1);
- ``rules``: conditions a config must meet to be launched at all;
- ``gates``: parameter choices or flags that exist only on some engine versions;
- ``baseline``: the hand-tuned starting point, enqueued as the first trial;
- ``allow_unknown_flags``: flags of a newer vLLM than the known-flag list has.
- ``tuner``: optional settings of the search and the run's details
  (``autotune.tuner.settings_file``, docs/tuner.md), read as they are here: they are no
  part of what a study's space is (``digest``).

Every flag name is checked against the engine's flags before the first trial
(``check_flags``); a flag that carries a secret, or a value that looks like one,
is refused in any spelling when the file is read: flags are stored with every
trial and logged.

The space stays static for GPSampler: every parameter is suggested on every
trial; a parameter that does not apply (MTP k while MTP is off) is ignored
by the derivations, never left out.
"""

from __future__ import annotations

import ast
import hashlib
import json
import operator
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import optuna
import yaml
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from autotune.config.derive import DERIVATIONS, READS_BLOCK_SIZE, DeriveContext
from autotune.config.known_flags import KnownFlags
from autotune.config.trial_config import FlagValue, TrialConfig
from autotune.errors import SpaceError
from autotune.redaction import looks_secret, redact, secret_flag
from autotune.sim.model.units import GIB

SEARCH_SPACES_DIR = Path(__file__).resolve().parents[2] / "search_spaces"


class _Param(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    flag: str | None = None  # the vLLM flag this parameter sets directly, if any
    help: str = ""


class IntParam(_Param):
    type: Literal["int"]
    low: int
    high: int
    step: int = 1
    log: bool = False

    @model_validator(mode="after")
    def _check_range(self) -> IntParam:
        if self.low > self.high:
            raise ValueError(f"low must be <= high, but got low={self.low}, high={self.high}")
        if self.log and self.low < 1:
            raise ValueError(f"a log-scaled int needs low >= 1, but got low={self.low}")
        return self


class FloatParam(_Param):
    type: Literal["float"]
    low: float
    high: float
    step: float | None = None
    log: bool = False
    unit: Literal["GiB"] | None = None  # GiB: the flag gets an integer byte count

    @model_validator(mode="after")
    def _check_range(self) -> FloatParam:
        if self.low > self.high:
            raise ValueError(f"low must be <= high, but got low={self.low}, high={self.high}")
        return self


class CategoricalParam(_Param):
    type: Literal["categorical"]
    choices: list[str | int | float]

    @model_validator(mode="after")
    def _check_choices(self) -> CategoricalParam:
        if not self.choices:
            raise ValueError("choices must not be empty")
        return self


class BoolParam(_Param):
    type: Literal["bool"]


Parameter = Annotated[
    IntParam | FloatParam | CategoricalParam | BoolParam, Field(discriminator="type")
]


class Gate(BaseModel):
    """Something that exists only on some engine versions (a PEP 440 specifier)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    versions: str  # e.g. ">=0.27"
    param: str | None = None  # gate one choice of this parameter ...
    choice: str | int | float | None = None
    flag: str | None = None  # ... or a whole flag

    @model_validator(mode="after")
    def _check_target(self) -> Gate:
        try:
            SpecifierSet(self.versions)
        except InvalidSpecifier as exc:
            raise ValueError(f"versions is not a version specifier: {self.versions!r}") from exc
        if (self.param is None) == (self.flag is None):
            raise ValueError("a gate names either param (+ choice) or flag")
        return self


class SearchSpace(BaseModel):
    """A validated search-space file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    model: str | None = None  # the model this space was written for
    attention_block_size: int | None = None  # hint for derivations until the engine reports it
    parameters: dict[str, Parameter]
    fixed: dict[str, FlagValue] = Field(default_factory=dict)
    derived: list[str] = Field(default_factory=list)  # names of rules in autotune.config.derive
    rules: list[str] = Field(default_factory=list)  # e.g. "max_num_batched_tokens >= max_num_seqs"
    gates: list[Gate] = Field(default_factory=list)
    baseline: dict[str, Any] = Field(default_factory=dict)
    # Flags the engine's known-flag list lacks (a newer vLLM's), passed without the check.
    allow_unknown_flags: list[str] = Field(default_factory=list)
    tuner: dict[str, Any] = Field(default_factory=dict)  # validated by autotune.tuner.settings_file

    @field_validator("tuner", mode="before")
    @classmethod
    def _empty_section(cls, tuner: Any) -> Any:
        return {} if tuner is None else tuner

    @model_validator(mode="after")
    def _no_secrets(self) -> SearchSpace:
        """A flag is stored with every trial and logged: a key there would be kept forever."""
        found = _first_secret(self)
        if found is not None:
            loc, reason = found
            field = ".".join(redact(str(part)) for part in loc)
            raise PydanticCustomError(
                "secret", "{reason}", {"reason": reason, "field": field, "loc": loc}
            )
        return self

    @model_validator(mode="after")
    def _check_references(self) -> SearchSpace:
        for name in self.derived:
            if name not in DERIVATIONS:
                known = ", ".join(sorted(DERIVATIONS))
                raise ValueError(f"unknown derived rule {name!r} (known: {known})")
        for rule in self.rules:
            _check_rule(rule, set(self.parameters))
        for key in self.baseline:
            if key not in self.parameters:
                raise ValueError(f"baseline names unknown parameter {key!r}")
        for gate in self.gates:
            if gate.param is not None and gate.param not in self.parameters:
                raise ValueError(f"gate names unknown parameter {gate.param!r}")
        return self

    # --- Optuna side -------------------------------------------------------

    def distributions(self, engine_version: str | None = None) -> dict[str, Any]:
        """Optuna distributions, with version-gated choices removed."""
        return {
            name: _distribution(param, self._allowed_choices(name, param, engine_version))
            for name, param in self.parameters.items()
        }

    def suggest(self, trial: optuna.Trial, engine_version: str | None = None) -> dict[str, Any]:
        """Suggest every parameter (a static space, as GPSampler wants)."""
        return {
            name: _suggest(trial, name, distribution)
            for name, distribution in self.distributions(engine_version).items()
        }

    def baseline_params(self, engine_version: str | None = None) -> dict[str, Any]:
        """The baseline, completed with each parameter's low end / first choice."""
        params: dict[str, Any] = {}
        for name, distribution in self.distributions(engine_version).items():
            if name in self.baseline:
                params[name] = self.baseline[name]
            elif isinstance(distribution, optuna.distributions.CategoricalDistribution):
                params[name] = distribution.choices[0]
            else:
                params[name] = distribution.low
        return params

    def grid(self, engine_version: str | None = None, *, max_points: int = 8) -> dict[str, list]:
        """Every parameter as a list of values, for GridSampler."""
        grid: dict[str, list] = {}
        for name, distribution in self.distributions(engine_version).items():
            grid[name] = _grid_values(distribution, max_points)
        return grid

    # --- engine side -------------------------------------------------------

    def rule_violations(self, params: dict[str, Any]) -> list[str]:
        """The rules this parameter set breaks (empty: it may be launched)."""
        return [rule for rule in self.rules if not _eval_rule(rule, params)]

    def to_config(
        self,
        params: dict[str, Any],
        *,
        model: str,
        engine_version: str | None = None,
        attention_block_size: int | None = None,
    ) -> TrialConfig:
        """The full TrialConfig for one parameter set: fixed, direct and derived flags."""
        flags: dict[str, FlagValue] = dict(self.fixed)
        for name, param in self.parameters.items():
            if param.flag is None or name not in params:
                continue
            flags[param.flag] = _render(param, params[name])
        context = DeriveContext(
            params=params,
            attention_block_size=attention_block_size or self.attention_block_size,
        )
        for rule in self.derived:
            flags.update(DERIVATIONS[rule](flags, context))
        flags = {name: value for name, value in flags.items() if value is not None}
        for gate in self.gates:
            if gate.flag and gate.flag in flags and not _version_ok(gate.versions, engine_version):
                del flags[gate.flag]
        return TrialConfig(model=model, flags=flags)

    def reads_block_size(self, params: dict[str, Any]) -> bool:
        """Whether the derived flags of ``params`` depend on the attention block size."""
        return any(
            READS_BLOCK_SIZE[rule](params) for rule in self.derived if rule in READS_BLOCK_SIZE
        )

    def digest(self) -> str:
        """A content hash: a study refuses to resume with another space. The ``tuner``
        section is left out (the study checks its settings on their own)."""
        content = self.model_dump(mode="json", exclude={"tuner"})
        if not content["allow_unknown_flags"]:  # spaces written before the field keep theirs
            del content["allow_unknown_flags"]
        text = json.dumps(content, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def flag_names(self) -> list[tuple[tuple[str | int, ...], str]]:
        """Every flag name the space sets, with where it is set (``("fixed", name)``...)."""
        names: list[tuple[tuple[str | int, ...], str]] = [(("fixed", n), n) for n in self.fixed]
        names += [
            (("parameters", name, "flag"), param.flag)
            for name, param in self.parameters.items()
            if param.flag is not None
        ]
        names += [
            (("gates", index, "flag"), gate.flag)
            for index, gate in enumerate(self.gates)
            if gate.flag is not None
        ]
        return names

    def _allowed_choices(
        self, name: str, param: Parameter, engine_version: str | None
    ) -> list | None:
        if not isinstance(param, CategoricalParam):
            return None
        banned = {
            gate.choice
            for gate in self.gates
            if gate.param == name and not _version_ok(gate.versions, engine_version)
        }
        return [choice for choice in param.choices if choice not in banned]


def check_flags(space: SearchSpace, path: Path, known: KnownFlags) -> None:
    """Refuse, before the first trial, a flag name the engine does not take.

    On real vLLM a flag under ``allow_unknown_flags`` or named by a gate passes (the gate
    says which versions have it: a newer vLLM's flag the known list lacks). The simulator
    takes only the flags it models: there a flag is checked unless a gate drops it at the
    vLLM version the simulator speaks. Raises SpaceError("FILE:LINE: field: what is wrong").
    """
    unknown = [name for name in space.allow_unknown_flags if known.problem(name) is not None]
    if unknown and not known.accepts_newer:
        raise SpaceError(
            f"{_where(path, ('allow_unknown_flags',))}: allow_unknown_flags: {known.engine} "
            f"takes only the flags it models, not --{unknown[0]}; use --engine vllm for it"
        )
    for loc, name in space.flag_names():
        gates = [gate for gate in space.gates if gate.flag == name]
        if loc[0] == "gates":
            continue  # checked where the flag is set
        if known.accepts_newer and (name in space.allow_unknown_flags or gates):
            continue
        if not all(_version_ok(gate.versions, known.version) for gate in gates):
            continue  # to_config drops it at this version
        problem = known.problem(name)
        if problem is not None:
            raise SpaceError(f"{_where(path, loc)}: {'.'.join(map(str, loc))}: {problem}")


def _where(path: Path, loc: tuple) -> str:
    line = _line_of(path, loc)
    return f"{path}:{line}" if line else str(path)


def load_space(path: Path) -> SearchSpace:
    """Read and validate a space file; errors name the file and the field."""
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError as exc:
        raise SpaceError(f"{path}: no such search-space file") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise SpaceError(f"{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from exc
    if not isinstance(raw, dict):
        raise SpaceError(f"{path}: a search space is a YAML mapping")
    try:
        return SearchSpace.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        context = first.get("ctx") or {}
        loc = context.get("loc", first["loc"])  # a secret's own place, not the model's
        field = context.get("field") or ".".join(str(part) for part in loc)
        raise SpaceError(f"{_where(path, loc)}: {field}: {first['msg']}") from None


def default_space_path(model: str, sim_model: str | None = None) -> Path:
    """``search_spaces/<model>.yaml`` (or the simulated catalog model's) when it exists,
    else ``default.yaml``."""
    for name in (model, sim_model):
        candidate = SEARCH_SPACES_DIR / f"{Path(name).name.lower()}.yaml" if name else None
        if candidate is not None and candidate.exists():
            return candidate
    return SEARCH_SPACES_DIR / "default.yaml"


def _line_of(path: Path, loc: tuple) -> int | None:
    """Best-effort line number of the first key of ``loc`` found in the file."""
    keys = [str(part) for part in loc if isinstance(part, str)]
    lines = path.read_text().splitlines()
    start = 0
    found = None
    for key in keys:
        spellings = (f"{key}:", f'"{key}":', f"'{key}':", f"- {key}")
        for number in range(start, len(lines)):
            if lines[number].lstrip().startswith(spellings):
                found, start = number + 1, number + 1
                break
    return found


def _first_secret(space: SearchSpace) -> tuple[tuple[str | int, ...], str] | None:
    """The first place the space holds a secret-bearing flag or a secret-looking value,
    with why it is refused."""
    value_reason = (
        "this looks like a secret (a key or token): values are stored with every trial "
        "and logged; pass keys through the environment (VLLM_API_KEY)"
    )

    def flag_reason(name: str) -> str | None:
        instead = secret_flag(name)
        if instead is not None:
            return f"a flag that carries a secret is never stored or logged; {instead}"
        return value_reason if looks_secret(name) else None

    def in_value(value: Any, loc: tuple[str | int, ...]) -> tuple[tuple, str] | None:
        if isinstance(value, str):
            return (loc, value_reason) if looks_secret(value) else None
        if not isinstance(value, dict | list):
            return None
        for key, item in value.items() if isinstance(value, dict) else enumerate(value):
            reason = flag_reason(key) if isinstance(key, str) else None
            if reason is not None:
                return (*loc, key), reason
            found = in_value(item, (*loc, key))
            if found is not None:
                return found
        return None

    places: list[tuple[tuple[str | int, ...], str]] = [
        *space.flag_names(),
        *((("allow_unknown_flags", i), name) for i, name in enumerate(space.allow_unknown_flags)),
    ]
    for loc, name in places:
        reason = flag_reason(name)
        if reason is not None:
            return loc, reason
    values: list[tuple[tuple[str | int, ...], Any]] = [
        *((("fixed", name), value) for name, value in space.fixed.items()),
        *((("baseline", name), value) for name, value in space.baseline.items()),
        *(
            (("parameters", name, "choices"), param.choices)
            for name, param in space.parameters.items()
            if isinstance(param, CategoricalParam)
        ),
        *((("gates", i, "choice"), gate.choice) for i, gate in enumerate(space.gates)),
    ]
    for loc, value in values:
        found = in_value(value, loc)
        if found is not None:
            return found
    return None


def _distribution(param: Parameter, choices: list | None) -> Any:
    dists = optuna.distributions
    if isinstance(param, IntParam):
        return dists.IntDistribution(param.low, param.high, log=param.log, step=param.step)
    if isinstance(param, FloatParam):
        step = None if param.log else param.step
        return dists.FloatDistribution(param.low, param.high, log=param.log, step=step)
    if isinstance(param, BoolParam):
        return dists.CategoricalDistribution([False, True])
    return dists.CategoricalDistribution(choices if choices is not None else param.choices)


def _suggest(trial: optuna.Trial, name: str, distribution: Any) -> Any:
    dists = optuna.distributions
    if isinstance(distribution, dists.IntDistribution):
        return trial.suggest_int(
            name, distribution.low, distribution.high, step=distribution.step, log=distribution.log
        )
    if isinstance(distribution, dists.FloatDistribution):
        return trial.suggest_float(
            name, distribution.low, distribution.high, step=distribution.step, log=distribution.log
        )
    return trial.suggest_categorical(name, distribution.choices)


def _grid_values(distribution: Any, max_points: int) -> list:
    if isinstance(distribution, optuna.distributions.CategoricalDistribution):
        return list(distribution.choices)
    low, high = distribution.low, distribution.high
    step = getattr(distribution, "step", None)
    if step:
        count = round((high - low) / step) + 1
        if count <= max_points:
            values = [low + i * step for i in range(count)]
            return values if isinstance(low, int) else [round(v, 6) for v in values]
    count = max_points
    if distribution.log:
        ratio = (high / low) ** (1 / (count - 1))
        raw = [low * ratio**i for i in range(count)]
    else:
        raw = [low + (high - low) * i / (count - 1) for i in range(count)]
    if isinstance(distribution, optuna.distributions.IntDistribution):
        return sorted({round(value) for value in raw})
    return [round(value, 6) for value in raw]


def _render(param: Parameter, value: Any) -> FlagValue:
    if isinstance(param, FloatParam) and param.unit == "GiB":
        return round(float(value) * GIB)
    return value


def _version_ok(spec: str, version: str | None) -> bool:
    """True when ``version`` satisfies ``spec``; an unknown version passes every gate."""
    if version is None:
        return True
    # "0.33.0", "0.32.0+cpu" or the simulator's "autotune-sim 0.1.0 (vLLM 0.33.0)":
    # the vLLM version is the last version-like token.
    found = re.findall(r"\d+\.\d+(?:\.\d+)?", version)
    try:
        parsed = Version(found[-1])
    except (IndexError, InvalidVersion):
        return True
    return parsed in SpecifierSet(spec)


# --- rules: a tiny, safe expression language over parameter names ------------

_COMPARE = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}
_ARITH = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _check_rule(rule: str, names: set[str]) -> None:
    try:
        tree = ast.parse(rule, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"rule {rule!r} is not an expression") from exc
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id not in names:
            raise ValueError(f"rule {rule!r} names unknown parameter {node.id!r}")
        allowed = (
            ast.Expression,
            ast.Compare,
            ast.BoolOp,
            ast.And,
            ast.Or,
            ast.UnaryOp,
            ast.Not,
            ast.BinOp,
            ast.Name,
            ast.Load,
            ast.Constant,
            *_COMPARE,
            *_ARITH,
        )
        if not isinstance(node, allowed):
            raise ValueError(f"rule {rule!r} uses {type(node).__name__}, which rules do not allow")


def _eval_rule(rule: str, params: dict[str, Any]) -> bool:
    return bool(_eval(ast.parse(rule, mode="eval").body, params))


def _eval(node: ast.AST, params: dict[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return params[node.id]
    if isinstance(node, ast.UnaryOp):
        return not _eval(node.operand, params)
    if isinstance(node, ast.BinOp):
        return _ARITH[type(node.op)](_eval(node.left, params), _eval(node.right, params))
    if isinstance(node, ast.BoolOp):
        values = (_eval(value, params) for value in node.values)
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.Compare):
        left = _eval(node.left, params)
        for op, comparator in zip(node.ops, node.comparators, strict=True):
            right = _eval(comparator, params)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    raise ValueError(f"unsupported rule element {type(node).__name__}")
