"""Test fixture: IAM's policy simulator and STS's GetCallerIdentity, which moto lacks or
answers oddly (moto raises NotImplementedError for SimulatePrincipalPolicy, and its caller
is an ``arn:aws:sts::...:user/...``, no principal IAM knows).

A test double, never product code. It answers the two query-protocol calls as AWS does
(their documented XML), the caller an IAM user, and each action/resource pair "allowed" or
"implicitDeny" by the policy it is given, evaluated with tests/aws/iam.py (the evaluator the
EC2 tests hold the documented policy to) in the context the request gives (ContextEntries: as
IAM's simulator, a condition on a key the request does not give does not match). The product finds it through the standard
AWS_ENDPOINT_URL_IAM and AWS_ENDPOINT_URL_STS.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl
from xml.sax.saxutils import escape

from tests.aws import iam

CALLER = f"arn:aws:iam::{iam.ACCOUNT}:user/gpuprov"


class Simulator:
    def __init__(self, policy: dict[str, Any]) -> None:
        self.policy = policy
        self.asked: list[tuple[str, str, str]] = []  # (principal, action, resource)
        self.contexts: list[dict[str, str]] = []  # each request's ContextEntries: {key: its first value}
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, args=(0.1,), daemon=True).start()

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def answer(self, params: dict[str, str]) -> bytes:
        if params.get("Action") == "GetCallerIdentity":
            return (f'<GetCallerIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">'
                    f"<GetCallerIdentityResult><Arn>{CALLER}</Arn><UserId>AIDAGPUPROV</UserId>"
                    f"<Account>{iam.ACCOUNT}</Account></GetCallerIdentityResult>"
                    "<ResponseMetadata><RequestId>1</RequestId></ResponseMetadata></GetCallerIdentityResponse>").encode()
        assert params.get("Action") == "SimulatePrincipalPolicy", params
        actions = [v for k, v in sorted(params.items()) if k.startswith("ActionNames.member.")]
        resources = [v for k, v in sorted(params.items()) if k.startswith("ResourceArns.member.")]
        context = {v: params.get(k.replace("ContextKeyName", "ContextKeyValues.member.1"), "")
                   for k, v in params.items() if k.startswith("ContextEntries.member.") and k.endswith(".ContextKeyName")}
        self.contexts.append(context)
        members = []
        for action in actions:
            for resource in resources:
                self.asked.append((params["PolicySourceArn"], action, resource))
                ok = iam.allowed_by(self.policy, iam.Authorization(action, resource, context))
                members.append(f"<member><EvalActionName>{escape(action)}</EvalActionName><EvalResourceName>"
                               f"{escape(resource)}</EvalResourceName><EvalDecision>"
                               f"{'allowed' if ok else 'implicitDeny'}</EvalDecision></member>")
        return ('<SimulatePrincipalPolicyResponse xmlns="https://iam.amazonaws.com/doc/2010-05-08/">'
                f"<SimulatePrincipalPolicyResult><IsTruncated>false</IsTruncated><EvaluationResults>"
                f"{''.join(members)}</EvaluationResults></SimulatePrincipalPolicyResult>"
                "<ResponseMetadata><RequestId>1</RequestId></ResponseMetadata></SimulatePrincipalPolicyResponse>").encode()


def _handler(sim: Simulator) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            data = sim.answer(dict(parse_qsl(body.decode())))
            self.send_response(200)
            self.send_header("Content-Type", "text/xml")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler
