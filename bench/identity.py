#!/usr/bin/env python3
"""Identities a client forges or respells, side by side in one run: each
build behind the same configuration, each attack sent the same way.

    python3 bench/identity.py --sluice before=OLD_SLUICE --sluice after=target/release/sluice

The client reaches sluice from 127.0.0.1, which the configuration trusts
as a forwarding proxy (an ingress that appends `X-Forwarded-For`); an
upstream of this script's own records the headers it is sent. Attacks:

- `tier`: `X-Plan: pro` sent by the client through the trusted proxy,
  6 requests; free allows 2, pro 5: how many admitted.
- `basic`: one Basic credential in 10 spellings every app server decodes
  alike (padding, junk characters), limit 3: how many admitted.
- `case`: `/LOGIN`, `/Login/` and `/login` 10 times in all (Express routes
  them all to `/login`), limit 3: how many admitted.
- `claims`: 9 address headers (`Client-IP`, `X-Client-IP`, ...) from an
  untrusted client: how many reach the app.
- `tokens`: 5 forged bearer tokens (5 different `sub`s, a key sluice does
  not have), limit 2 by the token. The old build has no `jwt:` subject:
  it counts `header:Authorization`, the token's bytes; the new one
  `jwt:sub`. How many admitted.

The report goes to stdout and `bench/results/identity.md`.
"""

import argparse
import base64
import hashlib
import hmac
import http.client
import http.server
import json
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tools  # noqa: E402

CLAIMS = ["Client-IP", "X-Client-IP", "X-Cluster-Client-IP", "Fastly-Client-IP", "Forwarded-For",
          "X-Forwarded", "X-Original-Forwarded-For", "X-Forwarded-Port", "X-Forwarded-Prefix"]

CONFIG = """version: 1
server:
  listen: 127.0.0.1:0
upstream:
  url: http://127.0.0.1:{upstream}
identity:
  trusted_proxies: [127.0.0.1/32]
{jwt}policies:
  p_free: {{ algorithm: fixed-window, limit: 2, window: 1h }}
  p_pro: {{ algorithm: fixed-window, limit: 5, window: 1h }}
  three: {{ algorithm: fixed-window, limit: 3, window: 1h }}
  two: {{ algorithm: fixed-window, limit: 2, window: 1h }}
routes:
  - name: plan
    match: {{ path_prefix: /plan }}
    subject: header:x-api-key
    tiers: {{ header: X-Plan, policies: {{ pro: p_pro }}, default: p_free }}
  - {{ name: basic, match: {{ path: /basic }}, subject: header:Authorization, policy: three }}
  - {{ name: login, match: {{ path: /login }}, subject: client_ip, policy: three }}
  - {{ name: token, match: {{ path: /token }}, subject: {token_subject}, policy: two }}
default: {{ policy: none }}
"""

SEEN = []


class Recorder(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):  # noqa: N802 - the stdlib's name
        SEEN.append(dict(self.headers.items()))
        self.send_response(200)
        self.send_header("Content-Length", "3")
        self.end_headers()
        self.wfile.write(b"ok\n")

    def log_message(self, *args):
        pass


def get(port, path, headers):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", path, headers=headers)
    status = conn.getresponse().status
    conn.close()
    return status


