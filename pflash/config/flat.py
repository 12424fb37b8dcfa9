"""The flat-name compatibility layer: components nested, every knob still read and written flat.

A `ComponentSet` (the whole `PFlashConfig`, or the part a deployment receives) holds
components, and offers for every field of every component it holds:
- a read-only property of the flat name (`config.select_mode` is
  `config.selection.select_mode`), generated from the components' fields, so code that
  reads knobs does not care whether it was given the whole config, a part or the component;
- flat input: a mapping may give a knob flat (`select_mode: top_k`) or under its component
  (`selection: {select_mode: top_k}`), or under the component it moved from
  (`Component.moved_from`); when both forms name one knob, the later key in the mapping
  wins, as in a dict merge (`{**base, **updates}` over a flat base works either way);
- a flat dump: `model_dump()` (any mode, `exclude_defaults` included) returns
  `{flat key: value}`, so `build_config({**config.model_dump(), **updates})` rebuilds it.
  `include`/`exclude` name the nested form (components, then fields).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, model_serializer, model_validator

from pflash.config.components import Component

P = TypeVar("P", bound=BaseModel)


def _flat_property(component: str, key: str, doc: str | None) -> property:
    def read(self: ComponentSet) -> Any:
        return getattr(getattr(self, component), key)

    return property(read, doc=f"`{component}.{key}`: {doc or ''}")


class ComponentSet(BaseModel):
    """Components by name, read and written by flat key too (module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    component_of: ClassVar[dict[str, str]] = {}
    """Flat key -> the name of the component (field) holding it, for this class's components."""

    moved_from: ClassVar[dict[str, str]] = {}
    """Flat key -> the component that held it before it moved (`Component.moved_from`)."""

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        # a part that extends another keeps its base's flat names for the same components
        inherited = {
            key: component
            for base in reversed(cls.__mro__[1:])
            if isinstance(base, type) and issubclass(base, ComponentSet)
            for key, component in base.component_of.items()
        }
        cls.component_of, cls.moved_from = {}, {}
        for component, info in cls.model_fields.items():
            kind = info.annotation
            if not (isinstance(kind, type) and issubclass(kind, Component)):
                raise TypeError(f"{cls.__name__}.{component} is not a Component")
            for key, field in kind.model_fields.items():
                taken = hasattr(cls, key) and inherited.get(key) != component
                if key in cls.component_of or key in cls.model_fields or taken:
                    raise TypeError(f"{cls.__name__}: flat key {key!r} is not unique")
                cls.component_of[key] = component
                if kind.moved_from is not None:
                    cls.moved_from[key] = kind.moved_from
                setattr(cls, key, _flat_property(component, key, field.description))

    @classmethod
    def nest(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        """`data` with every flat key moved under its component (a key under the component
        it moved from, too), later keys winning. Keys that are neither (unknown, or a
        component given a non-mapping) are left for validation to name."""
        groups: dict[str, dict[str, Any]] = {}
        out: dict[str, Any] = {}
        for key, value in data.items():
            if key in cls.component_of:
                groups.setdefault(cls.component_of[key], {})[key] = value
            elif key in cls.model_fields and isinstance(value, Mapping | Component):
                for inner, inner_value in dict(value).items():
                    moved = cls.moved_from.get(inner) == key
                    groups.setdefault(cls.component_of[inner] if moved else key, {})[inner] = (
                        inner_value
                    )
            else:
                out[key] = value
        for component, values in groups.items():
            out.setdefault(component, values)
        return out

    @model_validator(mode="before")
    @classmethod
    def _nest_flat_keys(cls, data: Any) -> Any:
        return cls.nest(data) if isinstance(data, Mapping) else data

    @model_serializer(mode="wrap")
    def _dump_flat(self, handler: Any) -> dict[str, Any]:
        nested = handler(self)
        return {key: value for values in nested.values() for key, value in values.items()}

    def part(self, part: type[P]) -> P:
        """The components `part` names, taken from this config: `part` is a smaller
        ComponentSet (e.g. `DrafterScorerPart`) or one Component class (e.g. `ViewsConfig`)."""
        if isinstance(self, part):
            return self
        if issubclass(part, ComponentSet):
            # this config's own components, validated with it: taken as they are, since the
            # request flow builds its parts per request, where validating them again is pure cost
            return part.model_construct(**{name: getattr(self, name) for name in part.model_fields})
        for name, info in type(self).model_fields.items():
            if info.annotation is part:
                return getattr(self, name)
        raise TypeError(f"{type(self).__name__} holds no {part.__name__}")
