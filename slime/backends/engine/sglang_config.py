"""`--sglang-config FILE.yaml`: which rollout engines to start, on which GPUs, serving which model.

    sglang:
      - name: actor                 # unique; the trainer refits models with update_weights
        update_weights: true        # false: a frozen model (reference, teacher), never refit
        model_path: /models/x       # default: the trainer's --hf-checkpoint
        num_gpus_per_engine: 1      # default for this model's groups
        offload: true               # sleep while the trainer steps (default: --offload-rollout)
        engine_groups:
          - worker_type: regular    # regular | prefill | decode | placeholder
            num_gpus: 4             # GPUs of the group; engines = num_gpus / num_gpus_per_engine
            num_gpus_per_engine: 2
            offload: false          # per-group override of the model's offload
            overrides: {mem_fraction_static: 0.8}   # engine server arguments for this group
          - worker_type: placeholder
            num_gpus: 2             # reserves GPUs, starts nothing

Groups take consecutive rollout GPUs in file order (placeholders included).
`load` returns a frozen `SglangConfig`; every mistake raises `SglangConfigError`
with one line naming the key path (`sglang[1].engine_groups[0].num_gpus`) and
what to change. `python -m slime.backends.engine.sglang_config FILE` checks a file.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import yaml

WorkerType = Literal["regular", "prefill", "decode", "placeholder"]
WORKER_TYPES: tuple[WorkerType, ...] = ("regular", "prefill", "decode", "placeholder")
Scalar = str | int | float | bool

MODEL_KEYS = ("name", "update_weights", "model_path", "num_gpus_per_engine", "offload", "engine_groups")
GROUP_KEYS = ("worker_type", "num_gpus", "num_gpus_per_engine", "offload", "overrides")
PLACEHOLDER_KEYS = ("worker_type", "num_gpus")
EXIT_CODE = 2  # a usage error, as argparse's


class SglangConfigError(ValueError):
    """One line: the YAML key path and what to fix."""


@dataclass(frozen=True, kw_only=True)
class EngineGroup:
    """Consecutive rollout GPUs [gpu_offset, gpu_offset + num_gpus) of one model."""

    model: str
    index: int
    worker_type: WorkerType
    num_gpus: int
    num_gpus_per_engine: int  # 0 for a placeholder
    gpu_offset: int
    offload: bool
    overrides: tuple[tuple[str, Scalar], ...] = ()

    @property
    def is_placeholder(self) -> bool:
        return self.worker_type == "placeholder"

    @property
    def num_engines(self) -> int:
        return 0 if self.is_placeholder else self.num_gpus // self.num_gpus_per_engine

    @property
    def gpu_ids(self) -> tuple[int, ...]:
        return tuple(range(self.gpu_offset, self.gpu_offset + self.num_gpus))

    def engine_gpus(self) -> tuple[tuple[int, ...], ...]:
        """The rollout GPU indices of each engine of the group."""
        n = self.num_gpus_per_engine
        return tuple(self.gpu_ids[i * n:(i + 1) * n] for i in range(self.num_engines))


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    name: str
    model_path: str | None  # None: the trainer's --hf-checkpoint
    update_weights: bool
    groups: tuple[EngineGroup, ...]

    @property
    def frozen(self) -> bool:
        return not self.update_weights


@dataclass(frozen=True, kw_only=True)
class EngineSpec:
    """One engine to start: its name, model, GPUs and whether it is refit and offloaded."""

    name: str  # "<model>-g<group>-e<engine>"
    model: str
    model_path: str | None
    worker_type: WorkerType
    gpus: tuple[int, ...]
    update_weights: bool
    offload: bool
    overrides: tuple[tuple[str, Scalar], ...]


@dataclass(frozen=True, kw_only=True)
class SglangConfig:
    models: tuple[ModelConfig, ...]
    num_gpus: int  # GPUs all groups take, placeholders included

    def model(self, name: str) -> ModelConfig:
        for m in self.models:
            if m.name == name:
                return m
        raise KeyError(f"no model {name!r}; models: {', '.join(m.name for m in self.models)}")

    def engines(self) -> tuple[EngineSpec, ...]:
        out = []
        for m in self.models:
            for g in m.groups:
                for e, gpus in enumerate(g.engine_gpus()):
                    out.append(EngineSpec(
                        name=f"{m.name}-g{g.index}-e{e}", model=m.name, model_path=m.model_path,
                        worker_type=g.worker_type, gpus=gpus, update_weights=m.update_weights,
                        offload=g.offload, overrides=g.overrides))
        return tuple(out)


def _fail(path: str, message: str) -> SglangConfigError:
    return SglangConfigError(f"{path}: {message}")


def _type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _check_keys(node: Mapping[str, Any], allowed: Sequence[str], path: str, what: str) -> None:
    for key in node:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"{what} takes {', '.join(allowed)}"
            raise _fail(f"{path}.{key}", f"unknown key; {hint}")


def _int(node: Mapping[str, Any], key: str, path: str, default: int | None = None) -> int:
    value = node.get(key, default)
    if value is None:
        raise _fail(f"{path}.{key}", "missing; give a positive integer")
    # bool is an int in Python; `num_gpus: yes` is a mistake, not 1.
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _fail(f"{path}.{key}", f"expected a positive integer, got {value!r} ({_type_name(value)})")
    return value


def _bool(node: Mapping[str, Any], key: str, path: str, default: bool) -> bool:
    value = node.get(key, default)
    if not isinstance(value, bool):
        raise _fail(f"{path}.{key}", f"expected true or false, got {value!r} ({_type_name(value)})")
    return value


def _mapping(value: object, path: str, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _fail(path, f"expected {what} (a mapping of keys), got {_type_name(value)}")
    return cast(Mapping[str, Any], value)


def _overrides(value: object, path: str) -> tuple[tuple[str, Scalar], ...]:
    node = _mapping(value, path, "engine server arguments")
    for key, v in node.items():
        if not isinstance(v, str | int | float | bool):
            raise _fail(f"{path}.{key}", f"expected a number, string or boolean, got {_type_name(v)}")
    return tuple(sorted((str(k), v) for k, v in node.items()))


def _group(
    raw: object, path: str, *, model: str, index: int, offset: int, per_engine: int, offload: bool,
    gpus_per_node: int,
) -> EngineGroup:
    node = _mapping(raw, path, "an engine group")
    worker_type = node.get("worker_type", "regular")
    if worker_type not in WORKER_TYPES:
        raise _fail(f"{path}.worker_type", f"{worker_type!r} is not a worker type; use one of "
                    f"{', '.join(WORKER_TYPES)}")
    if worker_type == "placeholder":
        for key in node:
            if key not in PLACEHOLDER_KEYS:
                raise _fail(f"{path}.{key}", "a placeholder reserves GPUs and starts no engine; "
                            "remove this key or make the group worker_type: regular")
        return EngineGroup(model=model, index=index, worker_type="placeholder",
                           num_gpus=_int(node, "num_gpus", path), num_gpus_per_engine=0,
                           gpu_offset=offset, offload=False)
    _check_keys(node, GROUP_KEYS, path, "an engine group")
    num_gpus = _int(node, "num_gpus", path)
    n = _int(node, "num_gpus_per_engine", path, per_engine)
    if n > gpus_per_node:
        raise _fail(f"{path}.num_gpus_per_engine", f"an engine of {n} GPUs does not fit a node of "
                    f"{gpus_per_node}; use at most {gpus_per_node}")
    if num_gpus % n:
        raise _fail(f"{path}.num_gpus", f"{num_gpus} GPUs do not split into engines of {n}; "
                    f"make num_gpus a multiple of num_gpus_per_engine ({n})")
    return EngineGroup(
        model=model, index=index, worker_type=cast(WorkerType, worker_type), num_gpus=num_gpus,
        num_gpus_per_engine=n, gpu_offset=offset, offload=_bool(node, "offload", path, offload),
        overrides=_overrides(node.get("overrides", {}), f"{path}.overrides"))


def parse(
    data: object,
    *,
    rollout_num_gpus: int,
    num_gpus_per_engine: int = 1,
    offload: bool = False,
    gpus_per_node: int = 8,
) -> SglangConfig:
    """Validate a loaded YAML document against the rollout's GPUs; defaults come from the CLI."""
    top = _mapping(data, "<top>", "a document with a top-level 'sglang' key")
    _check_keys(top, ("sglang",), "<top>", "the document")
    models_raw = top.get("sglang")
    if not isinstance(models_raw, list) or not models_raw:
        raise _fail("sglang", f"expected a non-empty list of models, got {_type_name(models_raw)}")
    models: list[ModelConfig] = []
    seen: dict[str, str] = {}
    offset = 0
    for i, raw in enumerate(models_raw):
        path = f"sglang[{i}]"
        node = _mapping(raw, path, "a model")
        _check_keys(node, MODEL_KEYS, path, "a model")
        name = node.get("name")
        if not isinstance(name, str) or not name.strip():
            raise _fail(f"{path}.name", f"expected a non-empty name, got {name!r}")
        if name in seen:
            raise _fail(f"{path}.name", f"{name!r} is already the name of {seen[name]}; names must be unique")
        seen[name] = path
        model_path = node.get("model_path")
        if model_path is not None and not isinstance(model_path, str):
            raise _fail(f"{path}.model_path", f"expected a path, got {_type_name(model_path)}")
        per_engine = _int(node, "num_gpus_per_engine", path, num_gpus_per_engine)
        model_offload = _bool(node, "offload", path, offload)
        groups_raw = node.get("engine_groups")
        if not isinstance(groups_raw, list) or not groups_raw:
            raise _fail(f"{path}.engine_groups", f"expected a non-empty list of groups, got "
                        f"{_type_name(groups_raw)}")
        groups = []
        for j, g in enumerate(groups_raw):
            group = _group(g, f"{path}.engine_groups[{j}]", model=name, index=j, offset=offset,
                           per_engine=per_engine, offload=model_offload, gpus_per_node=gpus_per_node)
            offset += group.num_gpus
            groups.append(group)
        kinds = {g.worker_type for g in groups}
        if kinds == {"placeholder"}:
            raise _fail(f"{path}.engine_groups", f"model {name!r} has only placeholder groups and serves "
                        "nothing; add a regular group or move the placeholders to another model")
        if ("prefill" in kinds) != ("decode" in kinds):
            raise _fail(f"{path}.engine_groups", "prefill and decode groups come in pairs; add the missing "
                        "one or use worker_type: regular")
        models.append(ModelConfig(name=name, model_path=model_path,
                                  update_weights=_bool(node, "update_weights", path, True),
                                  groups=tuple(groups)))
    if not any(m.update_weights for m in models):
        raise _fail("sglang", "every model has update_weights: false, so the trainer's weights reach no "
                    "engine; set update_weights: true on the actor")
    if offset != rollout_num_gpus:
        raise _fail("sglang", f"the groups take {offset} GPUs but the rollout has {rollout_num_gpus} "
                    "(--rollout-num-gpus); make the num_gpus of all groups, placeholders included, "
                    f"add up to {rollout_num_gpus}")
    return SglangConfig(models=tuple(models), num_gpus=offset)


