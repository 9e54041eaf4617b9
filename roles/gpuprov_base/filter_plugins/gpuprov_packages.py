"""gpuprov_packages_missing: which package specs dpkg does not show installed as asked.

A spec is ``NAME`` (installed at any version) or ``NAME=VERSION`` (installed at a version
that matches VERSION, which may hold apt's ``*`` wildcard, as the apt module's names do).
``lines`` are dpkg-query's ``${Package}\\t${Version}\\t${db:Status-Abbrev}`` lines; a package is
installed when the status's second letter is ``i`` (``ii``, or ``hi`` when held). The roles use it to open apt's cache (seconds
on a node with full package lists) only when something is missing.
"""

from __future__ import annotations

from fnmatch import fnmatchcase


def gpuprov_packages_missing(specs: list[str], lines: list[str]) -> list[str]:
    installed: dict[str, str] = {}
    for line in lines:
        fields = line.split("\t")
        # Status-Abbrev: wanted action (i install, h hold, ...), then the state (i installed).
        if len(fields) == 3 and fields[2][1:2] == "i":
            installed[fields[0].split(":", 1)[0]] = fields[1]
    missing = []
    for spec in specs:
        name, _, version = str(spec).partition("=")
        have = installed.get(name.split(":", 1)[0])
        if have is None or (version and not fnmatchcase(have, version)):
            missing.append(str(spec))
    return missing


class FilterModule:
    def filters(self):
        return {"gpuprov_packages_missing": gpuprov_packages_missing}
