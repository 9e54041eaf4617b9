"""Preflight and plan: everything judged before anything is created, read-only.

The type's facts (DescribeInstanceTypes, cached), the zones that offer it, members that
already exist, the family's vCPU quota (Service Quotas; warn and go on when unreadable),
the image, the caller's address. The result is a frozen AwsPlan, carried in the Plan.
"""

from __future__ import annotations

import ipaddress
import os
import urllib.request
from dataclasses import dataclass
from typing import Any

from gpuprov import catalog, defaults, platforms
from gpuprov.catalog import InstanceType
from gpuprov.errors import BadInput, GpuprovError
from gpuprov.lock import os_lines
from gpuprov.pricing import live, prices
from gpuprov.providers import ClusterSpec, Plan
from gpuprov.providers.aws import api, options, userdata
from gpuprov.providers.aws.common import DEFAULT_DISK_GB, MAX_COUNT, NODE_USER, SSH_MIN_PREFIX, members

# The image `up` launches when no --image is given: the newest of the --os the user chose, by
# default the one this suite proves (gpuprov/platforms.py). Read from the publisher's public SSM
# parameter, else the publisher's newest image by owner and name (DescribeImages).
# - Debian: its cloud team publishes /aws/service/debian/release/12/latest/{amd64,arm64} (also
#   under .../release/bookworm/...); its images are owned by Debian's account 136693071363 and
#   named debian-12-<arch>-<date>-<build> (Debian's cloud images: https://wiki.debian.org/Cloud/AmazonEC2Image).
#   Checked against public code that reads the same parameter, owner and name pattern (a
#   search of public repositories, 2026-11: Terraform aws_ssm_parameter data sources and Go
#   SSM lookups of "/aws/service/debian/release/12/latest/amd64" and ".../arm64").
#   Login user: admin.
#   Debian 13 (trixie) the same way: /aws/service/debian/release/13/latest/{amd64,arm64}, images of
#   the same account named debian-13-<arch>-<date>-<build> (https://wiki.debian.org/Cloud/AmazonEC2Image/Trixie;
#   checked against public code that reads the same parameter and name pattern, a search of public
#   repositories 2026-11: AWS CDK and Terraform stacks, Go SSM look-ups of
#   "/aws/service/debian/release/13/latest/amd64" and ".../arm64", Terraform filters "debian-13-amd64-*").
# - Canonical: /aws/service/canonical/ubuntu/server/22.04/stable/current/<arch>/hvm/ebs-gp2/ami-id,
#   owner 099720109477. Login user: ubuntu.
#   Ubuntu 24.04 (noble) the same way, its images on gp3 volumes:
#   /aws/service/canonical/ubuntu/server/24.04/stable/current/<arch>/hvm/ebs-gp3/ami-id, images of the
#   same owner named ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-<arch>-server-<date> (checked against
#   public code that reads the same parameter and name pattern, a search of public repositories
#   2026-11: Terraform aws_ssm_parameter data sources and `aws ssm get-parameter` scripts naming
#   ".../24.04/stable/current/amd64/hvm/ebs-gp3/ami-id", Terraform aws_ami filters of owner
#   099720109477 named "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-*").
# gpuprov logs in as neither: the user-data (templates/cloud-init.yaml.j2) makes its own user
# (common.NODE_USER) on every image, so the image's default user is never used.
# {arch} is the Debian/Ubuntu name of the type's CPU architecture, never another's.
DEFAULT_OS = defaults.DEFAULT_AWS_OS
DEBIAN_OWNER = "136693071363"
DEBIAN12_SSM = "/aws/service/debian/release/12/latest/{arch}"
DEBIAN12_NAME = "debian-12-{arch}-*"
DEBIAN13_SSM = "/aws/service/debian/release/13/latest/{arch}"
DEBIAN13_NAME = "debian-13-{arch}-*"
CANONICAL_OWNER = "099720109477"
UBUNTU_SSM = "/aws/service/canonical/ubuntu/server/22.04/stable/current/{arch}/hvm/ebs-gp2/ami-id"
UBUNTU_NAME = "ubuntu/images/hvm-ssd*/ubuntu-jammy-22.04-{arch}-server-*"
UBUNTU2404_SSM = "/aws/service/canonical/ubuntu/server/24.04/stable/current/{arch}/hvm/ebs-gp3/ami-id"
UBUNTU2404_NAME = "ubuntu/images/hvm-ssd*/ubuntu-noble-24.04-{arch}-server-*"
# --os -> (SSM parameter, owner, name pattern)
IMAGE_SOURCES: dict[str, tuple[str, str, str]] = {
    "debian12": (DEBIAN12_SSM, DEBIAN_OWNER, DEBIAN12_NAME),
    "debian13": (DEBIAN13_SSM, DEBIAN_OWNER, DEBIAN13_NAME),
    "ubuntu22.04": (UBUNTU_SSM, CANONICAL_OWNER, UBUNTU_NAME),
    "ubuntu24.04": (UBUNTU2404_SSM, CANONICAL_OWNER, UBUNTU2404_NAME),
}
OS_CHOICES = defaults.AWS_OS
assert tuple(IMAGE_SOURCES) == OS_CHOICES, "an image source for each --os choice (gpuprov.defaults.AWS_OS)"
# EC2's architecture name (ProcessorInfo, Image.Architecture) -> the distributions' name.
DISTRO_ARCH = {"x86_64": "amd64", "arm64": "arm64"}
IP_ECHO_URL = "https://checkip.amazonaws.com"


