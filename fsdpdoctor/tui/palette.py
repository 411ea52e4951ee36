"""Colours for Rich renderables, taken from the current Textual theme.

Widgets that draw with Rich ``Text`` (tables, bars) cannot use ``$error`` CSS
variables directly, so they resolve them here and redraw when the theme changes.
"""

from __future__ import annotations

from rich.style import Style
from rich.text import Text
from textual.color import Color

from fsdpdoctor.report.format import categories

# category -> theme variable (bars)
CATEGORY_VAR = {
    "compute": "success",
    "optimizer": "primary",
    "exposed comm": "error",
    "data loading": "accent",
    "idle": "foreground-disabled",
}
# severity -> theme variable (text)
SEVERITY_VAR = {"error": "text-error", "warning": "text-warning", "info": "text-primary"}
SEVERITY_BADGE = {"error": "ERR ", "warning": "WARN", "info": "INFO"}
SHORT = {"compute": "compute", "optimizer": "optim", "exposed comm": "exposed comm",
         "data loading": "data", "idle": "idle"}


class Palette:
    def __init__(self, variables: dict[str, str]):
        self.vars = variables
        self.background = Color.parse(variables.get("background", "#000000"))

    @classmethod
    def of(cls, app) -> Palette:
        return cls(app.theme_variables or app.get_css_variables())

    def color(self, var: str) -> str:
        value = self.vars.get(var)
        if not value:
            return "default"
        try:
            c = Color.parse(value)
        except Exception:  # e.g. "auto 60%"
            return "default"
        if c.a < 1:
            c = self.background + c
        return c.hex6

    def style(self, var: str, bold: bool = False) -> Style:
        return Style(color=self.color(var), bold=bold)

    def category(self, name: str) -> Style:
        return self.style(CATEGORY_VAR[name])

    def severity(self, sev: str) -> Style:
        return self.style(SEVERITY_VAR.get(sev, "foreground"), bold=sev == "error")

    @property
    def muted(self) -> Style:
        return self.style("foreground-muted")

    def bar(self, b, width: int, scale_us: float | None = None) -> Text:
        """One breakdown as a bar of ``width`` cells; ``scale_us`` is the duration of a full bar."""
        text = Text(no_wrap=True, overflow="crop")
        total = scale_us or b.duration_us or 1.0
        acc = 0.0
        drawn = 0
        for name, v in categories(b):
            acc += max(v, 0.0)
            end = min(width, round(width * acc / total))
            if end > drawn:
                text.append("█" * (end - drawn), style=self.category(name))
                drawn = end
        return text

    def legend(self) -> Text:
        text = Text()
        for name in CATEGORY_VAR:
            text.append("█ ", style=self.category(name))
            text.append(f"{SHORT[name]}  ")
        return text

