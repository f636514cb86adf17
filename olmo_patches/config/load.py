"""Loading: YAML files (omegaconf, an ``extends:`` chain) and ``key=value`` overrides -> a validated
spec.

A file may extend another (``extends: ../base.yaml``, relative to the file); the variant's keys
override the base's, and omegaconf interpolation (``${model.d_model}``) works across the chain.
``key=value`` overrides from the command line are applied last. What OLMo-core lacks: its
``Config.from_file(path, overrides)`` (``from_yaml``, olmo_core/config.py lines 308-328) reads one
file with ``yaml.safe_load``: no ``extends:`` chain, no interpolation, no file named in its errors,
and it imports torch (line 21), which loading a config must not (the refusals come within a second,
before torch).

``model`` takes the keys of its kind (``model.block``): the keys every kind shares and the kind's
own (olmo_patches/blocks/). A key of another kind is refused, naming the kinds that read it; at its
default it is dropped, which is how a record written before the kinds owned their keys reads (a
full dump, every kind's knob at its default but the one in use).
"""

from __future__ import annotations

import copy
import re
from dataclasses import MISSING, fields, is_dataclass
from functools import cache, partial
from pathlib import Path
from typing import Any, List, Optional

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, MissingMandatoryValue, OmegaConfBaseException

from ..blocks import BLOCKS, BlockKind, get_block
from ..resources import data_root
from .spec import ConfigError, ExperimentSpec, coerce_activation_checkpointing, one_line

_NOT_A = re.compile(r"^Value '(.*)' of type '\w+' could not be converted to (\w+)$")
_NOT_VALID = re.compile(r"^Value '(.*)' is not a valid (\w+)(?: \(type \w+\))?$")
_NOT_ONE_OF = re.compile(r"^Invalid value '(.*)', expected one of \[(.*)\]$")
_KINDS = {
    "Integer": "an integer",
    "Float": "a number",
    "Boolean": "true or false",
    "bool": "true or false",
}


def _line(source: str, key: str, e: OmegaConfBaseException) -> str:
    """The one-line refusal: ``SOURCE: KEY=VALUE: choose one of ...`` for a fixed choice, else
    ``SOURCE: KEY: why``."""
    if m := _NOT_ONE_OF.match(one_line(e).split(" full_key: ")[0]):
        return f"{source}: {key}={m.group(1)}: choose one of {m.group(2)}"
    return f"{source}: {key}: {_why(e)}"


def _why(e: OmegaConfBaseException) -> str:
    """omegaconf's reason in the project's words, without its internals (full_key, reference_type,
    ...)."""
    if isinstance(e, MissingMandatoryValue):
        return "required, not set"
    if isinstance(e, ConfigKeyError) and "not in" in str(e):
        return "no such key"
    why = one_line(e).split(" full_key: ")[0]
    if m := _NOT_A.match(why):
        return f"'{m.group(1)}' is not {_KINDS.get(m.group(2), m.group(2).lower())}"
    if m := _NOT_VALID.match(why):
        return f"'{m.group(1)}' is not {_KINDS.get(m.group(2), m.group(2))}"
    return why


def _read_chain(path: Path, seen: tuple[Path, ...] = ()) -> list[tuple[Path, DictConfig]]:
    """The files of an ``extends`` chain, base first."""
    path = path.resolve()
    if path in seen:
        raise ConfigError(f"{path}: extends: circular chain {' -> '.join(map(str, seen))}")
    if path.is_dir():
        raise ConfigError(f"{path}: a folder, not a config file")
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file")
    try:
        cfg = OmegaConf.load(path)
    except Exception as e:  # yaml syntax
        raise ConfigError(f"{path}: cannot parse YAML: {one_line(e)}") from e
    if not path.read_text().strip() or (isinstance(cfg, DictConfig) and not cfg):
        raise ConfigError(f"{path}: empty config file (a config sets at least run.name)")
    if not isinstance(cfg, DictConfig):
        raise ConfigError(f"{path}: a config file must be a mapping")
    parent = cfg.pop("extends", None)
    chain = _read_chain(path.parent / str(parent), seen + (path,)) if parent else []
    return chain + [(path, cfg)]


