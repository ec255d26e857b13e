"""Journal URLs as they may be shown: a PostgreSQL URL may carry a password, which no message or output prints."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = ["redact_url"]


def redact_url(url: str) -> str:
    """``url`` with any password (in the authority or the query) replaced by ``***``; a URL without one as it is
    (rebuilt, ``sqlite:////abs.db`` would lose the slashes that make it absolute)."""
    parts = urlsplit(url)
    netloc = parts.netloc
    userinfo, at, hostport = netloc.rpartition("@")
    if at and ":" in userinfo:
        netloc = f"{userinfo.partition(':')[0]}:***@{hostport}"
    query = parse_qsl(parts.query, keep_blank_values=True)
    if any(k == "password" for k, _ in query):
        query = [(k, "***" if k == "password" else v) for k, v in query]
        return urlunsplit((parts.scheme, netloc, parts.path, urlencode(query, safe="*"), parts.fragment))
    if netloc == parts.netloc:
        return url
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
