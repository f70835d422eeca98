"""The one exception for a user's mistake, and the schema gate every file format passes through.

:class:`InputError` is a :class:`ValueError` (so ``except ValueError`` keeps working) whose
message names where the bad value came from (a file, a CLI flag or a Python argument), the field
and the value. The CLI turns it into one line on stderr and exit status 2 — never a traceback.

Every file format rpeg reads (workload TOML, hardware JSON, Hugging Face ``config.json``, result
JSON, trace JSON, checkpoint manifests) is described by a pydantic model with
``extra="forbid"`` and strict types, and read through :func:`validate`, which turns pydantic's
field-path errors into one :class:`InputError` ("unknown key 'ac_shareing', did you mean
'ac_sharing'?").
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import numbers
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, TypeVar, Union

from pydantic import BaseModel, ConfigDict, ValidationError

__all__ = [
    "MAX_SEED",
    "InputError",
    "Strict",
    "check_int",
    "check_output",
    "check_output_dir",
    "check_positive_int",
    "check_seconds",
    "check_seed",
    "check_type",
    "describe",
    "key_hint",
    "read_json",
    "require_file",
    "seed_flag",
    "tagged",
    "validate",
    "writing_output",
]

M = TypeVar("M", bound=BaseModel)


class InputError(ValueError):
    """A user's input is wrong: a file, a field, a flag or an argument.

    Parameters
    ----------
    message
        The whole message; it names the source, the field and the value.
    source
        The file (or ``"--flag"``, or ``"argument name"``) the value came from, if known.
    field
        The dotted field path inside ``source``, if any.
    """

    def __init__(self, message: str, *, source: str | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.source = source
        self.field = field


class Strict(BaseModel):
    """Base of every file schema: unknown keys are errors, nothing is coerced silently
    (``"no"`` is not a bool, ``95.7`` is not an int, ``"3"`` is not a number), instances are
    frozen."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


#: Prefix of the tags of tagged unions (:func:`tagged`); they are not fields and leave the path.
TAG = "§"


def tagged(members: dict[str, Any], pick: Any, what: str) -> Any:
    """A union whose member is chosen by ``pick(value) -> tag | None`` (errors then speak of the
    chosen member's fields only, and a value no member takes is reported as ``what``)."""
    from pydantic import Discriminator, Tag

    union = Union[tuple(Annotated[t, Tag(TAG + name)] for name, t in members.items())]  # noqa: UP007

    def choose(value: Any) -> str | None:
        name = pick(value)
        return None if name is None else TAG + name

    return Annotated[union, Discriminator(choose, custom_error_type="kind", custom_error_message=what)]


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, str) and part.startswith(TAG):
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _known_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Field names (and aliases) of the sub-model that ``loc`` (ending in the bad key) points into."""
    current: Any = model
    for part in loc[:-1]:
        if isinstance(part, int) or str(part).startswith(TAG):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            continue
        info = current.model_fields.get(part)
        if info is None:
            return []
        ann = info.annotation
        current = _first_model(ann)
        if current is None:
            return []
    if not (isinstance(current, type) and issubclass(current, BaseModel)):
        return []
    names = []
    for name, info in current.model_fields.items():
        names.append(info.alias or name)
    return names


def _first_model(ann: Any) -> type[BaseModel] | None:
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for arg in getattr(ann, "__args__", ()) or ():
        found = _first_model(arg)
        if found is not None:
            return found
    return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def key_hint(key: str, known: list[str] | tuple[str, ...]) -> str:
    """What follows "unknown key 'x'": ``", did you mean 'y'?"`` for a close known key, else
    ``"; known keys: a, b"`` (empty when none are known)."""
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    if close:
        return f", did you mean {close[0]!r}?"
    return f"; known keys: {', '.join(known)}" if known else ""


def describe(exc: ValidationError, model: type[BaseModel], source: str) -> InputError:
    """One :class:`InputError` from pydantic's errors (an unknown key first, else the first one):
    source, field path, problem, value."""
    errors = exc.errors(include_url=False)
    # a misspelt key also makes its field "missing": name the misspelling, which explains both
    err = next((e for e in errors if e.get("type") == "extra_forbidden"), errors[0])
    loc = tuple(err.get("loc", ()))
    field = _loc(loc)
    kind = err.get("type", "")
    if kind == "extra_forbidden":
        key = str(loc[-1]) if loc else "?"
        parent = _loc(loc[:-1])
        where = f" in [{parent}]" if parent else ""
        hint = key_hint(key, _known_keys(model, loc))
        return InputError(f"{source}: unknown key {key!r}{where}{hint}", source=source, field=field)
    if kind == "missing":
        return InputError(f"{source}: missing field {field!r}", source=source, field=field)
    msg = err.get("msg", "invalid value")
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    msg = re.sub(r" or instance of \w+", "", msg).replace("valid dictionary", "table (object)")
    value = err.get("input")
    return InputError(
        f"{source}: field {field or '(top level)'!r}: {msg} (got {_short(value)})", source=source, field=field
    )


def validate(model: type[M], data: Any, source: str) -> M:
    """Validate plain data (parsed TOML/JSON) against ``model``.

    Raises
    ------
    InputError
        Naming ``source``, the field path and the value of the first problem.
    """
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise describe(exc, model, source) from None


def require_file(path: str | Path, what: str) -> Path:
    """``path`` as a :class:`Path` if it is an existing regular file.

    Raises
    ------
    TypeError
        If ``path`` is not a ``str`` or a path object (``None``), naming ``what``.
    InputError
        ``"<what> 'x' does not exist"`` or ``"... is a directory"``.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            f"{what} must be a path (str or pathlib.Path), got {type(path).__name__} {_short(path)}"
        )
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{what} {str(path)!r} is a directory, not a file", source=str(path))
    if not p.is_file():
        raise InputError(f"{what} {str(path)!r} does not exist", source=str(path))
    return p