def _shown(path: Path) -> str:
    """A config file as a refusal names it: relative to the working folder, else to the package's
    data (an installed copy's configs/...), else as given."""
    for root in (Path.cwd(), data_root()):
        try:
            return path.resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            continue
    return str(path)


def _where(key: str, chain: list[tuple[Path, DictConfig]], cli: list[str]) -> str:
    """The command line or the last file of the chain that sets ``key``; for a key no source sets (a
    required key of a section), the source that sets its nearest section (model.moe.top_k: the
    ``model.moe.num_experts=4`` of the command line)."""
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        if found := _setter(".".join(parts[:n]), chain, cli):
            return found
    return _shown(chain[-1][0])


def _setter(key: str, chain: list[tuple[Path, DictConfig]], cli: list[str]) -> Optional[str]:
    if any(
        key == k or key.startswith(k + ".") or k.startswith(key + ".")
        for k in (o.split("=", 1)[0] for o in cli)
    ):
        return "command line"
    for path, cfg in reversed(chain):
        # a file sets a key, resolvable or not
        node: Any = OmegaConf.to_container(cfg, resolve=False)
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            return _shown(path)
    return None


def _not_a_section(cfg: DictConfig, schema: DictConfig, prefix: str = "") -> tuple[str, str]:
    """The first key of ``cfg`` that sets a section of the schema (train, model.widths) to a scalar
    or a list, or a list (train.betas) to a mapping: omegaconf's merge error names no key for it."""
    for k, v in cfg.items_ex(resolve=False) if isinstance(cfg, DictConfig) else ():
        # a node, null or not
        sub = schema._get_node(k) if isinstance(schema, DictConfig) and k in schema else None
        if isinstance(sub, DictConfig) and v is not None and not isinstance(v, DictConfig):
            return f"{prefix}{k}", f"'{v}' is not a section (a mapping of keys)"
        if isinstance(sub, ListConfig) and isinstance(v, DictConfig):
            return f"{prefix}{k}", "a mapping, not a list"
        if isinstance(sub, DictConfig) and isinstance(v, DictConfig):
            # a null section (train.activation_checkpointing): its dataclass's keys
            if sub._is_none():
                sub = OmegaConf.structured(sub._metadata.ref_type)
            if (found := _not_a_section(v, sub, f"{prefix}{k}."))[0]:
                return found
    return "", ""


def coerce_shorthands(cfg: DictConfig) -> DictConfig:
    """``cfg`` (a file, the command line, a recorded config) with the schema's shorthands written
    out in place: ``train.activation_checkpointing: true`` and the like
    (spec.coerce_activation_checkpointing)."""
    train = cfg.get("train")
    # YAML 1.1 reads a bare `off` as false
    if isinstance(train, DictConfig) and train.get("float8") is False:
        train.float8 = "off"
    if isinstance(train, DictConfig) and "activation_checkpointing" in train:
        value = OmegaConf.to_container(train, resolve=False)["activation_checkpointing"]  # type: ignore[index]
        train.activation_checkpointing = coerce_activation_checkpointing(value)
    return cfg


@cache
def kind_schema(block: str) -> DictConfig:
    """ExperimentSpec with the model keys of kind ``block`` as an OmegaConf schema: built once per
    kind (half of a config's load), copied per load."""
    schema = OmegaConf.structured(ExperimentSpec)
    schema.model = OmegaConf.structured(get_block(block).spec)
    return schema


def _default(f) -> Any:
    default = f.default_factory() if f.default is MISSING else f.default
    return (
        OmegaConf.to_container(OmegaConf.structured(default)) if is_dataclass(default) else default
    )


def _at_default(value: Any, default: Any) -> bool:
    """``value`` (a node's container) is ``default``; a mapping: each key it sets is."""
    if isinstance(value, dict) and isinstance(default, dict):
        return all(k in default and _at_default(v, default[k]) for k, v in value.items())
    return value == default


def at_default(kind: BlockKind, key: str, value: Any) -> bool:
    """``value`` (a record's container) is what ``kind`` gives its model key ``key`` by default."""
    return any(_at_default(value, _default(f)) for f in fields(kind.spec) if f.name == key)


def _readers(key: str) -> list[BlockKind]:
    """The registered kinds that have the model key ``key`` of their own."""
    return [k for k in BLOCKS.values() if key in k.knobs]


