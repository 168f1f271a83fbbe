"""Search-space knobs: their distributions and how Optuna samples them."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from sweeps.spec.probed import ProbedHigh

if TYPE_CHECKING:  # Optuna is imported when a distribution is built: loading a sweep is light
    import optuna

Scalar = bool | int | float | str


def _check_order(low: float, high: float) -> None:
    """A range's ends in order, else an error whose fix says to swap them."""
    if low > high:
        raise PydanticCustomError("range_order", "low {low} exceeds high {high}",
                                  {"low": low, "high": high,
                                   "fix": f"swap them: low: {high}, high: {low}"})


def _step_fits(low: int, high: int, step: int) -> None:
    """``high - low`` a multiple of ``step``, else an error naming ``step`` (its ``at``):
    Optuna would cut the range to the last step below ``high`` (0..60 by 1000 becomes
    0..0, 0..60 by 7 becomes 0..56) with only a warning."""
    span = high - low
    if span % step == 0:
        return
    cut = low + span // step * step
    what = f"every trial would get {low}" if cut == low else \
        f"Optuna would cut the range to {low}..{cut}"
    if cut == low:  # the step is past the range: a step giving at least 5 values
        divisor = max(d for d in range(1, max(1, span // 4) + 1) if span % d == 0)
        fix = f"a step that divides high - low = {span}, e.g. step: {divisor}"
    else:
        divisor = max(d for d in range(1, step) if span % d == 0)
        fix = (f"make high - low a multiple of step, e.g. high: {cut} or {cut + step}, "
               f"or step: {divisor}")
    raise PydanticCustomError(
        "step_fit", "step {step} does not fit the range {low}..{high} (high - low = {span} "
        "is no multiple of {step}): {what}",
        {"step": step, "low": low, "high": high, "span": span, "what": what, "at": "step",
         "fix": fix})


def _no_bool(value: Any) -> Any:
    """A bound given as true/false is a slip, not 1/0 (pydantic would take it as one)."""
    if isinstance(value, bool):
        raise ValueError(f"{str(value).lower()} is no number")
    return value


#: A range bound: a finite number (text such as YAML 1.1's ``1e-5`` is read as one).
Bound = Annotated[float, BeforeValidator(_no_bool)]
#: A whole number: a range bound, a count (``budget.trials: true`` is no count).
IntBound = Annotated[int, BeforeValidator(_no_bool)]


class _Knob(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def is_fixed(self) -> bool:
        return False


class LogUniform(_Knob):
    """A float sampled evenly in log space: ``{type: loguniform, low: 1e-5, high: 1e-1}``."""

    type: Literal["loguniform"]
    low: Bound = Field(gt=0, allow_inf_nan=False, description="lower bound, > 0")
    high: Bound = Field(gt=0, allow_inf_nan=False, description="upper bound, > 0 "
                        "(lr's may be 'probe': the boundary probe sets it)")
    probed: ProbedHigh | None = Field(default=None, description="written by sweeps: where "
                                      "a probed high came from")

    @model_validator(mode="after")
    def _order(self) -> LogUniform:
        _check_order(self.low, self.high)
        return self

    def distribution(self) -> optuna.distributions.BaseDistribution:
        import optuna

        return optuna.distributions.FloatDistribution(self.low, self.high, log=True)


class Uniform(_Knob):
    """A float sampled evenly: ``{type: uniform, low: 0.0, high: 0.3}``."""

    type: Literal["uniform"]
    low: Bound = Field(allow_inf_nan=False)
    high: Bound = Field(allow_inf_nan=False, description="upper bound (lr's may "
                        "be 'probe': the boundary probe sets it)")
    probed: ProbedHigh | None = Field(default=None, description="written by sweeps: where "
                                      "a probed high came from")

    @model_validator(mode="after")
    def _order(self) -> Uniform:
        _check_order(self.low, self.high)
        return self

    def distribution(self) -> optuna.distributions.BaseDistribution:
        import optuna

        return optuna.distributions.FloatDistribution(self.low, self.high)


class IntRange(_Knob):
    """An integer: ``{type: int, low: 0, high: 100, step: 10}`` (``log: true`` for log scale)."""

    type: Literal["int"]
    low: IntBound
    high: IntBound
    step: IntBound = Field(default=1, ge=1)
    log: bool = False

    @model_validator(mode="after")
    def _check(self) -> IntRange:
        _check_order(self.low, self.high)
        if self.log and self.low < 1:
            raise ValueError("a log-scale int range needs low >= 1")
        if self.log and self.step != 1:
            raise ValueError("a log-scale int range takes no step")
        _step_fits(self.low, self.high, self.step)
        return self

    def distribution(self) -> optuna.distributions.BaseDistribution:
        import optuna

        return optuna.distributions.IntDistribution(self.low, self.high, step=self.step,
                                                    log=self.log)


class Categorical(_Knob):
    """One of a list: ``{type: categorical, choices: [none, default]}``."""

    type: Literal["categorical"]
    choices: list[Scalar | None] = Field(min_length=1)

    @model_validator(mode="after")
    def _once_each(self) -> Categorical:
        seen: list[Any] = []
        for choice in self.choices:
            same = next((s for s in seen if _one_value(choice, s)), _NONE)
            if same is not _NONE:
                also = "" if type(same) is type(choice) else \
                    f" ({same!r} and {choice!r} are one number)"
                raise PydanticCustomError(
                    "choice_twice", "{choice} is listed twice{also}",
                    {"choice": choice, "also": also, "fix": "list each choice once (a choice "
                     "listed twice is sampled twice as often)"})
            first = next((s for s in seen if _flag_and_number(choice, s)), _NONE)
            if first is not _NONE:
                raise PydanticCustomError(
                    "choice_bool_number", "{first} and {later} are different choices, but "
                    "Optuna records a sampled choice as the first one equal to it, and "
                    "{later} equals {first}: trials that ran {later} would be recorded and "
                    "modelled as {first}",
                    {"first": _shown(first), "later": _shown(choice), "fix": "use true/false "
                     "or numbers, not both (e.g. choices: [0, 1] or [false, true]), or name "
                     "the choices with strings and map them in your trainer"})
            seen.append(choice)
        numbers = [c for c in self.choices if isinstance(c, (int, float))
                   and not isinstance(c, bool)]
        text = next((c for c in self.choices if isinstance(c, str) and _reads_as_number(c)),
                    None)
        if numbers and text is not None and "e" not in text.lower():  # quoted: '64'
            raise PydanticCustomError(
                "choice_number_text", "'{text}' is text among numbers ({numbers}): it is "
                "quoted, so the trainer would get the string",
                {"text": text, "numbers": ", ".join(map(str, numbers[:3])),
                 "fix": f"write it without quotes ({text.strip()}), or quote every choice "
                 "if they are names"})
        if numbers and text is not None:
            raise PydanticCustomError(
                "choice_number_text", "'{text}' is text among numbers ({numbers}): YAML "
                "reads a number such as 5e-1 without a dot as text, so the trainer would get "
                "the string",
                {"text": text, "numbers": ", ".join(map(str, numbers[:3])),
                 "fix": f"write it with a dot and a signed exponent ({_dotted(text)}) or as a "
                 "decimal, or quote every choice if they are names"})
        return self

    def distribution(self) -> optuna.distributions.BaseDistribution:
        import optuna

        return optuna.distributions.CategoricalDistribution(self.choices)

    def is_fixed(self) -> bool:
        return len(self.choices) == 1


_NONE = object()


def _reads_as_number(text: str) -> bool:
    """Whether ``text`` is a number YAML 1.1 kept as text (``"5e-1"``, ``"1E3"``)."""
    try:
        float(text)
    except ValueError:
        return False
    return text.strip().lower() not in ("nan", "inf", "-inf", "+inf", "infinity")


def _dotted(text: str) -> str:
    """``5e-1`` as YAML 1.1 reads a float: ``5.0e-1``.

    Example:
        >>> _dotted("5e-1"), _dotted("1E3")
        ('5.0e-1', '1.0e+3')
    """
    mantissa, _, exponent = text.strip().lower().partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    if exponent and exponent[0] not in "+-":
        exponent = "+" + exponent
    return f"{mantissa}e{exponent}" if exponent else mantissa


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _one_value(a: Any, b: Any) -> bool:
    """Whether two choices are one value: equal numbers (``1`` and ``1.0``), or equal
    values of one type (``true`` is not the number 1; ``"1"`` is not 1)."""
    if _is_number(a) and _is_number(b):
        return bool(a == b)
    return type(a) is type(b) and bool(a == b)


def _shown(value: Any) -> str:
    """A choice as the sweep file writes it (``true``, not ``True``)."""
    return str(value).lower() if isinstance(value, bool) else repr(value)


def _flag_and_number(a: Any, b: Any) -> bool:
    """A boolean and a number equal to it (``true`` and ``1``, ``false`` and ``0.0``)."""
    return (isinstance(a, bool) and _is_number(b) or isinstance(b, bool) and _is_number(a)) \
        and bool(a == b)


class Fixed(_Knob):
    """A knob held at one value: ``{type: fixed, value: 0.1}`` or just ``0.1``."""

    type: Literal["fixed"]
    value: Any

    def is_fixed(self) -> bool:
        return True


Knob = Annotated[LogUniform | Uniform | IntRange | Categorical | Fixed,
                 Field(discriminator="type")]

KNOB_TYPES = ("loguniform", "uniform", "int", "categorical", "fixed")


def knob_entry(knob: _Knob) -> dict[str, Any]:
    """A knob as its sweep-file entry (JSON types; no ``probed`` record unless it has one)."""
    entry = knob.model_dump(mode="json")
    if entry.get("probed", 0) is None:
        del entry["probed"]
    return entry


def fixed_value(knob: _Knob) -> Any:
    """The value of a knob that cannot vary."""
    if isinstance(knob, Fixed):
        return knob.value
    if isinstance(knob, Categorical) and len(knob.choices) == 1:
        return knob.choices[0]
    raise ValueError("knob is not fixed")


def optuna_space(space: dict[str, _Knob]) -> dict[str, optuna.distributions.BaseDistribution]:
    """Optuna distributions for the knobs that vary (fixed ones are left out)."""
    return {name: k.distribution() for name, k in space.items() if not k.is_fixed()}


def fixed_values(space: dict[str, _Knob]) -> dict[str, Any]:
    """The values of the knobs that do not vary."""
    return {name: fixed_value(k) for name, k in space.items() if k.is_fixed()}


def central_value(knob: _Knob) -> Any:
    """A middle value of a knob's range (geometric middle on a log scale)."""
    if isinstance(knob, Fixed):
        return knob.value
    if isinstance(knob, Categorical):
        return knob.choices[0]
    if isinstance(knob, LogUniform):
        return math.sqrt(knob.low * knob.high)
    if isinstance(knob, Uniform):
        return (knob.low + knob.high) / 2
    if isinstance(knob, IntRange):
        mid = (knob.low + knob.high) // 2
        return knob.low + (mid - knob.low) // knob.step * knob.step
    raise TypeError(type(knob))


def nearest_value(knob: _Knob, value: Any) -> Any | None:
    """The value in a numeric knob's range nearest ``value`` (a bound, or the step grid's
    nearest point); None for a categorical or fixed knob, or a value that is no number.

    Example:
        >>> nearest_value(LogUniform(type="loguniform", low=1e-7, high=1e-3), 0)
        1e-07
        >>> nearest_value(IntRange(type="int", low=0, high=50, step=10), 64)
        50
    """
    if knob.is_fixed() or isinstance(knob, Categorical) or not isinstance(
            value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        return None
    low, high = knob.low, knob.high  # type: ignore[attr-defined]
    near = min(max(value, low), high)
    if isinstance(knob, IntRange):
        steps = round((near - low) / knob.step)
        near = min(low + steps * knob.step, high - (high - low) % knob.step)
        return int(near)
    return float(near)


def off_space(space: dict[str, _Knob], values: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The searched knobs whose value in ``values`` the space does not contain: {knob:
    (value, :func:`nearest_value` in its range, or None)}. Fixed knobs and knobs
    ``values`` leaves out or at None are skipped."""
    return {name: (values[name], nearest_value(knob, values[name]))
            for name, knob in space.items()
            if not knob.is_fixed() and values.get(name) is not None
            and not contains(knob, values[name])}


def contains(knob: _Knob, value: Any) -> bool:
    """Whether ``value`` is one the knob can take."""
    if knob.is_fixed():
        return value == fixed_value(knob)
    if isinstance(knob, Categorical):
        return value in knob.choices
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    dist = knob.distribution()
    try:
        return bool(dist._contains(dist.to_internal_repr(value)))
    except ValueError:  # e.g. 0 on a log scale: Optuna refuses to represent it
        return False


def warmup_steps(value: Any, max_steps: int) -> int | None:
    """The warmup knob's value in steps: a fraction below 1 is a share of ``max_steps``
    (Hugging Face's ``warmup_steps`` reads it so, like ``warmup_ratio``), else a count;
    None for no number.

    Example:
        >>> warmup_steps(20, 300), warmup_steps(0.15, 300), warmup_steps(0, 300)
        (20, 45, 0)
    """
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0 \
            or not math.isfinite(value):
        return None
    if isinstance(value, float) and 0 < value < 1:
        return int(math.ceil(value * max_steps))
    return int(value)
