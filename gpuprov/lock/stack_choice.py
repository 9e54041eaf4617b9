"""What a command asks of the version lock (`--cuda`, `--driver`, `--source`, `--kernel-module`,
`--gpu-sharing`, the mirror's URL and key), typed and checked: a leaf, so the command line builds it without
loading the lock's data (gpuprov.lock.stack resolves it)."""

from __future__ import annotations

from dataclasses import dataclass

from gpuprov import validate
from gpuprov.defaults import KERNEL_MODULES, PACKAGE_SOURCES
from gpuprov.errors import BadInput
from gpuprov.sharing import choice as sharing_choice

# The CUDA lines gpuprov resolves but does not install from every source: those data/stack.toml
# does not mark `installable`, each with the sources it does install them from
# (`installable_sources`; a leaf does not read the data: tests/unit/test_cuda_lines.py holds the
# two equal). The command line refuses them first, with its own words
# (gpuprov.cli.stack.cuda_for_install); this check keeps a caller that skips the command line
# from installing a line the roles do not know. A release the data lacks goes on to the
# resolver, which says which CUDA the GPUs need or which lines there are.
NOT_INSTALLED_CUDA: dict[str, tuple[str, ...]] = {"12.4": ("distro",), "12.9": (), "13.0": ("mirror",)}


@dataclass(frozen=True)
class StackChoice:
    """What a command was asked of the version lock (`--cuda`, `--driver`, `--source`,
    `--kernel-module`, the mirror's URL and key); None: the default (a new cluster) or the
    lock's (a cluster that has one)."""

    cuda: str | None = None
    driver: str | None = None
    source: str | None = None
    kernel_module: str | None = None
    mirror_url: str | None = None
    mirror_key_fingerprint: str | None = None
    # `--gpu-sharing` (mig:LAYOUT, mps, shard:N, none): its form checked here, the layout against
    # the hosts' GPUs by the resolver (gpuprov.sharing.layouts).
    gpu_sharing: str | None = None

    def checked(self) -> StackChoice:
        """The choice with each value checked (BadInput, one line) and the fingerprint
        normalised."""
        if self.source is not None and self.source not in PACKAGE_SOURCES:
            raise BadInput(f"unknown package source '{self.source}'; choose one of: {', '.join(PACKAGE_SOURCES)}")
        if self.kernel_module is not None and self.kernel_module not in KERNEL_MODULES:
            raise BadInput(f"unknown kernel module '{self.kernel_module}'; choose {' or '.join(KERNEL_MODULES)}")
        if self.cuda in NOT_INSTALLED_CUDA and self.source not in NOT_INSTALLED_CUDA[self.cuda]:
            raise BadInput(f"--cuda {self.cuda}: gpuprov resolves this CUDA line but does not install it yet "
                           f"from this package source (`gpuprov stack --type TYPE --cuda {self.cuda}` shows its lock)")
        return StackChoice(
            cuda=validate.cuda(self.cuda) if self.cuda else None,
            driver=validate.driver(self.driver) if self.driver else None,
            source=self.source or None,
            kernel_module=self.kernel_module or None,
            mirror_url=validate.mirror_url(self.mirror_url) if self.mirror_url else None,
            mirror_key_fingerprint=(validate.key_fingerprint(self.mirror_key_fingerprint)
                                    if self.mirror_key_fingerprint else None),
            gpu_sharing=(sharing_choice.parse(self.gpu_sharing).spelled() or "none"
                         if self.gpu_sharing is not None else None),
        )

    def asked(self) -> dict[str, str]:
        """The lock's fields this choice names ({field: value}; the mirror is a setting;
        gpu_sharing "none" when none is asked by name)."""
        return {k: v for k, v in (("cuda", self.cuda), ("driver", self.driver), ("source", self.source),
                                  ("kernel_module", self.kernel_module), ("gpu_sharing", self.gpu_sharing)) if v}

    def mirror(self) -> dict[str, str]:
        """The mirror flags as the settings read them (gpuprov.settings)."""
        return {k: v for k, v in (("mirror_url", self.mirror_url),
                                  ("mirror_key_fingerprint", self.mirror_key_fingerprint)) if v}