def read_json(path: str | Path, what: str) -> Any:
    """Parse the JSON file at ``path``; NaN/Infinity literals are refused.

    Raises
    ------
    InputError
        If the file is missing, unreadable or not valid JSON (the message names the file).
    """
    p = require_file(path, what)

    def _no_constants(name: str) -> Any:
        raise ValueError(f"{name} is not a number JSON allows")

    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{what} {str(path)!r} cannot be read ({exc})", source=str(path)) from None
    try:
        return json.loads(text, parse_constant=_no_constants)
    except ValueError as exc:  # JSONDecodeError is a ValueError
        raise InputError(f"{what} {str(path)!r}: not valid JSON ({exc})", source=str(path)) from None


def check_output(
    path: str | os.PathLike | None, flag: str, suffixes: tuple[str, ...] | None = None
) -> Path | None:
    """Refuse an output path that cannot be written, before any work starts.

    The file is opened for appending (created and removed again if it did not exist), which is
    the only check that also holds for root and read-only file systems.

    Raises
    ------
    InputError
        ``flag`` and the path, with why (a directory, a missing folder, not writable, a suffix
        that is not one of ``suffixes``).
    """
    if path is None:
        return None
    p = Path(path)
    path = str(path)
    if p.is_dir() or path.endswith(("/", "\\")):
        raise InputError(f"{flag} {path!r} is a directory; give a file name", source=flag)
    if suffixes is not None and p.suffix.lower() not in suffixes:
        raise InputError(f"{flag} {path!r}: the file name must end in {', '.join(suffixes)}", source=flag)
    if not p.parent.is_dir():
        raise InputError(f"{flag} {path!r}: folder {str(p.parent)!r} does not exist", source=flag)
    existed = p.exists()
    try:
        with p.open("a"):
            pass
    except OSError as exc:
        raise InputError(f"{flag} {path!r} cannot be written ({exc.strerror or exc})", source=flag) from None
    if not existed:
        p.unlink(missing_ok=True)
    return p


@contextmanager
def writing_output(path: str | os.PathLike, flag: str) -> Iterator[None]:
    """Write the output ``flag`` names inside this block: an ``OSError`` while writing (a full
    disk, ``/dev/full``, a file removed or made read-only since :func:`check_output`) becomes
    one :class:`InputError` naming the flag, the path and the system's reason.

    Raises
    ------
    InputError
        ``"--json '/dev/full' could not be written (No space left on device)"``.
    """
    try:
        yield
    except OSError as exc:
        raise InputError(
            f"{flag} {str(path)!r} could not be written ({exc.strerror or exc})", source=flag
        ) from None


