"""How the lab's tables and facts look where people read them: whole and rounded.

pandas cuts a cell after 50 characters (a `vllm serve` line, an audit flag, a peak's source), hides columns
and rows behind `...`, and writes a column that mixes magnitudes with six decimals (`init_s 398.390900`) or
in scientific notation (`7.373e+04`); a dict in a notebook prints as one long line of braces. The lab's own
tables and fact records are returned as `Whole` frames and `Facts` dicts: the same data, shown whole with
numbers rounded to four significant digits, in HTML (JupyterLab wraps long text at its spaces) and in plain
text (a stored notebook's text/plain, a terminal, a log) alike.
"""
from __future__ import annotations

import functools
import html
import math

import pandas as pd

MAX_ROWS = 200  # a longer table is cut in the middle, said by pandas; the lab's own tables are shorter


def number(value) -> str:
    """A float for people: four significant digits, never in scientific notation; integers as they are."""
    if isinstance(value, bool) or not isinstance(value, float):
        return str(value)
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    if abs(value) >= 1000:
        return f"{value:.0f}"
    places = max(0, 3 - math.floor(math.log10(abs(value))))
    return f"{value:.{min(places, 8)}f}".rstrip("0").rstrip(".") if places else f"{value:.0f}"


def signed(value) -> str:
    """number() with its sign: '+21.2', '-9.4'."""
    return ("+" if value > 0 else "") + number(float(value))


def _options():
    return pd.option_context("display.max_colwidth", None, "display.max_columns", None, "display.width", 250,
                             "display.max_rows", MAX_ROWS, "display.float_format", number)


class Whole(pd.DataFrame):
    """A DataFrame that shows whole: no cell, column or short table cut, numbers rounded. Frames derived from
    it (`.round()`, `.loc[...]`, a selection of columns) show the same way.

    A headline table (`with_detail`) also carries a sentence above it and a detail table behind it: in HTML the
    detail is a collapsed `<details>` block under the table (no widget: it survives papermill, a committed
    notebook and a static HTML page), in plain text it follows the table, so the text form loses nothing. A
    frame derived from a headline is a table of its own: it carries neither."""

    _caption = ""  # one sentence above the table
    _detail = None  # the table behind this one, or None
    _detail_summary = ""  # the line that opens it

    @property
    def _constructor(self):
        return Whole

    def _index_says_something(self) -> bool:
        """False for an index of the row numbers 0..n-1 only: it says nothing, and is not shown."""
        return not (isinstance(self.index, pd.RangeIndex) and self.index.start == 0 and self.index.step == 1)

    def _repr_html_(self):
        with _options():
            table = self.to_html(index=self._index_says_something(), notebook=True, max_rows=MAX_ROWS, float_format=number)
        caption = f"<p>{html.escape(self._caption)}</p>" if self._caption else ""
        if self._detail is None:
            return caption + table
        return (f"{caption}{table}<details><summary>{html.escape(self._detail_summary)}</summary>"
                f"{whole(self._detail)._repr_html_()}</details>")

    def __repr__(self):
        with _options():
            table = self.to_string(index=self._index_says_something(), max_rows=MAX_ROWS, float_format=number)
        parts = [self._caption, table] if self._caption else [table]
        if self._detail is not None:
            parts += ["", f"{self._detail_summary}:", repr(whole(self._detail))]
        return "\n".join(parts)


def whole(frame: pd.DataFrame) -> Whole:
    """The frame, shown whole (its attrs kept)."""
    if isinstance(frame, Whole):
        return frame
    shown = Whole(frame)
    shown.attrs = dict(frame.attrs)
    return shown


def with_detail(headline: pd.DataFrame, detail: pd.DataFrame | None, summary: str, caption: str = "") -> Whole:
    """A short headline table with the full one behind it: `caption` above the headline, `detail` collapsed
    under it in HTML (opened by `summary`) and printed after it as text. No detail: the headline alone."""
    shown = Whole(headline)  # a new frame: the headline's own attributes, whatever `headline` carried
    shown.attrs = dict(headline.attrs)
    object.__setattr__(shown, "_caption", caption)
    if detail is not None:
        object.__setattr__(shown, "_detail", detail)
        object.__setattr__(shown, "_detail_summary", summary)
    return shown


def shows_whole(function):
    """A decorator: the DataFrame the function returns comes back as a Whole."""
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        found = function(*args, **kwargs)
        return whole(found) if isinstance(found, pd.DataFrame) else found
    return wrapper


class Facts(dict):
    """A dict of facts that reads as a two-column table in a notebook and as one line per fact as text."""

    def _lines(self) -> list[tuple[str, str]]:
        return [(str(k), _text(v)) for k, v in self.items()]

    def __repr__(self):
        width = max((len(k) for k, _ in self._lines()), default=0)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in self._lines())

    def _repr_pretty_(self, printer, cycle):
        printer.text(repr(self))

    def _repr_html_(self):
        rows = "".join(f"<tr><th style='text-align:left'>{html.escape(k)}</th><td style='text-align:left'>"
                       f"{html.escape(v)}</td></tr>" for k, v in self._lines())
        return f"<table>{rows}</table>"


def _text(value) -> str:
    if isinstance(value, float):
        return number(value)
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_text(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(_text(v) for v in value)
    return str(value)


def decimals(value: float, low: float = float("nan"), high: float = float("nan")) -> int:
    """The decimals an interval supports: the half-width's first significant digit is the last one shown (no
    interval, or one of zero width: four significant digits of the value)."""
    half = (high - low) / 2 if math.isfinite(high - low) else 0.0
    if half > 0:
        return min(6, max(0, -math.floor(math.log10(half))))
    if not math.isfinite(value) or value == 0:
        return 0
    return min(6, max(0, 3 - math.floor(math.log10(abs(value)))))


def cell(value: float, low: float, high: float) -> str:
    """'value [low, high]', rounded to what the interval supports, never in scientific notation."""
    if not math.isfinite(value):
        return "n/a"
    places = decimals(value, low, high)
    if not (math.isfinite(low) and math.isfinite(high)):
        return f"{value:.{places}f}"
    return f"{value:.{places}f} [{low:.{places}f}, {high:.{places}f}]"


def change(value: float, low: float, high: float) -> str:
    """A relative change with its interval: '+3.2% [+1.0%, +5.5%]', or the change alone where there is no
    interval (too few trials)."""
    if not math.isfinite(value):
        return "n/a"
    if not (math.isfinite(low) and math.isfinite(high)):
        return f"{value:+.1%}"
    return f"{value:+.1%} [{low:+.1%}, {high:+.1%}]"
