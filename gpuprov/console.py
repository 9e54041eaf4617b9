"""How gpuprov talks to a person: rich's Console on stderr, and providers' progress lines."""

from __future__ import annotations

from collections.abc import Callable


class Console:
    """What the core needs to talk to a person: rich's Console on stderr."""

    def __init__(self, quiet: bool = False) -> None:
        from rich.console import Console as RichConsole

        self.rich = RichConsole(stderr=True, quiet=quiet, highlight=False, soft_wrap=True)

    def say(self, text: str) -> None:
        # A warning reads as an error does: a line of its own that starts `gpuprov:`.
        if text.lstrip().startswith(WARNING):
            text = f"gpuprov: {text.lstrip()}"
        self.rich.print(text, highlight=False, markup=False, emoji=False)  # text, as it came


WARNING = "warning: "  # how every warning starts; said as `gpuprov: warning: ...`


def reporter(console: Console) -> Callable[[str], None]:
    """How providers report progress: one indented line each."""
    return lambda message: console.say(f"  {message}")
