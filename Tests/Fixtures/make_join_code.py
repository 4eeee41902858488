#!/usr/bin/python3
"""Makes a krakl join code (docs/join-codes.md) with a Twilio-style HS256
access token, using nothing but the Python standard library.

This is the test suite's independent generator: it is written from the
specification, not from the Swift parser, and the tests check that the agent
reads what it makes. It is also handy by hand:

    Tests/Fixtures/make_join_code.py --kind janus --url http://127.0.0.1:8088/janus \
        --room 1234 --identity "Ada's screen" --ice stun:127.0.0.1:3478

Times are seconds since 1970. --print json shows the code, the token and the
claims it signed.
"""

import argparse
import base64
import hashlib
import hmac
import json
import secrets
import sys
import time
import urllib.parse

# Everything printable in ASCII stays as it is except the escape and the
# three separators of the format.
SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) not in "%;,=")


def escape(value):
    return urllib.parse.quote(value, safe=SAFE, encoding="utf-8")


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def sign_token(claims, secret, header=None):
    """header.claims.signature with HMAC-SHA256 over the first two parts (RFC 7515)."""
    header = header or {"typ": "JWT", "alg": "HS256", "cty": "twilio-fpa;v=1"}
    compact = lambda obj: json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    signing_input = b64url(compact(header)) + "." + b64url(compact(claims))
    signature = hmac.new(secret.encode("utf-8"), signing_input.encode("ascii"), hashlib.sha256).digest()
    return signing_input + "." + b64url(signature)


def make_claims(args):
    iat = args.iat if args.iat is not None else int(time.time())
    exp = args.exp if args.exp is not None else iat + args.ttl
    video = {} if args.token_room is None else {"room": args.token_room}
    grants = {"video": video}
    if args.identity is not None:
        grants["identity"] = args.identity
    if args.jti:
        jti = args.jti
    elif args.twilio_jti:
        jti = "%s-%d" % (args.issuer, iat)
    else:
        jti = secrets.token_hex(8)
    claims = {
        "jti": jti,
        "iss": args.issuer,
        "sub": args.subject,
        "iat": iat,
        "exp": exp,
        "grants": grants,
    }
    if args.nbf is not None:
        claims["nbf"] = args.nbf
    if args.no_exp:
        del claims["exp"]
    return claims


def make_code(kind, url, token, room=None, ice=()):
    fields = ["v=1", "k=" + escape(kind), "u=" + escape(url)]
    if room is not None:
        fields.append("r=" + escape(room))
    fields.append("t=" + escape(token))
    for server in ice:
        # URL[,username,credential]: the credential may itself hold commas.
        parts = server.split(",", 2)
        fields.append("ice=" + ",".join(escape(p) for p in parts))
    return "krakl:" + ";".join(fields)


def main(argv):
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--kind", choices=["whip", "janus"], required=True)
    p.add_argument("--url", required=True, help="WHIP endpoint or Janus base URL")
    p.add_argument("--room", help="the code's r= field")
    p.add_argument("--identity", help="grants.identity (left out if not given)")
    p.add_argument("--token-room", help="grants.video.room (left out: any room)")
    p.add_argument("--ttl", type=int, default=3600, help="exp = iat + TTL (default 3600)")
    p.add_argument("--iat", type=int, help="issued-at (default now)")
    p.add_argument("--exp", type=int, help="expiry (overrides --ttl)")
    p.add_argument("--nbf", type=int, help="not-before (left out if not given)")
    p.add_argument("--no-exp", action="store_true", help="leave exp out (a malformed token)")
    p.add_argument("--secret", default="krakl-development-secret", help="HS256 key (default: a fixed development secret)")
    p.add_argument("--issuer", default="krakl-dev", help="iss (Twilio: the API key SID)")
    p.add_argument("--subject", default="krakl", help="sub (Twilio: the account SID)")
    p.add_argument("--jti", help="token id (default 16 random hex digits)")
    p.add_argument("--twilio-jti", action="store_true", help="jti = <iss>-<iat> as Twilio makes it")
    p.add_argument("--token", help="put this token in the code instead of signing one")
    p.add_argument("--ice", action="append", default=[], metavar="URL[,USERNAME,CREDENTIAL]")
    p.add_argument("--print", choices=["code", "token", "json"], default="code", dest="output")
    args = p.parse_args(argv)

    claims = make_claims(args)
    token = args.token or sign_token(claims, args.secret)
    code = make_code(args.kind, args.url, token, args.room, args.ice)
    if args.output == "code":
        print(code)
    elif args.output == "token":
        print(token)
    else:
        print(json.dumps({"code": code, "token": token, "claims": claims}))


if __name__ == "__main__":
    main(sys.argv[1:])