def drop_foreign_defaults(cfg: DictConfig, block: str) -> DictConfig:
    """``cfg`` without the model keys of other kinds that sit at their defaults, in place (they mean
    nothing to ``block``)."""
    model = cfg.get("model")
    if not isinstance(model, DictConfig):
        return cfg
    own = {f.name for f in fields(get_block(block).spec)}
    for key in [k for k in model.keys() if k not in own]:
        value = OmegaConf.to_container(model, resolve=False)[key]  # type: ignore[index]
        readers = _readers(str(key))
        if readers and all(at_default(kind, str(key), value) for kind in readers):
            del model[key]
    return cfg


def _block(chain: list[tuple[Path, DictConfig]], overrides: list[str]) -> str:
    """model.block as the chain and the command line set it (the last setter wins)."""
    block = "baseline"
    for _, cfg in chain:
        value = OmegaConf.select(cfg, "model.block", throw_on_resolution_failure=False)
        block = block if value is None else str(value)
    for o in overrides:
        if o.split("=", 1)[0] == "model.block":
            block = o.split("=", 1)[1]
    return block


def _foreign(key: str, block: str) -> Optional[str]:
    """Why ``key`` is refused when it is a model key of other kinds than ``block``."""
    name = key.removeprefix("model.").split(".")[0]
    if not key.startswith("model.") or not (readers := _readers(name)):
        return None
    kinds = " or ".join(k.name for k in readers)
    return f"a key of model.block={kinds}, not of model.block={block}"


def load_spec(path: str | Path, overrides: Optional[List[str]] = None) -> ExperimentSpec:
    """Load, merge and validate: the same spec on every machine (what depends on the machine and the
    ranks is :func:`olmo_patches.launch.layout.resolve`'s). Raises :class:`ConfigError` with a
    one-line message."""
    overrides = list(overrides or [])
    chain = _read_chain(Path(path))
    for o in overrides:
        if "=" not in o:
            raise ConfigError(f"command line: override '{o}' is not key=value")
    where = partial(_where, chain=chain, cli=overrides)
    if (block := _block(chain, overrides)) not in BLOCKS:
        raise ConfigError(
            f"{where('model.block')}: model.block={block}: choose one of {', '.join(BLOCKS)} "
            "(olmo_patches/blocks/), or name the module of your own in HOURGLASS_BLOCKS"
        )
    schema = kind_schema(block)
    merged: Any = copy.deepcopy(schema)
    for source, cfg in chain:
        try:
            # in place: OmegaConf.merge would deep-copy the whole config per file
            merged.merge_with(drop_foreign_defaults(coerce_shorthands(cfg), block))
        except OmegaConfBaseException as e:
            key = getattr(e, "full_key", "")
            if not key and (found := _not_a_section(cfg, schema))[0]:
                raise ConfigError(f"{_shown(source)}: {found[0]}: {found[1]}") from e
            raise ConfigError(_refusal(_shown(source), key, e, block)) from e
    try:
        cli = drop_foreign_defaults(coerce_shorthands(OmegaConf.from_dotlist(overrides)), block)
        merged.merge_with(cli)
        spec: ExperimentSpec = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", "")
        if not key and (found := _not_a_section(OmegaConf.from_dotlist(overrides), schema))[0]:
            key, why = found
            raise ConfigError(f"{where(key)}: {key}: {why}") from e
        raise ConfigError(_refusal(where(key or "?"), key, e, block)) from e
    spec.validate(where)
    spec.where = where  # type: ignore[attr-defined]  # for launch.resolve's errors: not a key
    return spec


def _refusal(source: str, key: str, e: OmegaConfBaseException, block: str) -> str:
    """The one line for omegaconf's error at ``key``: a key of another kind says whose it is."""
    if isinstance(e, ConfigKeyError) and (why := _foreign(key, block)):
        return f"{source}: {key}: {why}"
    return _line(source, key or "?", e)


def where_set(spec: ExperimentSpec):
    """``key -> the file or "command line" that set it`` for a loaded spec ("config" otherwise)."""
    return getattr(spec, "where", lambda key: "config")


def spec_to_yaml(spec: ExperimentSpec) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(spec))
