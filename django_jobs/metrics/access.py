"""Who may read the metrics page: a client whose address is in ``JOBS_METRICS_ALLOWED_IPS``
(addresses or CIDRs), or one that sends ``Authorization: Bearer <token>`` with a token of
``JOBS_METRICS_TOKENS``. With neither setting, the page answers only under ``DEBUG``.

The address is the connection's (``REMOTE_ADDR``): behind a proxy that is the proxy's, so
allow the proxy's address only where the proxy itself limits who reaches the path, or use a
token. Tokens are compared in constant time, each against every configured token.
"""

from __future__ import annotations

import hmac
import ipaddress

from django.conf import settings
from django.http import HttpRequest, JsonResponse

from django_jobs import conf


def _address(request: HttpRequest) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    raw = str(request.META.get("REMOTE_ADDR") or "").strip()
    try:
        address = ipaddress.ip_address(raw.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _token_matches(request: HttpRequest, tokens: list[str]) -> bool:
    scheme, _, credential = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not credential.strip():
        return False
    given = credential.strip().encode()
    matched = False
    for token in tokens:
        matched |= hmac.compare_digest(given, token.encode())
    return matched


def refusal(request: HttpRequest) -> JsonResponse | None:
    """None if ``request`` may read the metrics; else the response that says why not."""
    networks = conf.metrics_allowed_ips()
    tokens = conf.metrics_tokens()
    if not networks and not tokens:
        if settings.DEBUG:
            return None
        return JsonResponse(
            {
                "error": "the metrics page is closed: set JOBS_METRICS_ALLOWED_IPS (addresses or "
                "CIDRs of your Prometheus) or JOBS_METRICS_TOKENS (bearer tokens); see "
                "docs/operations.md, Prometheus",
                "field": "JOBS_METRICS_ALLOWED_IPS",
            },
            status=403,
        )
    address = _address(request)
    if address is not None and any(address in network for network in networks):
        return None
    if tokens and _token_matches(request, tokens):
        return None
    if tokens:
        sent = bool(request.headers.get("Authorization"))
        response = JsonResponse(
            {
                "error": "the bearer token is not one of JOBS_METRICS_TOKENS"
                if sent
                else "send Authorization: Bearer <a token of JOBS_METRICS_TOKENS>",
                "field": "Authorization",
            },
            status=401,
        )
        response["WWW-Authenticate"] = 'Bearer realm="django-jobs metrics"'
        return response
    return JsonResponse(
        {
            "error": f"{address or 'this address'} is not in JOBS_METRICS_ALLOWED_IPS",
            "field": "REMOTE_ADDR",
        },
        status=403,
    )
