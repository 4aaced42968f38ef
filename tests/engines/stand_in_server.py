"""A stand-in for `vllm serve` in process tests: one HTTP server plus an "EngineCore" child.

    python stand_in_server.py PORT [--ignore-signals] [--fail "message" [--linger S]]

Prints vLLM-style lines; the child sleeps in the same session, as EngineCore does.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/health":
            body = b""
        elif self.path == "/v1/models":
            body = json.dumps({"data": [{"id": "stand-in", "max_model_len": 1024}]}).encode()
        else:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("--ignore-signals", action="store_true")
    parser.add_argument("--fail")
    parser.add_argument("--linger", type=float, default=0.2, help="seconds from --fail to exit")
    args = parser.parse_args()
    if args.ignore_signals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
    child_code = "import signal, time\n"
    if args.ignore_signals:
        child_code += "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        child_code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    child_code += "time.sleep(600)\n"
    child = subprocess.Popen([sys.executable, "-c", child_code])
    print(f"(APIServer pid=1) INFO 11-30 01:00:00 [x.py:1] child pid {child.pid}", flush=True)
    if args.fail:
        time.sleep(0.2)
        prefix = f"(EngineCore pid={child.pid}) ERROR 11-30 01:00:01 [core.py:1]"
        print(f"{prefix} {args.fail}", flush=True)
        time.sleep(args.linger)
        child.kill()
        return 1
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(
        "(EngineCore pid=2) INFO 11-30 01:00:01 [kv_cache_utils.py:1] CPU KV cache size: "
        "4,096 tokens, Maximum concurrency for 1,024 tokens per request: 4.00x",
        flush=True,
    )
    print("INFO:     Application startup complete.", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    child.terminate()
    child.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
