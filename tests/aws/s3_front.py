"""Test fixture: moto's S3 with S3's own checks of presigned requests in front of it.

A test double, never product code. moto stores and serves objects but checks no signature:
any request, signed or not, is taken. S3 refuses (403) a presigned URL whose SigV4 signature
does not match its method, path, query and signed headers, or that has expired; a POST upload
whose policy is not signed, has expired, or whose fields break one of its conditions (the key's
``starts-with``, the bucket, ``content-length-range``, each field's value); and, the bucket
being private (Block Public Access), any request with no authorisation at all. This front does
those checks, as S3's documentation states them ("Authenticating Requests: Using Query
Parameters (AWS Signature Version 4)", "Creating a POST Policy"), with the secret key the tests
give the product, and forwards what passes to moto unchanged. Requests signed in the
Authorization header (the controller's boto3 calls) are forwarded as they are.

Bucket owners: moto takes ExpectedBucketOwner and checks nothing (every bucket is its one
account's). S3 refuses (403 AccessDenied) a request whose ``x-amz-expected-bucket-owner``
(header, or a signed one of a presigned URL) is not the bucket owner's account; so does this
front, each bucket owned by moto's account unless ``owners`` names another (a bucket name
another account claimed), and it keeps which requests came with no owner condition at all.

Bucket policies: moto's evaluator ignores a statement's Condition, so gpuprov's TLS-only
policy (Deny everything where aws:SecureTransport is false) would deny every object request
there. Requests reach this front over plain HTTP standing for the TLS connections the product
makes to S3 (whose endpoints are https), so the front keeps each bucket's policy itself (and
answers GetBucketPolicy with it) and hands moto none: for TLS requests that deny never applies.

It listens where the nodes reach it (the docker bridge's gateway for the emulated EC2's
containers; loopback otherwise); the product finds it through the standard AWS_ENDPOINT_URL_S3.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import http.client
import json
import threading
from email.parser import BytesParser
from email.policy import HTTP
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit

from tests.aws.iam import ACCOUNT  # moto's one account: its STS's caller and every bucket's owner

SECRET = "testing"  # AWS_SECRET_ACCESS_KEY of the tests (tests/aws/conftest.py)


class Front:
    def __init__(self, moto: str, host: str = "127.0.0.1") -> None:
        self.moto = moto
        self.refused: list[str] = []  # why each refused request was refused
        self.policies: dict[str, bytes] = {}  # bucket: its policy (kept here, not in moto)
        # FIXTURE fault: the next this-many presigned GETs of a bundle answer with one byte
        # changed (an object swapped in the bucket, or a proxy on the way, would do as much).
        self.tamper_bundles = 0
        # FIXTURE fault: the controller's own (header-signed) requests on these sub-resources
        # (query keys: "policy", "publicAccessBlock", "encryption", "location", "list-type")
        # are refused AccessDenied, as for credentials whose IAM policy lacks their action.
        self.deny: set[str] = set()
        self.bundle_gets = 0
        # FIXTURE fault: {bucket: the account that owns it} where not moto's (ACCOUNT).
        self.owners: dict[str, str] = {}
        self.unowned: list[str] = []  # "METHOD path" of each request with no owner condition
        self.httpd = ThreadingHTTPServer((host, 0), _handler(self))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.1,), daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def forward(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, list, bytes]:
        conn = http.client.HTTPConnection(self.moto, timeout=60)
        try:
            conn.request(method, path, body=body or None,
                         headers={k: v for k, v in headers.items() if k.lower() != "content-length"})
            answer = conn.getresponse()
            return answer.status, answer.getheaders(), answer.read()
        finally:
            conn.close()


def _signing_key(date: str, region: str, service: str) -> bytes:
    key = ("AWS4" + SECRET).encode()
    for part in (date, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def _when(stamp: str) -> datetime.datetime:
    return datetime.datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.UTC)


def check_query(method: str, path: str, headers: dict[str, str]) -> str | None:
    """Why S3 would refuse this presigned (SigV4 query) request; None where it takes it."""
    split = urlsplit(path)
    params = parse_qsl(split.query, keep_blank_values=True)
    given = dict(params)
    if given.get("X-Amz-Algorithm") != "AWS4-HMAC-SHA256":
        return "not a SigV4 presigned request"
    signed = given.get("X-Amz-SignedHeaders", "").split(";")
    lower = {k.lower(): v for k, v in headers.items()}
    query = "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}"
                     for k, v in sorted(p for p in params if p[0] != "X-Amz-Signature"))
    canonical = "\n".join([method, split.path, query, *(f"{h}:{lower.get(h, '').strip()}" for h in signed), "",
                           ";".join(signed), "UNSIGNED-PAYLOAD"])
    scope = given["X-Amz-Credential"].split("/", 1)[1]
    date, region, service, _ = scope.split("/")
    to_sign = "\n".join(["AWS4-HMAC-SHA256", given["X-Amz-Date"], scope, hashlib.sha256(canonical.encode()).hexdigest()])
    expected = hmac.new(_signing_key(date, region, service), to_sign.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, given.get("X-Amz-Signature", "")):
        return "SignatureDoesNotMatch"
    if _when(given["X-Amz-Date"]) + datetime.timedelta(seconds=int(given["X-Amz-Expires"])) \
            < datetime.datetime.now(datetime.UTC):
        return "Request has expired"
    return None


def parse_form(headers: dict[str, str], body: bytes) -> tuple[dict[str, str], bytes]:
    kind = next((v for k, v in headers.items() if k.lower() == "content-type"), "")
    message = BytesParser(policy=HTTP).parsebytes(f"Content-Type: {kind}\r\n\r\n".encode() + body)
    fields, data = {}, b""
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if name == "file":
            data = part.get_payload(decode=True) or b""
        else:
            fields[name] = (part.get_payload(decode=True) or b"").decode()
    return fields, data


def check_post(bucket: str, fields: dict[str, str], data: bytes) -> str | None:
    """Why S3 would refuse this POST upload to ``bucket``; None where it takes it."""
    policy_b64 = fields.get("policy", "")
    credential = fields.get("x-amz-credential", "")
    try:
        date, region, service, _ = credential.split("/", 1)[1].split("/")
    except (IndexError, ValueError):
        return "no x-amz-credential"
    expected = hmac.new(_signing_key(date, region, service), policy_b64.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, fields.get("x-amz-signature", "")):
        return "SignatureDoesNotMatch"
    policy = json.loads(base64.b64decode(policy_b64))
    if datetime.datetime.fromisoformat(policy["expiration"].replace("Z", "+00:00")) < datetime.datetime.now(datetime.UTC):
        return "Invalid according to Policy: Policy expired"
    values = {**{k.lower(): v for k, v in fields.items()}, "bucket": bucket}
    covered = {"policy", "x-amz-signature", "file"}
    for condition in policy["conditions"]:
        if isinstance(condition, dict):
            ((name, want),) = condition.items()
            condition = ["eq", f"${name}", want]
        op, *rest = condition
        if op == "content-length-range":
            if not rest[0] <= len(data) <= rest[1]:
                return f"Invalid according to Policy: Policy Condition failed: {json.dumps(condition)}"
            continue
        name = rest[0].lstrip("$").lower()
        covered.add(name)
        got = values.get(name, "")
        if (op == "eq" and got != rest[1]) or (op == "starts-with" and not got.startswith(rest[1])):
            return f"Invalid according to Policy: Policy Condition failed: {json.dumps(condition)}"
    extra = sorted(set(values) - covered - {"bucket"})
    if extra:
        return f"Invalid according to Policy: Extra input fields: {', '.join(extra)}"
    return None


def _handler(front: Front) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            return

        def _body(self) -> bytes:
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""

        def _refuse(self, why: str) -> None:
            front.refused.append(why)
            body = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code>'
                    f"<Message>{why}</Message></Error>").encode()
            self.send_response(403)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _handle(self) -> None:
            headers = dict(self.headers.items())
            body = self._body()
            if "X-Amz-Signature=" in self.path:
                why = check_query(self.command, self.path, headers)
            elif self.headers.get("Authorization"):
                # the controller's own calls, signed in the header
                asked = set(dict(parse_qsl(urlsplit(self.path).query, keep_blank_values=True)))
                why = f"AccessDenied: {sorted(asked & front.deny)} (FIXTURE)" if asked & front.deny else None
            elif self.command == "POST" and "multipart/form-data" in (self.headers.get("Content-Type") or ""):
                fields, data = parse_form(headers, body)
                why = check_post(urlsplit(self.path).path.strip("/").split("/")[0], fields, data)
            else:
                why = "AccessDenied: no authorisation (the bucket is private)"
            why = why or self._owner()
            if why:
                self._refuse(why)
                return
            split = urlsplit(self.path)
            bucket = split.path.strip("/")
            if "policy" in dict(parse_qsl(split.query, keep_blank_values=True)) and "/" not in bucket:
                self._policy(bucket, body)
                return
            status, out, data = front.forward(self.command, self.path, headers, body)
            if self.command == "GET" and "/bundle/" in split.path and "X-Amz-Signature=" in self.path:
                front.bundle_gets += 1
                if front.tamper_bundles > 0 and status == 200 and data:
                    front.tamper_bundles -= 1
                    data = bytes([data[0] ^ 1]) + data[1:]
            self.send_response(status)
            head = self.command == "HEAD"  # (its Content-Length is the object's, as moto says)
            for key, value in out:
                if key.lower() not in ("transfer-encoding", "connection", "server", "date") \
                        and (head or key.lower() != "content-length"):
                    self.send_header(key, value)
            if not head:
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if not head:
                self.wfile.write(data)

        def _owner(self) -> str | None:
            """Why S3 refuses the request's bucket owner condition; None where it holds or is absent."""
            split = urlsplit(self.path)
            expected = self.headers.get("x-amz-expected-bucket-owner")
            if expected is None:
                front.unowned.append(f"{self.command} {split.path}")
                return None
            bucket = split.path.strip("/").split("/")[0]
            owner = front.owners.get(bucket, ACCOUNT)
            return None if expected == owner else f"AccessDenied: the bucket's owner is not {expected}"

        def _policy(self, bucket: str, body: bytes) -> None:
            if self.command == "PUT":
                front.policies[bucket] = body
            elif self.command == "DELETE":
                front.policies.pop(bucket, None)
            found = front.policies.get(bucket) if self.command == "GET" else b""
            if found is None:
                found = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>NoSuchBucketPolicy</Code>'
                         b"<Message>The bucket policy does not exist</Message></Error>")
            self.send_response(404 if self.command == "GET" and bucket not in front.policies else
                               200 if self.command == "GET" else 204)
            self.send_header("Content-Length", str(len(found)))
            self.end_headers()
            self.wfile.write(found)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

    return Handler
