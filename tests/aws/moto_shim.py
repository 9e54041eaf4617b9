"""Test fixture: an HTTP shim in front of moto's server, for what moto lacks.

This is a test double, never product code. boto3 reaches it through
``AWS_ENDPOINT_URL`` exactly as it would reach AWS; it forwards to a real
moto server and adds:

- a call log: every API call by service and action, with its parameters
  (the query form EC2 speaks), so tests count calls and check what was sent
  (moto does not record ``InterfaceType``/``NetworkCardIndex``);
- placement groups (moto answers CreatePlacementGroup with a 500);
- ClientToken idempotency like EC2's (off by default: moto has none, and
  the product must not rely on it);
- what EC2 does to launches with several network interfaces: no public
  address until an elastic IP is attached;
- a vCPU quota answer from Service Quotas, and the public Ubuntu SSM
  parameter, when a test asks for them;
- injected faults: an error for an action (optionally only in one zone, only
  N times), and a hold after RunInstances so a test can kill the client;
- per-zone capacity (``capacity``), which TerminateInstances gives back, as on EC2;
- DescribeInstanceTopology (moto has none): the network nodes a test gives each instance
  (``topology``), answered in EC2's shape for the instances asked;
- optionally (``nodes``: ``ec2_nodes.Ec2Nodes``), instances that are real nodes: each
  launched instance boots a systemd node container running its user-data, its public
  address is the node's, TerminateInstances removes it, GetConsoleOutput reads it,
  CreateImage commits it (the AMI boots that commit).
"""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlencode


@dataclass
class Fault:
    action: str
    code: str
    message: str = "injected by the test shim"
    zone: str | None = None
    times: int | None = None  # None: every time
    status: int = 400
    dry_run: bool = False  # True: answer only DryRun calls (a refused permission)


@dataclass
class Call:
    service: str
    action: str
    params: dict[str, str]
    dry_run: bool = False


MUTATING_PREFIXES = (
    "Run", "Create", "Delete", "Import", "Authorize", "Revoke", "Terminate", "Allocate",
    "Associate", "Disassociate", "Release", "Modify", "Attach", "Detach", "Stop", "Start",
    "Copy", "Deregister", "Register",
)