@dataclass(frozen=True)
class AwsPlan:
    """What plan found out, carried to dry_run and launch in the Plan (``Plan.details``)."""

    spec: ClusterSpec
    aws: api.Aws
    itype: InstanceType
    zones: tuple[str, ...]
    image_id: str
    root_device: str
    ssh_cidr: str
    quota: tuple[str, str, float | None]
    user_data_size: int = 0
    existing: tuple[dict[str, Any], ...] = ()
    notes: tuple[str, ...] = ()
    # The --os whose image this is (debian12, ubuntu22.04); None for an --image or the image
    # the members already run.
    os: str | None = None


def check_spec(spec: ClusterSpec) -> ClusterSpec:
    """What can be judged without AWS (no AWS call for bad input): the type is an EC2 one,
    the reservation id, the SSH range, the disk, the count, the user-data size, the --os.
    Returns ``spec`` with the default --os filled in where no --image is given (so the cluster's
    recorded spec says which OS it was launched with)."""
    opts = options.of(spec)
    if opts.os is not None and opts.os not in IMAGE_SOURCES:
        raise BadInput(f"--os {opts.os}: gpuprov has images for {', '.join(OS_CHOICES)}")
    if opts.os in os_lines.names():
        # An OS the lock data knows: refused here (one line, nothing created) where it has no lock
        # of the package source (Debian 13: NVIDIA's repository names not read yet).
        os_lines.source(opts.os, spec.stack.source or defaults.DEFAULT_SOURCE)
    if opts.capacity_reservation and not opts.capacity_reservation.startswith("cr-"):
        raise BadInput(f"--capacity-reservation {opts.capacity_reservation}: "
                       "expected an id like cr-0123456789abcdef0")
    if opts.ssh_cidr:
        check_cidr(opts.ssh_cidr, allow_wide=opts.allow_wide_ssh_cidr)
    disk = opts.disk_gb or DEFAULT_DISK_GB
    if disk > defaults.MAX_DISK_GB:  # a recorded spec's; the flag is held to it as it is read
        raise BadInput(f"--disk-gb {disk} is more than an EBS gp3 volume holds ({defaults.MAX_DISK_GB} GiB)")
    # With --image, the image's own share is its owner's to know: the floor alone.
    least = defaults.NODE_FREE_GIB + (0 if opts.image else defaults.AWS_IMAGE_ROOT_GIB)
    if disk < least:
        # Launched, such a node would stop in the preflight (its root file system short of the
        # free space the site needs) after its hours had started: refused before anything is made.
        raise BadInput(f"--disk-gb {disk} leaves the node less than the {defaults.NODE_FREE_GIB} GiB free the "
                       f"bootstrap needs (the driver, CUDA, cuDNN, base images and room for a patch)"
                       + ("" if opts.image else f" beside the image's own {defaults.AWS_IMAGE_ROOT_GIB} GiB")
                       + f": give --disk-gb {least} or more "
                       f"(default {DEFAULT_DISK_GB})")
    if (spec.count or 0) > MAX_COUNT:
        raise BadInput(
            f"--count {spec.count} is more than gpuprov launches in one cluster ({MAX_COUNT}: "
            "one all-or-nothing RunInstances in one zone); use several clusters"
        )
    if opts.os is None and not opts.image:
        spec = spec.with_options(os=DEFAULT_OS)
    return spec


