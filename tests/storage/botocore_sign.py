#!/usr/bin/python3
"""Signs S3 requests with botocore's S3SigV4Auth at a frozen time.

Reads a JSON list of requests on stdin:
  {"method", "url" (path already encoded, no query), "params": [[k, v], ...] (decoded),
   "headers": {name: value}, "access_key", "secret_key", "token", "region", "time": "YYYYMMDDTHHMMSSZ"}
and prints a JSON list of {"authorization", "x-amz-date", "x-amz-content-sha256"}.
Run with /usr/bin/python3 (Debian's python3-botocore).
"""
import datetime
import json
import sys
import types

import botocore.auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials


def sign(req):
    frozen = datetime.datetime.strptime(req["time"], "%Y%m%dT%H%M%SZ")

    class FrozenDateTime(datetime.datetime):
        @classmethod
        def utcnow(cls):
            return frozen

        @classmethod
        def now(cls, tz=None):
            return frozen if tz is None else frozen.replace(tzinfo=tz)

    # botocore.auth reads the clock through its module-level `datetime` name.
    botocore.auth.datetime = types.SimpleNamespace(datetime=FrozenDateTime, timezone=datetime.timezone)
    creds = Credentials(req["access_key"], req["secret_key"], req.get("token") or None)
    request = AWSRequest(method=req["method"], url=req["url"], headers=dict(req.get("headers", {})),
                         params=[tuple(p) for p in req.get("params", [])])
    botocore.auth.S3SigV4Auth(creds, "s3", req["region"]).add_auth(request)
    return {
        "authorization": request.headers["Authorization"],
        "x-amz-date": request.headers["X-Amz-Date"],
        "x-amz-content-sha256": request.headers["X-Amz-Content-SHA256"],
    }


json.dump([sign(r) for r in json.load(sys.stdin)], sys.stdout)