def forged_token(sub):
    """HS256 with a key sluice was never given."""
    def b64(b):
        return base64.urlsafe_b64encode(b).rstrip(b"=").decode()
    head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = b64(json.dumps({"sub": sub, "exp": int(time.time()) + 600}).encode())
    sig = hmac.new(b"not the issuer's key, 32 bytes long", f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{b64(sig)}"


def attacks(port):
    out = {}
    out["tier"] = sum(get(port, "/plan/x", {"X-API-Key": "k", "X-Plan": "pro",
                                             "X-Forwarded-For": "203.0.113.9"}) == 200 for _ in range(6))
    good = base64.b64encode(b"alice:s3cret").decode()
    spellings = [good, good + "=", good + "==", good[:4] + "*" + good[4:], good[:8] + "!" + good[8:],
                 good + "===", "*" + good, good[:2] + "." + good[2:], good + "=*", good[:12] + "-" + good[12:]]
    out["basic"] = sum(get(port, "/basic", {"Authorization": "Basic " + s}) == 200 for s in spellings)
    paths = ["/LOGIN", "/Login/", "/login", "/LOGIN/", "/LoGiN", "/login/", "/LOGIN", "/Login", "/loGIN/", "/login"]
    out["case"] = sum(get(port, p, {}) == 200 for p in paths)
    SEEN.clear()
    # From an untrusted client: sluice sees 127.0.0.1 as trusted, so the
    # claims go through a raw socket from 127.0.0.2.
    import socket
    s = socket.socket()
    s.bind(("127.0.0.2", 0))
    s.connect(("127.0.0.1", port))
    req = "GET /other HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + "".join(f"{h}: 198.51.100.7\r\n" for h in CLAIMS) + "\r\n"
    s.sendall(req.encode())
    while s.recv(4096):
        pass
    s.close()
    seen = {k.lower() for k in SEEN[-1]} if SEEN else set()
    out["claims"] = sum(h.lower() in seen for h in CLAIMS)
    out["tokens"] = sum(get(port, "/token", {"Authorization": "Bearer " + forged_token(f"user-{i}")}) == 200
                        for i in range(5) for _ in range(2))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sluice", action="append", required=True, help="NAME=PATH, repeatable")
    args = ap.parse_args()
    builds = [b.split("=", 1) for b in args.sluice]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    procs = tools.Processes()
    rows = {}
    with tempfile.TemporaryDirectory() as workdir:
        try:
            for name, binary in builds:
                # A build without `jwt:` subjects counts the token's bytes.
                probe = CONFIG.format(upstream=server.server_port, token_subject="jwt:sub",
                                      jwt='  jwt: { secret: "the issuer\'s real key, 32 bytes long" }\n')
                cfg = os.path.join(workdir, "probe.yaml")
                with open(cfg, "w") as f:
                    f.write(probe)
                knows_jwt = os.system(f"{binary} check --config {cfg} >/dev/null 2>&1") == 0
                config = probe if knows_jwt else CONFIG.format(
                    upstream=server.server_port, token_subject="header:Authorization", jwt="")
                proc, port, _, _ = tools.start_sluice(procs, workdir, binary, config, name)
                rows[name] = attacks(port)
                rows[name]["token_subject"] = "jwt:sub" if knows_jwt else "header:Authorization"
                print(name, json.dumps(rows[name]), flush=True)
                procs.stop(proc)
        finally:
            procs.stop_all()
            server.shutdown()
    names = [n for n, _ in builds]
    lines = [
        "# Identities a client forges or respells",
        "",
        "`bench/identity.py`: " + ", ".join(f"`{n}` ({p})" for n, p in builds) + ".",
        "",
        "| attack | limit | " + " | ".join(names) + " |",
        "|---|---:|" + "---:|" * len(names),
        "| `X-Plan: pro` through a trusted proxy, 6 requests: admitted | 2 (free) | " + " | ".join(str(rows[n]["tier"]) for n in names) + " |",
        "| one Basic credential in 10 spellings: admitted | 3 | " + " | ".join(str(rows[n]["basic"]) for n in names) + " |",
        "| `/LOGIN`, `/Login/`, ... 10 requests: admitted | 3 | " + " | ".join(str(rows[n]["case"]) for n in names) + " |",
        "| 9 address claims from an untrusted client: reaching the app | 0 | " + " | ".join(str(rows[n]["claims"]) for n in names) + " |",
        "| 5 forged bearer tokens × 2: admitted | 2 | " + " | ".join(f"{rows[n]['tokens']} (`{rows[n]['token_subject']}`)" for n in names) + " |",
    ]
    lines += [
        "",
        "The Basic spellings past the decoded credential's 3 are spellings app servers read",
        "differently (a `-`, data after `=`): sluice counts them in the route's one bucket for",
        "undecodable credentials (also 3), so no spelling buys more than that one extra bucket.",
    ]
    report = "\n".join(lines) + "\n"
    print(report)
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "identity.md"), "w") as f:
        f.write(report)


if __name__ == "__main__":
    main()
