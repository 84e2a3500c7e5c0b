"""How user text is quoted in messages: always ``repr``, cut so a hostile value cannot flood one."""

LIMIT = 80


def shorten(text: str, limit: int = LIMIT) -> str:
    """``'abc'``, or the first ``limit`` characters and the full length."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"
