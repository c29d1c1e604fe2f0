"""One reading of "a list" for every parameter that takes one: a list, tuple, range, 1-D numpy array, pandas
Series or Index, or a generator/iterator all become a plain list (numpy scalars as Python numbers, so the
value stores as JSON and compares as the user meant). A bare string, a dict, a set (no order) or a
multi-dimensional array is refused, naming the parameter and the shape wanted."""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Set

from labkit.errors import BadParameter


def _plain(item):
    """A numpy scalar as the Python number or text it holds; anything else unchanged."""
    return item.item() if type(item).__module__ == "numpy" and hasattr(item, "item") and getattr(item, "ndim", 1) == 0 \
        else item


def as_list(name: str, value, example: str = "[1, 2, 4]") -> list:
    """`value` as a plain list, or BadParameter saying what `name` takes (`example` shows one)."""
    if isinstance(value, (str, bytes)):
        raise BadParameter(f"{name} takes a list such as {example}, got the text {value!r}; "
                           f"for one item write [{value!r}]")
    if isinstance(value, (Mapping, Set)):
        kind = "a dict" if isinstance(value, Mapping) else "a set, which has no order"
        raise BadParameter(f"{name} takes a list such as {example}, got {kind}: {value!r}")
    if getattr(value, "ndim", 1) != 1:
        raise BadParameter(f"{name} takes a flat list such as {example}, got a {value.ndim}-dimensional array")
    if hasattr(value, "tolist") and not isinstance(value, Iterator):
        return [_plain(item) for item in value.tolist()]  # numpy arrays, pandas Series and Index
    if isinstance(value, Iterable):
        return [_plain(item) for item in value]
    raise BadParameter(f"{name} takes a list such as {example}, got {type(value).__name__} {value!r}")