def check_type(spec: ClusterSpec) -> None:
    if not spec.instance_type:
        raise BadInput("--type is required for the aws provider (`gpuprov types` lists them)")
    kind = catalog.get(spec.instance_type, region=spec.region)
    if kind.provider != "aws":
        raise BadInput(f"{spec.instance_type} is an {kind.provider} machine, not an EC2 instance type: "
                       "declare it in a hosts file for --provider static")


def make_plan(spec: ClusterSpec) -> Plan:
    """The Plan of ``spec`` (checked by the provider's check_spec), its AwsPlan in ``details``."""
    prep = prepare(spec)
    notes = list(prep.notes)
    price = node_price(prep, notes)
    return Plan(
        spec=spec,
        existing=len(prep.existing),
        billable=True,
        price_per_node_hour=price.usd_per_hour if price else None,
        price=price,
        notes=tuple(notes),
        details=prep,
    )


def node_price(prep: AwsPlan, notes: list[str]) -> Any:
    """One node-hour's price (gpuprov.pricing.prices.Price) in the plan's zones: spot from EC2's
    spot price history, read now (cached); on-demand from the cache of the Price List API, else
    the bundled table. None, with a note saying why, where nothing is known."""
    region, name = prep.aws.region, prep.itype.name
    if not options.of(prep.spec).spot:
        found = prices.on_demand(prep.itype, region)
    else:
        try:
            prices.record_spot(region, live.fetch_spot(prep.aws, [name]))
        except api.Unreachable:
            raise
        except Exception as exc:  # noqa: BLE001  (no ec2:DescribeSpotPriceHistory: no price, say so)
            notes.append(f"warning: spot prices not read ({api.error_code(exc) or type(exc).__name__})")
        zones = {z: p for z, p in prices.spot_by_zone(name, region).items() if z in prep.zones}
        found = min(zones.values(), key=lambda p: p.usd_per_hour) if zones else None
    if found is None:
        notes.append(prices.why_none(prep.itype, region, spot_price=options.of(prep.spec).spot))
    return found


def prepare(spec: ClusterSpec) -> AwsPlan:
    """Read-only AWS calls, in the order the notes tell them."""
    user_data_size = userdata.check_size(spec.name, NODE_USER)
    aws = api.connect(spec.region)
    itype = facts(aws, spec.instance_type or "")
    zones = _zones(aws, itype.name)
    existing = members(aws, spec.name, static=True)
    notes = [f"region {aws.region}; zones offering {itype.name}: {', '.join(zones)}"]
    zones_in_use = sorted({i["Placement"]["AvailabilityZone"] for i in existing})
    if zones_in_use:
        zones = zones_in_use[:1]
        notes.append(f"{len(existing)} member(s) already run in {zones[0]}: the rest goes there")
    quota = _quota(aws, itype, spec, notes)
    image = find_image(aws, spec, itype, existing, notes)
    disk = options.of(spec).disk_gb or DEFAULT_DISK_GB
    notes.append(f"image {image.id}: {image.what}; root volume {disk} GiB gp3, encrypted")
    if options.of(spec).spot:
        notes.append("spot capacity: cheaper, can be interrupted with a 2-minute notice")
    cidr = check_cidr(options.of(spec).ssh_cidr or detect_cidr(), allow_wide=options.of(spec).allow_wide_ssh_cidr)
    notes.append(f"SSH allowed from {cidr} only")
    return AwsPlan(spec=spec, aws=aws, itype=itype, zones=tuple(zones), image_id=image.id,
                   root_device=image.root_device, ssh_cidr=cidr, quota=quota, user_data_size=user_data_size,
                   existing=tuple(existing), notes=tuple(notes), os=image.os)


def facts(aws: api.Aws, name: str) -> InstanceType:
    cached = catalog.cached_types(aws.region, max_age_s=catalog.CACHE_MAX_AGE_S).get(name)
    if cached is not None:
        return cached

    try:
        records = aws.ec2.describe_instance_types(InstanceTypes=[name])["InstanceTypes"]
    except api.ClientError as exc:
        if api.error_code(exc).startswith("InvalidInstanceType"):
            known = [t.name for t in catalog.all_types(aws.region) if t.provider == "aws"]
            raise BadInput(
                f"EC2 has no instance type '{name}' in {aws.region}{catalog.suggest(name, known)}"
            ) from None
        raise GpuprovError(f"DescribeInstanceTypes failed: {api.error_code(exc)}: {api.error_message(exc)}") from None
    if not records:
        raise BadInput(f"EC2 has no instance type '{name}' in {aws.region}")
    found = catalog.record_api_types(aws.region, records)
    if not found:
        raise GpuprovError(f"EC2's DescribeInstanceTypes answer for '{name}' is not a description gpuprov can read")
    return found[0]


