"""The watcher runs, and on a notice from a fake IMDSv2 in the node it runs the default hook."""

import time

FAKE_IMDS = r'''
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_PUT(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"tok")
    def do_GET(self):
        ok = self.headers.get("X-aws-ec2-metadata-token") == "tok"
        if ok and self.path.endswith("/spot/instance-action"):
            self.send_response(200); self.end_headers()
            self.wfile.write(b'{"action": "terminate", "time": "2026-11-22T02:00:00Z"}')
        else:
            self.send_response(401 if not ok else 404); self.end_headers()
http.server.HTTPServer(("127.0.0.1", 8169), H).serve_forever()
'''


def test_watcher_is_enabled_and_running(host):
    service = host.service("gpuprov-spot-watch")
    assert service.is_enabled and service.is_running


def test_notice_runs_the_default_hook(host):
    marker = host.file("/run/gpuprov/interruption")
    assert not marker.exists, "no notice yet, so no marker"
    host.run_test("printf '%s' '" + FAKE_IMDS.replace("'", "'\\''") + "' > /tmp/fake_imds.py")
    host.run("nohup python3 /tmp/fake_imds.py >/dev/null 2>&1 &")
    for _ in range(30):
        if host.file("/run/gpuprov/interruption").exists:
            break
        time.sleep(1)
    content = host.file("/run/gpuprov/interruption").content_string
    assert '"action": "terminate"' in content, content