@dataclass
class Shim:
    moto: str  # host:port of the moto server
    calls: list[Call] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    idempotent_tokens: bool = False
    quotas: dict[str, float] = field(default_factory=dict)
    ssm_parameters: dict[str, str] = field(default_factory=dict)
    hold_after_run: bool = False
    held: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    placement_groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    tokens: dict[str, bytes] = field(default_factory=dict)
    multi_nic: set[str] = field(default_factory=set)
    eips: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    url: str = ""
    nodes: Any = None  # ec2_nodes.Ec2Nodes: launched instances become real nodes
    # Instances of the launched type a zone can still give (EC2's MinCount/MaxCount: fewer than
    # MinCount is InsufficientInstanceCapacity, else at most what is left); no entry: unlimited.
    capacity: dict[str, int] = field(default_factory=dict)
    placed: dict[str, str] = field(default_factory=dict)  # instance id -> zone, where capacity is counted
    topology: dict[str, list[str]] = field(default_factory=dict)  # instance id -> its network nodes, top first

    # -- what tests read -----------------------------------------------------------
    def actions(self, service: str = "ec2", include_dry_run: bool = False) -> list[str]:
        return [c.action for c in self.calls if c.service == service and (include_dry_run or not c.dry_run)]

    def mutating(self) -> list[str]:
        return [c.action for c in self.calls if c.action.startswith(MUTATING_PREFIXES) and not c.dry_run]

    def run_calls(self) -> list[Call]:
        return [c for c in self.calls if c.action == "RunInstances" and not c.dry_run]

    def reset(self) -> None:
        self.calls.clear()
        self.faults.clear()
        self.placement_groups.clear()
        self.tokens.clear()
        self.multi_nic.clear()
        self.eips.clear()
        self.quotas.clear()
        self.ssm_parameters.clear()
        self.capacity.clear()
        self.placed.clear()
        self.topology.clear()
        self.idempotent_tokens = False
        self.hold_after_run = False
        self.held.clear()
        self.release.clear()

    # -- handling ------------------------------------------------------------------------
    def handle(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str], bytes]:
        service = _service(headers)
        target = headers.get("X-Amz-Target") or headers.get("x-amz-target") or ""
        params = dict(parse_qsl(body.decode())) if not target else {}
        action = params.get("Action") or target.rsplit(".", 1)[-1] or "?"
        json_params = json.loads(body or b"{}") if target else {}
        dry = params.get("DryRun") == "true"
        with self.lock:
            self.calls.append(Call(service, action, params or {k: str(v) for k, v in json_params.items()}, dry))
            if self.hold_after_run and any(c.action == "RunInstances" and not c.dry_run for c in self.calls[:-1]):
                self.held.set()
        if self.held.is_set():
            self.release.wait(60)
            return 503, {}, b""
        fault = self._fault(action, params)
        if fault is not None:
            return fault.status, {"Content-Type": "text/xml"}, _error(fault.code, fault.message)
        if service == "servicequotas" and action == "GetServiceQuota" and json_params.get("QuotaCode") in self.quotas:
            code = json_params["QuotaCode"]
            return 200, {"Content-Type": "application/x-amz-json-1.1"}, json.dumps(
                {"Quota": {"ServiceCode": "ec2", "QuotaCode": code, "QuotaName": code, "Value": self.quotas[code]}}
            ).encode()
        if service == "ssm" and action == "GetParameter" and json_params.get("Name") in self.ssm_parameters:
            name = json_params["Name"]
            return 200, {"Content-Type": "application/x-amz-json-1.1"}, json.dumps(
                {"Parameter": {"Name": name, "Type": "String", "Value": self.ssm_parameters[name], "Version": 1}}
            ).encode()
        if action.endswith("PlacementGroup") or action == "DescribePlacementGroups":
            return self._placement(action, params)
        if action == "RunInstances":
            return self._run(method, path, headers, body, params)
        if action == "DescribeInstanceTopology" and not dry:
            asked = [v for k, v in params.items() if re.fullmatch(r"InstanceId\.\d+", k)]
            items = "".join(f"<item><instanceId>{iid}</instanceId><networkNodeSet>"
                            + "".join(f"<item>{nn}</item>" for nn in self.topology[iid])
                            + "</networkNodeSet></item>" for iid in asked if iid in self.topology)
            return 200, {"Content-Type": "text/xml"}, _ok(action, f"<instanceSet>{items}</instanceSet>")
        if action == "GetConsoleOutput" and self.nodes is not None and not dry:
            return 200, {"Content-Type": "text/xml"}, self.nodes.console(params.get("InstanceId", ""))
        tag_later = None
        if action in ("CreateImage", "CopyImage") and not dry:
            body, tag_later = self._image_tags(action, dict(parse_qsl(body.decode(), keep_blank_values=True)), headers)
        status, out_headers, data = self._forward(method, path, headers, body)
        if tag_later is not None and status == 200:
            tag_later(data)
        if action == "TerminateInstances" and status == 200 and not dry:
            ids = [v for k, v in params.items() if re.fullmatch(r"InstanceId\.\d+", k)]
            for iid in ids:  # a terminated instance's capacity is the zone's again
                zone = self.placed.pop(iid, None)
                if zone in self.capacity:
                    self.capacity[zone] += 1
            if self.nodes is not None:
                self.nodes.terminated(ids)
        if action == "CreateImage" and status == 200 and self.nodes is not None and not dry:
            self.nodes.imaged(params, data)
        if action == "DeregisterImage" and status == 200 and self.nodes is not None and not dry:
            self.nodes.deregistered(params.get("ImageId", ""))
        if action == "AllocateAddress" and status == 200:
            self.eips.update(re.findall(rb"<publicIp>([^<]+)</publicIp>", data))
        if action == "DescribeInstances" and status == 200:
            data = self._hide_addresses(data)
            if self.nodes is not None:
                data = self.nodes.rewrite(data)
        return status, out_headers, data

    def _image_tags(self, action: str, params: dict[str, str], headers: dict[str, str]) -> tuple[bytes, Any]:
        """moto's gaps, filled as EC2 behaves: CreateImage with snapshot tags given at creation
        fails in moto (NotImplementedError), and CopyImage ignores its TagSpecifications. The
        request goes on without them; once it answers, they are applied through moto's
        CreateTags (the image's, and its snapshots')."""
        specs: dict[str, tuple[str, list[dict[str, str]]]] = {}
        for key, kind in params.items():
            found = re.fullmatch(r"TagSpecification\.(\d+)\.ResourceType", key)
            if found:
                i = found.group(1)
                tags = [{"Key": params[k], "Value": params.get(k[:-len("Key")] + "Value", "")}
                        for k in sorted(params) if re.fullmatch(rf"TagSpecification\.{i}\.Tag\.\d+\.Key", k)]
                specs[i] = (kind, tags)
        moved = {i: v for i, v in specs.items() if action == "CopyImage" or v[0] == "snapshot"}
        kept = {k: v for k, v in params.items() if not any(k.startswith(f"TagSpecification.{i}.") for i in moved)}
        credential = re.search(r"Credential=[^/]+/\d+/([^/]+)/", headers.get("Authorization", ""))
        region = credential.group(1) if credential else "us-east-1"

        def later(data: bytes) -> None:
            import boto3

            image = re.search(rb"<imageId>(ami-[0-9a-f]+)</imageId>", data)
            if image is None or not moved:
                return
            ec2 = boto3.client("ec2", endpoint_url=f"http://{self.moto}", region_name=region,
                               aws_access_key_id="testing", aws_secret_access_key="testing")
            image_id = image.group(1).decode()
            snapshots = [m["Ebs"]["SnapshotId"] for i in ec2.describe_images(ImageIds=[image_id])["Images"]
                         for m in i.get("BlockDeviceMappings") or [] if m.get("Ebs", {}).get("SnapshotId")]
            for kind, tags in moved.values():
                resources = [image_id] if kind == "image" else snapshots
                if resources and tags:
                    ec2.create_tags(Resources=resources, Tags=tags)

        return urlencode(kept).encode(), later

    def _fault(self, action: str, params: dict[str, str]) -> Fault | None:
        with self.lock:
            for fault in self.faults:
                if fault.action != action or fault.times == 0:
                    continue
                if fault.zone and params.get("Placement.AvailabilityZone") != fault.zone:
                    continue
                if (params.get("DryRun") == "true") != fault.dry_run:
                    continue
                if fault.times is not None:
                    fault.times -= 1
                return fault
        return None

    def _run(self, method: str, path: str, headers: dict[str, str], body: bytes,
             params: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        group = params.get("Placement.GroupName")
        if group and group not in self.placement_groups and params.get("DryRun") != "true":
            return 400, {}, _error("InvalidPlacementGroup.Unknown", f"The Placement Group '{group}' is unknown.")
        token = params.get("ClientToken")
        if self.idempotent_tokens and token in self.tokens:
            return 200, {"Content-Type": "text/xml"}, self.tokens[token]
        zone = params.get("Placement.AvailabilityZone", "")
        if zone in self.capacity and params.get("DryRun") != "true":
            left, least = self.capacity[zone], int(params.get("MinCount", "1"))
            if left < least:
                return 400, {}, _error("InsufficientInstanceCapacity",
                                       f"We currently do not have sufficient capacity in {zone} ({left} left).")
            params = {**params, "MaxCount": str(min(int(params.get("MaxCount", "1")), left))}
            body = urlencode(params).encode()
        status, out_headers, data = self._forward(method, path, headers, body)
        if status == 200:
            if zone in self.capacity and params.get("DryRun") != "true":
                launched = re.findall(rb"<instanceId>([^<]+)</instanceId>", data)
                self.capacity[zone] -= len(launched)
                self.placed.update((iid.decode(), zone) for iid in launched)
            if token:
                self.tokens[token] = data
            if sum(1 for k in params if re.fullmatch(r"NetworkInterface\.\d+\.DeviceIndex", k)) > 1:
                self.multi_nic.update(x.decode() for x in re.findall(rb"<instanceId>([^<]+)</instanceId>", data))
            if self.nodes is not None and params.get("DryRun") != "true":
                self.nodes.launched(params, data)
        return status, out_headers, data

    def _hide_addresses(self, data: bytes) -> bytes:
        """EC2 gives multi-interface launches no public address; moto does. Hide it."""
        if not self.multi_nic:
            return data
        root, items = instance_items(data)
        for item, iid, address in items:
            if iid is None or address is None or iid.text not in self.multi_nic:
                continue
            if (address.text or "").encode() not in self.eips:
                item.remove(address)
        return xml_bytes(root)

    def _placement(self, action: str, params: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        if params.get("DryRun") == "true":
            return 412, {}, _error("DryRunOperation", "Request would have succeeded, but DryRun flag is set.")
        name = params.get("GroupName", "")
        with self.lock:
            if action == "CreatePlacementGroup":
                if name in self.placement_groups:
                    return 400, {}, _error("InvalidPlacementGroup.Duplicate", f"The Placement Group '{name}' already exists.")
                tags = {params[k]: params.get(k.replace(".Key", ".Value"), "")
                        for k in params if re.fullmatch(r"TagSpecification\.\d+\.Tag\.\d+\.Key", k)}
                self.placement_groups[name] = {"strategy": params.get("Strategy", ""), "tags": tags,
                                               "id": f"pg-{uuid.uuid4().hex[:17]}"}
                return 200, {}, _ok("CreatePlacementGroup", "<return>true</return>")
            if action == "DeletePlacementGroup":
                if self.placement_groups.pop(name, None) is None:
                    return 400, {}, _error("InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown.")
                return 200, {}, _ok("DeletePlacementGroup", "<return>true</return>")
            wanted = {params[k]: [v for kk, v in params.items() if kk.startswith(k.replace(".Name", ".Value."))]
                      for k in params if re.fullmatch(r"Filter\.\d+\.Name", k)}
            items = []
            for group, info in self.placement_groups.items():
                if any(not key.startswith("tag:") or info["tags"].get(key[4:]) not in values
                       for key, values in wanted.items()):
                    continue
                tags = "".join(f"<item><key>{k}</key><value>{v}</value></item>" for k, v in info["tags"].items())
                items.append(f"<item><groupName>{group}</groupName><groupId>{info['id']}</groupId>"
                             f"<strategy>{info['strategy']}</strategy><state>available</state>"
                             f"<tagSet>{tags}</tagSet></item>")
            return 200, {}, _ok("DescribePlacementGroups", f"<placementGroupSet>{''.join(items)}</placementGroupSet>")

    def _forward(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection(self.moto, timeout=60)
        try:
            # (Content-Length from the body as sent: the shim may have rewritten it)
            conn.request(method, path, body=body,
                         headers={k: v for k, v in headers.items() if k.lower() not in ("host", "content-length")})
            answer = conn.getresponse()
            data = answer.read()
            keep = {k: v for k, v in answer.getheaders() if k.lower() in ("content-type", "x-amzn-requestid")}
            return answer.status, keep, data
        finally:
            conn.close()


def instance_items(data: bytes) -> tuple[Any, list[tuple[Any, Any, Any]]]:
    """A DescribeInstances answer parsed (its namespace kept for writing it back): the root,
    and (item, instanceId, ipAddress) for every item element (None where one is missing)."""
    import xml.etree.ElementTree as ET

    ns = re.search(rb'xmlns="([^"]+)"', data)
    uri = ns.group(1).decode() if ns else ""
    ET.register_namespace("", uri)
    q = (lambda tag: f"{{{uri}}}{tag}") if uri else (lambda tag: tag)
    root = ET.fromstring(data)
    return root, [(item, item.find(q("instanceId")), item.find(q("ipAddress"))) for item in root.iter(q("item"))]


def xml_bytes(root: Any) -> bytes:
    import xml.etree.ElementTree as ET

    return ET.tostring(root, xml_declaration=True, encoding="UTF-8")


def _service(headers: dict[str, str]) -> str:
    auth = headers.get("Authorization") or headers.get("authorization") or ""
    found = re.search(r"Credential=[^/]+/[^/]+/[^/]+/([^/]+)/", auth)
    return found.group(1) if found else "?"


def _error(code: str, message: str) -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>{code}</Code>'
            f"<Message>{message}</Message></Error></Errors><RequestID>{uuid.uuid4()}</RequestID></Response>").encode()


def _ok(action: str, inner: str) -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?><{action}Response xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
            f"<requestId>{uuid.uuid4()}</requestId>{inner}</{action}Response>").encode()


def start(moto: str) -> tuple[Shim, ThreadingHTTPServer]:
    shim = Shim(moto=moto)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            status, headers, data = shim.handle(self.command, self.path, dict(self.headers), body)
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_POST = do_GET = do_PUT = do_DELETE = _any

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    shim.url = f"http://127.0.0.1:{server.server_address[1]}"
    return shim, server


def wait_for(predicate: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)