def _zones(aws: api.Aws, name: str) -> list[str]:
    pages = aws.ec2.get_paginator("describe_instance_type_offerings").paginate(
        LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": [name]}]
    )
    zones = sorted({o["Location"] for page in pages for o in page["InstanceTypeOfferings"]})
    if not zones:
        raise BadInput(f"{name} is not offered in region {aws.region}; try another --region")
    return zones


def _quota(
    aws: api.Aws, itype: InstanceType, spec: ClusterSpec, notes: list[str]
) -> tuple[str, str, float | None]:
    code, quota_name = catalog.quota_for(itype.name, options.of(spec).spot)
    need = (itype.vcpus or 0) * spec.launch_count
    try:
        answer = aws.client("service-quotas").get_service_quota(ServiceCode="ec2", QuotaCode=code)
        value = float(answer["Quota"]["Value"])
    except api.Unreachable:
        raise
    except Exception as exc:  # noqa: BLE001  (any failure: warn and go on, as documented)
        reason = api.error_code(exc) or type(exc).__name__
        notes.append(
            f"warning: could not read the vCPU quota '{quota_name}' ({code}): {reason}; going on"
        )
        return code, quota_name, None
    if need > value:
        raise BadInput(
            f"--count {spec.count} x {itype.name} needs {need} vCPUs but the quota "
            f"'{quota_name}' ({code}) in {aws.region} is {value:g}; lower --count or request "
            "an increase in the Service Quotas console"
        )
    notes.append(f"vCPU quota '{quota_name}' ({code}): {value:g}, this cluster needs {need}")
    return code, quota_name, value


@dataclass(frozen=True)
class Image:
    id: str
    root_device: str
    what: str  # for the plan's notes: which OS, and how it was chosen
    os: str | None = None


def find_image(aws: api.Aws, spec: ClusterSpec, itype: InstanceType, existing: list[dict[str, Any]],
               notes: list[str]) -> Image:
    """The image new members launch from: --image; else the one the members already run (a
    cluster is one image, whatever the default became since); else the newest of --os (default
    Debian 12) for the type's CPU architecture. Every image is checked to be of that architecture."""
    if spec.image:
        image = _described(aws, spec.image, itype, "--image")
        chosen = options.of(spec).os
        return Image(image["ImageId"], _root(image),
                     "--image" + (f" (wins over --os {chosen})" if chosen else "") + _name(image))
    running = sorted({i["ImageId"] for i in existing if i.get("ImageId")})
    if len(running) == 1:
        try:
            image = _described(aws, running[0], itype, "the members' image")
        except BadInput as exc:
            raise BadInput(f"{exc}; pass --image for the new members") from None
        return Image(image["ImageId"], _root(image),
                     f"the image the {len(existing)} existing member(s) run{_name(image)}")
    chosen = options.of(spec).os or DEFAULT_OS
    return _newest(aws, chosen, itype, notes)


def _described(aws: api.Aws, image_id: str, itype: InstanceType, what: str) -> dict[str, Any]:
    try:
        found = aws.ec2.describe_images(ImageIds=[image_id])["Images"]
    except api.ClientError as exc:
        raise BadInput(f"{what} {image_id}: {api.error_code(exc)}: {api.error_message(exc)}") from None
    if not found:
        raise BadInput(f"{what} {image_id} does not exist in {aws.region}")
    arch = found[0].get("Architecture")
    if arch and arch != itype.cpu_arch:
        raise BadInput(f"{what} {image_id} is an {arch} image but {itype.name} runs {itype.cpu_arch}; "
                       f"choose an {itype.cpu_arch} image")
    return dict(found[0])


