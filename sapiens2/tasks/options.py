"""Request options as data: one :class:`Option` per knob a task offers, and their validation.

A task declares its options once (``sapiens2.tasks.<task>.TASK.options``); the app builds its
widgets, the API its parameters and docs, the CLI its flags, and the server its checks from
them. Every value a caller sends goes through :func:`check` before it reaches a pipeline, so a
bad value gets one message naming the option and what it accepts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from ..errors import OptionError

Kind = Literal["bool", "float", "int", "choice", "classes", "color", "image"]
Stage = Literal["infer", "render"]


@dataclass(frozen=True)
class Option:
    """One option of a task.

    ``stage`` says whether the value changes the model run ("infer") or only the picture and
    files made from its result ("render"). ``gpu_default`` replaces ``default`` when the server
    runs on a GPU (e.g. flip test: one extra crop in the same batch there, twice the time on a CPU).
    ``choices`` lists the values of a "choice" option and the known names of a "classes" option.
    ``enabled_by`` names a "bool" option of the same task that must be on for this one to have
    any effect (normals' background choice needs the background removed): the page greys the
    widget out while the switch is off and the docs say so; a value sent anyway is accepted.
    """

    name: str
    kind: Kind
    default: Any
    stage: Stage
    label: str
    help: str
    low: float | None = None
    high: float | None = None
    step: float | None = None
    choices: tuple[str, ...] = ()
    gpu_default: Any = None
    #: "classes" options: maps the names or ids given to the ids used (raises OptionError)
    resolve: Callable[[Iterable[Any]], Any] | None = None
    enabled_by: str | None = None

    def default_for(self, gpu: bool) -> Any:
        return self.gpu_default if gpu and self.gpu_default is not None else self.default

    def describe(self, gpu: bool = False) -> str:
        """One line for API docs and ``--help``: the help text, the range or choices, the default."""
        if self.kind in ("float", "int"):
            accepted = f" ({self.low:g} to {self.high:g})"
        elif self.kind == "choice":
            accepted = f" ({', '.join(self.choices)})"
        else:
            accepted = ""
        default = self.default_for(gpu)
        shown = "" if default in (None, "") else f"; default {default}"
        if self.gpu_default is not None and self.gpu_default != self.default:
            shown = f"; default {self.gpu_default} on a GPU, {self.default} on a CPU"
        needs = f"; only with {self.enabled_by}" if self.enabled_by else ""
        return f"{self.help}{accepted}{shown}{needs}."


def check(where: str, opt: Option, value: Any, gpu: bool = False) -> Any:
    """``value`` checked and converted for ``opt``; None (or "") means the default. ``where``
    names the option in messages (e.g. "The pose option 'threshold'", or a CLI flag)."""
    if value is None or (isinstance(value, str) and value == "" and opt.kind != "choice"):
        return opt.default_for(gpu)
    if opt.kind == "bool":
        if isinstance(value, (bool, np.bool_)) or (not isinstance(value, float) and value in (0, 1)):
            return bool(value)
        raise OptionError(f"{where} must be true or false; got {value!r}.")
    if opt.kind in ("float", "int"):
        return _number(where, opt, value)
    if opt.kind == "choice":
        if not isinstance(value, str) or value not in opt.choices:
            raise OptionError(f"{where} must be one of: {', '.join(opt.choices)}; got {value!r}.")
        return value
    if opt.kind == "classes":
        names = [value] if isinstance(value, (str, int)) else list(value)
        if not names:
            return None
        return opt.resolve(names) if opt.resolve else names
    if opt.kind == "color":
        from ..outputs.render import parse_color

        try:
            return parse_color(value)
        except OptionError as err:
            raise OptionError(f"{where}: {err}") from None
    if opt.kind == "image":
        if not isinstance(value, (str, bytes, bytearray)) and not hasattr(value, "read"):
            raise OptionError(f"{where} must be an image file; got {type(value).__name__}.")
        return value  # read (with its own clear errors and limits) when it is used
    raise AssertionError(opt.kind)  # pragma: no cover - a declaration typo


def _number(where: str, opt: Option, value: Any) -> float | int:
    try:
        num = float(value)
    except (TypeError, ValueError):
        num = math.nan
    low, high = float(opt.low or 0.0), float(opt.high or 0.0)
    if isinstance(value, bool) or not math.isfinite(num) or not (low <= num <= high):
        raise OptionError(f"{where} must be a number from {low:g} to {high:g}; got {value!r}.")
    if opt.kind == "int":
        if num != int(num):
            raise OptionError(f"{where} must be a whole number from {low:g} to {high:g}; got {value!r}.")
        return int(num)
    return num


def resolve(
    task: str,
    options: tuple[Option, ...],
    values: Mapping[str, Any],
    gpu: bool = False,
    where: Callable[[Option], str] | None = None,
) -> dict[str, Any]:
    """THE resolution of a run's inference options, once, before any stage: ``values``' inference
    options (rendering ones are ignored) checked, every default filled in for the device the
    forward runs on. Both sides of a split run (CPU prepare/finish, device forward) get the result."""
    names = {o.name for o in options if o.stage == "infer"}
    return split(task, options, {k: v for k, v in values.items() if k in names}, gpu, where)[0]


def split(
    task: str,
    options: tuple[Option, ...],
    values: Mapping[str, Any],
    gpu: bool = False,
    where: Callable[[Option], str] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Validate ``values`` -> (inference options, rendering options), defaults filled in.

    Unknown names are refused with the list of allowed ones (inference options first). ``where``
    names an option in messages (default: "The <task> option '<name>'").
    """
    where = where or (lambda opt: f"The {task} option {opt.name!r}")
    known = {o.name: o for o in options}
    unknown = sorted(set(values) - set(known))
    if unknown:
        ordered = [o.name for o in options if o.stage == "infer"] + [
            o.name for o in options if o.stage == "render"
        ]
        raise OptionError(
            f"Unknown {task} option {', '.join(map(repr, unknown))}; allowed: {', '.join(ordered) or 'none'}."
        )
    infer: dict[str, Any] = {}
    render: dict[str, Any] = {}
    for opt in options:
        (infer if opt.stage == "infer" else render)[opt.name] = check(
            where(opt), opt, values.get(opt.name), gpu
        )
    return infer, render


__all__ = ["Kind", "Option", "Stage", "check", "resolve", "split"]
