#!/usr/bin/env python3
"""What verifying a bearer token costs, side by side in one run: the same
token counted by `subject: header:Authorization` (its bytes, no
verification) and by `subject: jwt:sub` (verified), for each algorithm.

    python3 bench/tokens.py --sluice NAME=PATH [--sluice NAME=PATH ...] [--seconds 5] [--rounds 2]

One sluice per key kind (a JWKS with an RS256, an ES256 and an EdDSA key;
an HS256 secret), the memory store, a limit never reached, in front of an
upstream of this script's own. Each path gets `wrk -c 8` for `--seconds`
with one token PyJWT issued; the report is sluice's CPU microseconds per
request (utime + stime over the run) and requests a second, the medians of
`--rounds`, for each build given (a build that checks every request's
signature beside one that remembers verified tokens shows what a new
token costs and what a returning one costs). Needs python3 with PyJWT and
cryptography, and wrk.

The report goes to stdout and `bench/results/tokens.md`.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tools  # noqa: E402

SECRET = "a shared HS256 secret of 32 bytes!"

CONFIG = """version: 1
server:
  listen: 127.0.0.1:0
  admin: 127.0.0.1:0
upstream:
  url: http://127.0.0.1:{upstream}
identity:
  jwt: {{ {keys}, audiences: [bench] }}
policies:
  never: {{ algorithm: fixed-window, limit: 1000000000, window: 1h }}
routes:
  - {{ name: bytes, match: {{ path: /bytes }}, subject: header:Authorization, policy: never }}
  - {{ name: verified, match: {{ path: /verified }}, subject: jwt:sub, policy: never }}
"""


def issue(workdir):
    """Keys, a JWKS and one token per algorithm, by PyJWT."""
    import jwt
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
    from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm

    keys = {
        "RS256": (rsa.generate_private_key(65537, 2048), RSAAlgorithm),
        "ES256": (ec.generate_private_key(ec.SECP256R1()), ECAlgorithm),
        "EdDSA": (ed25519.Ed25519PrivateKey.generate(), OKPAlgorithm),
    }
    claims = {"sub": "bench-user", "aud": "bench", "exp": int(time.time()) + 3600}
    jwks, tokens = [], {}
    for alg, (key, algo) in keys.items():
        jwk = algo.to_jwk(key.public_key(), as_dict=True)
        jwk.update({"kid": alg, "alg": alg})
        jwks.append(jwk)
        tokens[alg] = jwt.encode(claims, key, algorithm=alg, headers={"kid": alg})
    tokens["HS256"] = jwt.encode(claims, SECRET.encode(), algorithm="HS256")
    path = os.path.join(workdir, "jwks.json")
    with open(path, "w") as f:
        json.dump({"keys": jwks}, f)
    return path, tokens


def load(port, path, token, seconds, pid):
    before = tools.cpu_seconds(pid)
    out = subprocess.run(
        ["wrk", "-t1", "-c8", f"-d{seconds}s", "-H", f"Authorization: Bearer {token}",
         f"http://127.0.0.1:{port}{path}"],
        capture_output=True, text=True, timeout=seconds + 60,
    )
    used = tools.cpu_seconds(pid) - before
    requests = int(out.stdout.split(" requests in")[0].split()[-1])
    non2xx = "Non-2xx" in out.stdout
    if requests == 0 or non2xx:
        raise SystemExit(f"tokens: {path} did not answer 200: {out.stdout[-400:]}")
    return {"rps": requests / seconds, "cpu_us": used / requests * 1e6}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sluice", action="append", default=[], help="NAME=PATH, repeatable")
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    builds = [b.split("=", 1) for b in (args.sluice or ["after=target/release/sluice"])]
    procs = tools.Processes()
    results = {}
    with tempfile.TemporaryDirectory() as workdir:
        try:
            jwks, tokens = issue(workdir)
            up = tools.free_port()
            proc = procs.start("upstream", [sys.executable, __file__, "--serve", str(up)], None,
                               os.path.join(workdir, "up.log"))
            if not tools.wait_tcp(up, proc):
                raise SystemExit("tokens: the upstream did not start")
            setups = [
                (f"keys_file: {jwks}", ["RS256", "ES256", "EdDSA"]),
                (f'secret: "{SECRET}"', ["HS256"]),
            ]
            for _ in range(args.rounds):
                for name, binary in builds:
                    for keys, algs in setups:
                        config = CONFIG.format(upstream=up, keys=keys)
                        sproc, port, _, _ = tools.start_sluice(procs, workdir, binary, config, name)
                        for alg in algs:
                            for path in ("/bytes", "/verified"):
                                r = load(port, path, tokens[alg], args.seconds, sproc.pid)
                                results.setdefault((name, alg, path), []).append(r)
                                print(name, alg, path, json.dumps(r), flush=True)
                        procs.stop(sproc)
        finally:
            procs.stop_all()

    def med(name, alg, path, key):
        return statistics.median(r[key] for r in results[(name, alg, path)])

    lines = [
        "# What verifying a bearer token costs",
        "",
        f"`bench/tokens.py`, {args.rounds} rounds of {args.seconds} s, `wrk -c 8` with one token, memory store, "
        "tokens issued by PyJWT; medians. `bytes`: `subject: header:Authorization` (the token's bytes, unverified); "
        "`verified`: `subject: jwt:sub`. Builds: " + ", ".join(f"`{n}` ({p})" for n, p in builds) + ".",
        "",
        "| build | algorithm | CPU µs/request, bytes | CPU µs/request, verified | added by verifying | req/s bytes | req/s verified |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, _ in builds:
        for alg in ["HS256", "RS256", "ES256", "EdDSA"]:
            b, v = med(name, alg, "/bytes", "cpu_us"), med(name, alg, "/verified", "cpu_us")
            lines.append(
                f"| {name} | {alg} | {b:.1f} | {v:.1f} | {v - b:+.1f} | "
                f"{med(name, alg, '/bytes', 'rps'):,.0f} | {med(name, alg, '/verified', 'rps'):,.0f} |"
            )
    report = "\n".join(lines) + "\n"
    print(report)
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "tokens.md")
    with open(out, "w") as f:
        f.write(report)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--serve":
        tools.serve_ok(int(sys.argv[2]))
    else:
        main()