def _newest(aws: api.Aws, chosen: str, itype: InstanceType, notes: list[str]) -> Image:
    """The publisher's newest image of ``chosen`` for the type's architecture: its SSM parameter,
    else DescribeImages by owner and name. BadInput naming what was asked when neither has one."""
    platform = platforms.get(chosen)
    if itype.cpu_arch not in DISTRO_ARCH:
        raise BadInput(f"{itype.name} runs {itype.cpu_arch}: no {platform.title} image for it; pass --image")
    arch = DISTRO_ARCH[itype.cpu_arch]
    ssm_name, owner, pattern = IMAGE_SOURCES[chosen]
    parameter, pattern = ssm_name.format(arch=arch), pattern.format(arch=arch)
    # A platform proven in part (Debian 13) says which part of AWS's path is proven.
    proof = "proven here" if platform.proven and not platform.where else (
        f"proven here {platform.aws}" if platform.proven and platform.aws
        else "not proven here: gpuprov's suite runs Debian 12")
    default = "the default" if chosen == DEFAULT_OS else f"--os {chosen}"
    found: list[dict[str, Any]] = []
    try:
        value = aws.client("ssm").get_parameter(Name=parameter)["Parameter"]["Value"]
        found = aws.ec2.describe_images(ImageIds=[value])["Images"]
        why = f"it names {value}, which EC2 does not show" if not found else ""
    except api.Unreachable:
        raise
    except Exception as exc:  # noqa: BLE001  (the public parameter may be absent or unreadable: fall back)
        why = api.error_code(exc) or type(exc).__name__
    if found and found[0].get("Architecture", itype.cpu_arch) != itype.cpu_arch:
        why, found = f"it names an {found[0]['Architecture']} image", []
    if found:
        return Image(found[0]["ImageId"], _root(found[0]),
                     f"{platform.title}, {default} ({proof}), from SSM {parameter}", chosen)
    listed = aws.ec2.describe_images(
        Owners=[owner],
        Filters=[
            {"Name": "name", "Values": [pattern]},
            {"Name": "architecture", "Values": [itype.cpu_arch]},
            {"Name": "state", "Values": ["available"]},
        ],
    )["Images"]
    listed = sorted(listed, key=lambda i: i.get("CreationDate", ""))[-1:]
    if not listed:
        raise BadInput(
            f"no {platform.title} {arch} image found in {aws.region}: SSM parameter {parameter} "
            f"unreadable ({why}) and no image of owner {owner} named {pattern}; pass --image ami-... "
            f"(or another --os: {', '.join(k for k in OS_CHOICES if k != chosen)})"
        )
    notes.append(f"warning: SSM parameter {parameter} unreadable ({why}); took owner {owner}'s "
                 f"newest image named {pattern}")
    return Image(listed[0]["ImageId"], _root(listed[0]),
                 f"{platform.title}, {default} ({proof}), {listed[0].get('Name', '')}", chosen)


def _root(image: dict[str, Any]) -> str:
    return str(image.get("RootDeviceName") or "/dev/sda1")


def _name(image: dict[str, Any]) -> str:
    return f", {image['Name']}" if image.get("Name") else ""


def check_cidr(cidr: str, *, allow_wide: bool = False) -> str:
    """The normalized range SSH is allowed from; BadInput for what is not one, for the
    whole internet (always), and for ranges wider than an IPv4 /16 or an IPv6 /48
    (unless ``allow_wide``: the --allow-wide-ssh-cidr flag)."""
    try:
        net = ipaddress.ip_network(cidr, strict=False)
    except ValueError:
        raise BadInput(f"--ssh-cidr {cidr} is not an address range (example: 203.0.113.7/32)") from None
    if net.prefixlen == 0:
        raise BadInput(f"--ssh-cidr {cidr} would open SSH to the whole internet; give your own address/32")
    widest = SSH_MIN_PREFIX[net.version]
    if net.prefixlen < widest and not allow_wide:
        raise BadInput(
            f"--ssh-cidr {cidr} opens SSH to {net.num_addresses:,} addresses (wider than /{widest}); "
            "give your own address/32, or pass --allow-wide-ssh-cidr if you mean it"
        )
    return str(net)


def detect_cidr() -> str:
    """The caller's public address as a /32 (or /128), from an address echo service."""
    url = os.environ.get("GPUPROV_IP_ECHO_URL", IP_ECHO_URL)
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            text = answer.read(64).decode().strip()
        address = ipaddress.ip_address(text)
    except (OSError, ValueError):
        raise BadInput(
            "could not detect your public address to allow SSH from it; pass --ssh-cidr ADDRESS/32"
        ) from None
    return f"{address}/{address.max_prefixlen}"