def load(path: str | Path, **defaults: Any) -> SglangConfig:
    """Read and validate FILE.yaml; see `parse` for the defaults."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise SglangConfigError(f"{p}: cannot read the file ({e.strerror}); check --sglang-config") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or "not valid YAML"
        raise SglangConfigError(f"{p}: YAML syntax error{where}: {problem}") from None
    try:
        return parse(data, **defaults)
    except SglangConfigError as e:
        raise SglangConfigError(f"{p}: {e}") from None


def describe(config: SglangConfig) -> str:
    lines = []
    for m in config.models:
        kind = "updatable" if m.update_weights else "frozen"
        lines.append(f"{m.name} ({kind}, {m.model_path or '--hf-checkpoint'})")
        for g in m.groups:
            gpus = f"GPUs {g.gpu_offset}-{g.gpu_offset + g.num_gpus - 1}"
            if g.is_placeholder:
                lines.append(f"  group {g.index}: placeholder, {gpus}")
            else:
                lines.append(f"  group {g.index}: {g.worker_type}, {g.num_engines} × {g.num_gpus_per_engine} "
                             f"GPU engines, {gpus}, offload {'on' if g.offload else 'off'}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m slime.backends.engine.sglang_config",
                                description="Check an --sglang-config file and print the engine layout.")
    p.add_argument("file")
    p.add_argument("--rollout-num-gpus", type=int, required=True)
    p.add_argument("--rollout-num-gpus-per-engine", type=int, default=1)
    p.add_argument("--offload-rollout", action="store_true")
    p.add_argument("--num-gpus-per-node", type=int, default=8)
    args = p.parse_args(argv)
    try:
        config = load(args.file, rollout_num_gpus=args.rollout_num_gpus,
                      num_gpus_per_engine=args.rollout_num_gpus_per_engine,
                      offload=args.offload_rollout, gpus_per_node=args.num_gpus_per_node)
    except SglangConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_CODE
    print(describe(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