def check_output_dir(path: str | os.PathLike, what: str) -> Path:
    """``path`` as a :class:`Path` if it is, or can be created as, a writable directory (nothing
    is created: the nearest existing ancestor is probed with a temporary file).

    Raises
    ------
    InputError
        If ``path`` (or an ancestor) is a file, or the directory cannot be written.
    """
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise InputError(f"{what} {str(path)!r} is a file, not a directory", source=what)
    probe = p
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise InputError(f"{what} {str(path)!r}: {str(probe)!r} is a file, not a directory", source=what)
    try:
        if not os.access(probe, os.W_OK | os.X_OK):
            raise PermissionError(13, "permission denied")
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as exc:
        raise InputError(
            f"{what} {str(path)!r} cannot be written ({exc.strerror or exc} in {str(probe)!r})", source=what
        ) from None
    return p


def check_type(name: str, value: Any, types: type | tuple[type, ...], what: str = "") -> None:
    """Raise ``TypeError`` naming the argument when ``value`` is not an instance of ``types``
    (``bool`` never counts as a number)."""
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in _as_tuple(types))
    if not ok:
        want = what or " or ".join(t.__name__ for t in _as_tuple(types))
        raise TypeError(f"{name} must be {want}, got {type(value).__name__} {_short(value)}")


def _as_tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def check_positive_int(name: str, value: Any) -> int:
    """``value`` as a plain ``int`` if it is an integer ``≥ 1`` (NumPy's integers included,
    ``bool`` never); ``TypeError`` for another type, ``ValueError`` below 1."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a positive integer, got {type(value).__name__} {_short(value)}")
    if value < 1:
        raise ValueError(f"{name} must be a positive integer, got {_short(int(value))}")
    return int(value)


def check_seconds(
    name: str, value: Any, *, allow_none: bool = True, allow_zero: bool = False
) -> float | None:
    """A finite positive number of seconds (or ``None``; with ``allow_zero`` also 0: a cost or
    delay rather than a budget); ``TypeError``/``ValueError`` naming it."""
    if value is None and allow_none:
        return None
    kind = "non-negative" if allow_zero else "positive"
    check_type(name, value, (int, float), f"a {kind} finite number of seconds")
    if not (math.isfinite(value) and (value >= 0 if allow_zero else value > 0)):
        raise ValueError(f"{name} must be a {kind} finite number of seconds, got {value!r}")
    return float(value)


def check_int(name: str, value: Any, lo: int | None = None, hi: int | None = None) -> int:
    """``value`` as a plain ``int`` if it is an integer in ``[lo, hi]`` (either bound optional).

    Any :class:`numbers.Integral` is taken (NumPy's ``np.int64`` included); ``bool`` never is.

    Raises
    ------
    TypeError
        For another type (``2.0``, ``"3"``, ``True``), naming ``name`` and the value.
    ValueError
        Out of range, naming ``name``, the range and the value.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {_short(value)}")
    number = int(value)
    if (lo is not None and number < lo) or (hi is not None and number > hi):
        low = "-inf" if lo is None else f"{lo:,}"
        high = "inf" if hi is None else f"{hi:,}"
        raise ValueError(f"{name} must be an integer in [{low}, {high}], got {_short(number)}")
    return number


#: Largest seed: what every engine takes (OR-Tools' and HiGHS' ``random_seed`` are signed 32-bit
#: integers; NumPy's generators refuse negative seeds), so a seed means the same to every method.
MAX_SEED = 2**31 - 1


def check_seed(name: str, value: Any) -> int:
    """``value`` as a plain ``int`` if it is a seed every engine takes, ``0 ≤ seed ≤``
    :data:`MAX_SEED`.

    Raises
    ------
    TypeError, ValueError
        Naming ``name`` (the argument or ``--flag``) and the value.
    """
    check_int(name, value)
    if not 0 <= value <= MAX_SEED:
        raise ValueError(
            f"{name} must be an integer in [0, {MAX_SEED}] (the seeds every engine takes: OR-Tools' "
            f"random_seed is a 32-bit integer), got {_short(int(value))}"
        )
    return int(value)


def seed_flag(text: str) -> int:
    """argparse ``type=`` of every ``--seed`` flag: an integer in ``[0, MAX_SEED]``
    (:func:`check_seed`); argparse names the flag in its error."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer in [0, {MAX_SEED}], got {text!r}") from None
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(
            f"must be an integer in [0, {MAX_SEED}] (OR-Tools' random_seed is a 32-bit integer), "
            f"got {_short(text)}"
        )
    return value
