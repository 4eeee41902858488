#!/usr/bin/env python3
"""Twilio Programmable Video access tokens, made by Twilio's own helper library (PyPI `twilio`).

The token is Twilio's format because Twilio's code writes it: HS256 with the API key secret,
header {"cty": "twilio-fpa;v=1", "typ": "JWT", "alg": "HS256"}, claims jti ("SK...-<now>"),
iss (API key SID), sub (account SID), nbf, exp, grants {identity, video: {room?}}. The library
puts no iat in the token.

    twilio_token.py --account-sid AC... --api-key-sid SK... --api-key-secret S --identity NAME
                    [--room NAME] [--ttl SECONDS] [--nbf-offset SECONDS] [--expired]

Prints the JWT (one line) on stdout. Without --room the video grant names no room (any room).
--nbf-offset makes nbf = now + offset (positive: not yet valid). --expired makes a token whose
exp lies in the past (exp = now - 60, nbf = exp - ttl), through the library's own `valid_until`
and `nbf` parameters, so the signature is still good and only the time window is wrong.

Run with /opt/krakl-venv/bin/python (twilio, pyjwt).
"""
import argparse
import sys
import time

from twilio.jwt.access_token import AccessToken
from twilio.jwt.access_token.grants import VideoGrant


def make_token(account_sid, api_key_sid, api_key_secret, identity, room=None, ttl=3600,
               nbf_offset=None, expired=False):
    now = int(time.time())
    kwargs = {"identity": identity, "ttl": ttl}
    if expired:
        kwargs["valid_until"] = now - 60           # exp
        kwargs["nbf"] = now - 60 - ttl
    elif nbf_offset is not None:
        kwargs["nbf"] = now + nbf_offset
        # The library counts exp from now (now + ttl); keep the window ttl long from nbf instead,
        # so a not-yet-valid token is not also one that expires before it becomes valid.
        kwargs["valid_until"] = now + nbf_offset + ttl
    token = AccessToken(account_sid, api_key_sid, api_key_secret, **kwargs)
    token.add_grant(VideoGrant(room=room))
    jwt = token.to_jwt()
    return jwt.decode() if isinstance(jwt, bytes) else jwt


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--account-sid", required=True, help="AC...: the token's sub")
    parser.add_argument("--api-key-sid", required=True, help="SK...: the token's iss")
    parser.add_argument("--api-key-secret", required=True, help="the HS256 signing key")
    parser.add_argument("--identity", required=True)
    parser.add_argument("--room", help="grants.video.room (omitted: a video grant for any room)")
    parser.add_argument("--ttl", type=int, default=3600, help="seconds of validity (default 3600)")
    parser.add_argument("--nbf-offset", type=int, help="nbf = now + this many seconds (a not-yet-valid token)")
    parser.add_argument("--expired", action="store_true", help="exp in the past (now - 60 s)")
    args = parser.parse_args()
    if args.expired and args.nbf_offset is not None:
        parser.error("--expired and --nbf-offset do not go together")
    sys.stdout.write(make_token(args.account_sid, args.api_key_sid, args.api_key_secret, args.identity,
                                room=args.room, ttl=args.ttl, nbf_offset=args.nbf_offset,
                                expired=args.expired) + "\n")


if __name__ == "__main__":
    main()
