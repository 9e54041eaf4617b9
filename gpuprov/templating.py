"""The one Jinja environment for every file gpuprov renders (templates/).

Autoescaping is chosen per format: HTML/XML would be escaped, the formats gpuprov renders
(ansible.cfg, cloud-init YAML) are not HTML, so their templates quote what they insert
themselves (`tojson` for YAML strings). Undefined names are errors, never empty strings.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from gpuprov import paths


@lru_cache(maxsize=1)
def environment() -> Any:
    import jinja2

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(paths.templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=jinja2.select_autoescape(enabled_extensions=("html", "xml"), default=False),
    )


def render(template: str, context: dict[str, Any]) -> str:
    return environment().get_template(template).render(context)
